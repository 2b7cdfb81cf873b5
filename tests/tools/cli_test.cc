// --help and --version (tools/cli.h): the grouping, defaults and wrapping in-process, and the
// real glm-server, glm-client and glm-run binaries answering both with exit status 0 and
// listing every flag their main file defines.
#include "tools/cli.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/server/test_server.h"

ABSL_FLAG(int, cli_test_grouped, 7, "a grouped flag");
ABSL_FLAG(std::string, cli_test_ungrouped, "", "a flag no group names");
ABSL_FLAG(absl::Duration, cli_test_wrapped, absl::Seconds(3),
          "a flag whose description is long enough that the help text has to wrap it onto a "
          "second line at the hundredth column, indented under the first line's description");

namespace glmserve::cli {
namespace {

using glmserve::testing::CommandResult;
using glmserve::testing::RunCommand;

ProgramHelp TestHelp() {
  return ProgramHelp{"cli_test",
                     "tests the help",
                     {"cli_test --cli_test_grouped=3"},
                     {{"First group", {"cli_test_grouped", "cli_test_wrapped", "no_such_flag"}},
                      {"Empty group", {"no_such_flag_either"}}},
                     "tests/tools/cli_test.cc",
                     "The end."};
}

TEST(CliHelpTest, GroupsFlagsWithDefaultsAndListsUngroupedOnes) {
  const std::string text = HelpText(TestHelp());
  EXPECT_TRUE(absl::StartsWith(text, "cli_test ")) << text;
  EXPECT_NE(text.find("Usage:\n  cli_test --cli_test_grouped=3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nFirst group:\n  --cli_test_grouped=INT"), std::string::npos) << text;
  EXPECT_NE(text.find("a grouped flag [default: 7]"), std::string::npos) << text;
  // Unknown names and groups left empty print nothing.
  EXPECT_EQ(text.find("no_such_flag"), std::string::npos) << text;
  EXPECT_EQ(text.find("Empty group"), std::string::npos) << text;
  // A flag of this file that no group names is still listed; its empty default says so.
  const size_t other = text.find("\nOther flags:\n  --cli_test_ungrouped=STRING");
  ASSERT_NE(other, std::string::npos) << text;
  EXPECT_NE(text.find("[default: none]", other), std::string::npos) << text;
  EXPECT_NE(text.find("The end.\n"), std::string::npos);
  // Wrapped at 100 columns, continuation lines indented under the description.
  bool wrapped = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    EXPECT_LE(line.size(), 100u) << line;
    if (absl::StrContains(line, "[default: 3s]")) {
      wrapped = absl::StartsWith(line, std::string(32, ' '));
    }
  }
  EXPECT_TRUE(wrapped) << text;
}

TEST(CliHelpTest, HandlesHelpAndVersionOnlyBeforeADoubleDash) {
  const char* help[] = {"prog", "--cli_test_grouped=1", "--help"};
  const char* version[] = {"prog", "--version"};
  const char* after_dashes[] = {"prog", "--", "--help"};
  const char* plain[] = {"prog", "--cli_test_grouped=1", "info"};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(HandleHelpAndVersion(3, const_cast<char**>(help), TestHelp()), 0);
  EXPECT_EQ(HandleHelpAndVersion(2, const_cast<char**>(version), TestHelp()), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("First group:"), std::string::npos);
  EXPECT_NE(out.find(VersionText("cli_test")), std::string::npos) << out;
  EXPECT_EQ(HandleHelpAndVersion(3, const_cast<char**>(after_dashes), TestHelp()), std::nullopt);
  EXPECT_EQ(HandleHelpAndVersion(3, const_cast<char**>(plain), TestHelp()), std::nullopt);
}

TEST(CliHelpTest, VersionIsTheProjectsAndTheBuildsOwn) {
  const BuildInfo& b = GetBuildInfo();
  EXPECT_EQ(b.version, GLMSERVE_EXPECTED_VERSION);
  EXPECT_EQ(b.build_type, GLMSERVE_EXPECTED_BUILD_TYPE);
  EXPECT_EQ(b.git_commit, GLMSERVE_EXPECTED_COMMIT);
  EXPECT_EQ(b.cuda, GLMSERVE_EXPECTED_CUDA != 0);
  const std::string text = VersionText("x");
  EXPECT_EQ(text,
            absl::StrCat("x ", GLMSERVE_EXPECTED_VERSION, " (commit ", GLMSERVE_EXPECTED_COMMIT,
                         ", ", GLMSERVE_EXPECTED_BUILD_TYPE, " build, CUDA backend ",
                         b.cuda ? "compiled in" : "not compiled in", ")\n"));
}

// The flag names an ABSL_FLAG line in `source` (relative to the repository) defines.
std::vector<std::string> FlagsDefinedIn(const std::string& source) {
  std::ifstream in(absl::StrCat(GLMSERVE_SOURCE_DIR, "/", source));
  EXPECT_TRUE(in) << source;
  std::stringstream text;
  text << in.rdbuf();
  const std::string body = text.str();
  std::vector<std::string> names;
  static const std::regex kFlag(R"(ABSL_FLAG\(\s*[^,]+,\s*(\w+)\s*,)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), kFlag);
       it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

struct Binary {
  const char* path;
  const char* name;
  const char* source;
  std::vector<std::string> expected;  // lines the help must contain
};

void PrintTo(const Binary& b, std::ostream* os) { *os << b.name; }

class BinaryHelpTest : public ::testing::TestWithParam<Binary> {};

TEST_P(BinaryHelpTest, HelpListsEveryFlagGroupedAndExitsZero) {
  const Binary& b = GetParam();
  for (const char* arg : {"--help", "-h"}) {
    const CommandResult r = RunCommand(absl::StrCat(b.path, " ", arg));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(absl::StartsWith(r.output, absl::StrCat(b.name, " ", GLMSERVE_EXPECTED_VERSION)))
        << r.output;
    EXPECT_EQ(r.output.find("No flags matched"), std::string::npos);
    // Abseil's own flags and build paths stay in --helpfull.
    EXPECT_EQ(r.output.find("absl"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("--flagfile"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("Other flags:"), std::string::npos)
        << "a flag of " << b.source << " is in no group: add it to a group in its Help()\n"
        << r.output;
    const std::vector<std::string> flags = FlagsDefinedIn(b.source);
    EXPECT_GE(flags.size(), 5u);
    for (const std::string& flag : flags) {
      EXPECT_TRUE(std::regex_search(r.output, std::regex("\n  --" + flag + "(=[A-Z]+)?[ \n]")))
          << flag << " missing from\n"
          << r.output;
    }
    for (const std::string& line : b.expected) {
      EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
    }
  }
  const CommandResult v = RunCommand(absl::StrCat(b.path, " --version"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_EQ(v.output, VersionText(b.name));
  EXPECT_EQ(v.output.find("NDEBUG"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, BinaryHelpTest,
    ::testing::Values(Binary{GLM_SERVER_PATH,
                             "glm-server",
                             "server/main.cc",
                             {"\nModel and device:\n  --model=STRING",
                              "[default: \"glm-4.5-kjv\"]", "[default: 30s]", "\nSecurity:\n",
                              "[default: 32768]"}},
                      Binary{GLM_CLIENT_PATH,
                             "glm-client",
                             "client/main.cc",
                             {"\nConnection:\n  --target=STRING", "[default: \"127.0.0.1:50051\"]",
                              "close-session", "  --min_p=NUMBER"}},
                      Binary{GLM_RUN_PATH,
                             "glm-run",
                             "tools/glm_run.cc",
                             {"\nModel:\n  --model=STRING", "  --stop_at_eos "}}),
    [](const ::testing::TestParamInfo<Binary>& info) {
      std::string name = info.param.name;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace glmserve::cli
