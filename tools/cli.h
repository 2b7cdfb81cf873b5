// --help and --version for glm-server, glm-client and glm-run.
//
// Abseil 20220623's --help lists only flags defined in a file named after the binary
// ("glm-server.cc"), so for main.cc it printed "No flags matched." and exited 1, and
// --helpfull buries the program's flags among Abseil's own. Each binary instead describes
// its flags in groups here; HandleHelpAndVersion answers --help / -h / --version before
// Abseil parses the command line. A flag the groups forget still appears, under "Other
// flags", so the help can never silently omit one.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace glmserve::cli {

struct FlagGroup {
  std::string title;               // "Model and device"
  std::vector<std::string> flags;  // flag names without "--", in display order
};

struct ProgramHelp {
  std::string name;                // "glm-server"
  std::string summary;             // one line: what the program does
  std::vector<std::string> usage;  // example command lines
  std::vector<FlagGroup> groups;
  std::string main_file;  // e.g. "server/main.cc": its ungrouped flags go to "Other"
  std::string footer;     // optional closing paragraph
};

// What this build is: the project version, the git commit at configure time ("unknown"
// outside a git checkout), CMAKE_BUILD_TYPE and whether the CUDA backend is compiled in.
struct BuildInfo {
  std::string version;
  std::string git_commit;
  std::string build_type;
  bool cuda = false;
};
const BuildInfo& GetBuildInfo();

// "glm-server 0.1.0 (commit 1a2b3c4d5e6f, Release build, CUDA backend compiled in)".
std::string VersionText(const std::string& program);

// The grouped flag listing, with each flag's one-line description and default.
std::string HelpText(const ProgramHelp& help);

// Looks for --help, -h, -help or --version among argv (before a lone "--"); when found,
// prints the help (stdout) or version and returns the exit status (0). nullopt otherwise.
std::optional<int> HandleHelpAndVersion(int argc, char** argv, const ProgramHelp& help);

}  // namespace glmserve::cli
