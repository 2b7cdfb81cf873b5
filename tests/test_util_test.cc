// GoldenDir: the compiled-in fixture directory by default, the one GLMSERVE_GOLDEN_DIR names
// when set (a bundle run on a GPU host, where the source tree's path does not exist).
#include "tests/test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "core/base/socket.h"

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

TEST(MakeTempDirTest, TheDirectoryGoesWhenTheProcessExitsUnlessKept) {
  // A child process makes one and exits: gone. With GLMSERVE_KEEP_TEST_DIRS=1: kept.
  for (const bool keep : {false, true}) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (keep) setenv("GLMSERVE_KEEP_TEST_DIRS", "1", 1);
      const std::string dir = MakeTempDir("glm_test_util_");
      std::ofstream(dir + "/file") << "x";
      (void)!write(fds[1], dir.data(), dir.size());
      close(fds[1]);
      std::exit(0);  // a normal exit runs the removal
    }
    close(fds[1]);
    char buf[512];
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_GT(n, 0);
    const std::string dir(buf, n);
    EXPECT_EQ(fs::exists(dir), keep) << dir;
    if (keep) fs::remove_all(dir);
  }
}

TEST(FreePortPairTest, BothPortsAreFreeAndBelowTheEphemeralRange) {
  const int port = FreePortPair();
  ASSERT_GT(port, 0);
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  if (ephemeral_low > 10002) {
    EXPECT_LT(port + 1, ephemeral_low);
  }
  // Both bind on every interface, as a leader does.
  absl::StatusOr<Socket> first = Listen("", port);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Socket> second = Listen("", port + 1);
  EXPECT_TRUE(second.ok()) << second.status();
}

}  // namespace
}  // namespace glmserve::testing
