// GoldenDir: the compiled-in fixture directory by default, the one GLMSERVE_GOLDEN_DIR names
// when set (a bundle run on a GPU host, where the source tree's path does not exist).
#include "tests/test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

namespace glmserve::testing {
namespace {

namespace fs = std::filesystem;

// Sets (or, for nullopt, unsets) the variable for one test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(GoldenDirTest, DefaultsToTheSourceTree) {
  for (const std::optional<std::string>& value :
       {std::optional<std::string>(), std::optional<std::string>("")}) {
    ScopedEnv env("GLMSERVE_GOLDEN_DIR", value);
    const fs::path dir = GoldenDir("bf16");
    EXPECT_EQ(dir, fs::path(GLMSERVE_GOLDEN_DIR) / "bf16");
    EXPECT_TRUE(fs::exists(dir / "expected.json")) << dir;
  }
}

TEST(GoldenDirTest, EnvironmentNamesAnotherCopy) {
  const fs::path copy = MakeTempDir("golden_copy");
  fs::copy(fs::path(GLMSERVE_GOLDEN_DIR) / "bf16", copy / "moved_bf16",
           fs::copy_options::recursive);
  {
    ScopedEnv env("GLMSERVE_GOLDEN_DIR", copy.string());
    EXPECT_EQ(fs::path(GoldenDir("moved_bf16")), copy / "moved_bf16");
    EXPECT_TRUE(fs::exists(fs::path(GoldenDir("moved_bf16")) / "model.safetensors"));
    // What the golden suites enumerate: only the copy's fixtures.
    int cases = 0;
    for (const auto& entry : fs::directory_iterator(GoldenDir(""))) {
      EXPECT_EQ(entry.path().filename(), "moved_bf16");
      ++cases;
    }
    EXPECT_EQ(cases, 1);
  }
  EXPECT_FALSE(fs::exists(fs::path(GoldenDir("moved_bf16"))));  // back to the default
  fs::remove_all(copy);
}

}  // namespace
}  // namespace glmserve::testing
