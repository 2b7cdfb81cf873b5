#include "tools/cli.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

// Set by tools/CMakeLists.txt at configure time.
#ifndef GLMSERVE_VERSION
#define GLMSERVE_VERSION "unknown"
#endif
#ifndef GLMSERVE_GIT_COMMIT
#define GLMSERVE_GIT_COMMIT "unknown"
#endif
#ifndef GLMSERVE_BUILD_TYPE
#define GLMSERVE_BUILD_TYPE "unknown"
#endif
#ifndef GLMSERVE_CUDA_BUILD
#define GLMSERVE_CUDA_BUILD 0
#endif

namespace glmserve::cli {
namespace {

constexpr size_t kWidth = 100;      // wrap column
constexpr size_t kHelpColumn = 32;  // where descriptions start

// The value placeholder shown after "--name=": what kind of value the flag takes.
std::string Placeholder(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "";
  if (flag.IsOfType<std::string>()) return "=STRING";
  if (flag.IsOfType<absl::Duration>()) return "=DURATION";
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "=NUMBER";
  return "=INT";
}

std::string DefaultText(const absl::CommandLineFlag& flag) {
  const std::string value = flag.DefaultValue();
  if (flag.IsOfType<std::string>()) return value.empty() ? "none" : absl::StrCat("\"", value, "\"");
  return value;
}

// Appends `text` word-wrapped at kWidth, continuation lines indented to kHelpColumn; the
// first word goes at `column` (the description column).
void AppendWrapped(std::string* out, size_t column, const std::string& text) {
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && column + 1 + word.size() > kWidth) {
      absl::StrAppend(out, "\n", std::string(kHelpColumn, ' '));
      column = kHelpColumn;
    } else if (!first) {
      out->push_back(' ');
      ++column;
    }
    absl::StrAppend(out, word);
    column += word.size();
    first = false;
  }
  out->push_back('\n');
}

void AppendFlag(std::string* out, const absl::CommandLineFlag& flag) {
  std::string head = absl::StrCat("  --", flag.Name(), Placeholder(flag));
  if (head.size() + 1 > kHelpColumn) {
    absl::StrAppend(out, head, "\n");
    head.clear();
  }
  head.resize(kHelpColumn, ' ');
  absl::StrAppend(out, head);
  std::string help = flag.Help();
  std::replace(help.begin(), help.end(), '\n', ' ');
  // Descriptions that already explain their default ("(default: all)") keep their wording.
  // The default is wrapped as one word ('\x01' stands for its space until then).
  if (!absl::StrContains(help, "(default:")) {
    absl::StrAppend(&help, " [default:\x01", DefaultText(flag), "]");
  }
  const size_t start = out->size();
  AppendWrapped(out, kHelpColumn, help);
  std::replace(out->begin() + static_cast<std::ptrdiff_t>(start), out->end(), '\x01', ' ');
}

bool IsProgramFlag(const absl::CommandLineFlag& flag, const std::string& main_file) {
  return !main_file.empty() && absl::EndsWith(flag.Filename(), main_file);
}

}  // namespace

const BuildInfo& GetBuildInfo() {
  static const BuildInfo* info = new BuildInfo{GLMSERVE_VERSION, GLMSERVE_GIT_COMMIT,
                                               GLMSERVE_BUILD_TYPE, GLMSERVE_CUDA_BUILD != 0};
  return *info;
}

std::string VersionText(const std::string& program) {
  const BuildInfo& b = GetBuildInfo();
  return absl::StrCat(program, " ", b.version, " (commit ", b.git_commit, ", ", b.build_type,
                      " build, CUDA backend ", b.cuda ? "compiled in" : "not compiled in", ")\n");
}

std::string HelpText(const ProgramHelp& help) {
  std::string out = absl::StrCat(help.name, " ", GetBuildInfo().version, ": ", help.summary, "\n");
  if (!help.usage.empty()) {
    out += "\nUsage:\n";
    for (const std::string& line : help.usage) absl::StrAppend(&out, "  ", line, "\n");
  }
  std::set<std::string> shown;
  for (const FlagGroup& group : help.groups) {
    std::string body;
    for (const std::string& name : group.flags) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag == nullptr || flag->IsRetired() || !shown.insert(name).second) continue;
      AppendFlag(&body, *flag);
    }
    if (!body.empty()) absl::StrAppend(&out, "\n", group.title, ":\n", body);
  }
  // Flags the groups do not name, in name order, so that none is ever missing.
  std::map<std::string, const absl::CommandLineFlag*> others;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsProgramFlag(*flag, help.main_file) && !flag->IsRetired() &&
        shown.count(std::string(name)) == 0) {
      others.emplace(std::string(name), flag);
    }
  }
  if (!others.empty()) {
    out += "\nOther flags:\n";
    for (const auto& [name, flag] : others) AppendFlag(&out, *flag);
  }
  out += "\nGeneral:\n";
  out += "  --help                        this text\n";
  out += "  --version                     version, git commit and build type\n";
  out += "  --helpfull                    every flag, Abseil's own included\n";
  if (!help.footer.empty()) absl::StrAppend(&out, "\n", help.footer, "\n");
  return out;
}

std::optional<int> HandleHelpAndVersion(int argc, char** argv, const ProgramHelp& help) {
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) break;
    if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-help") == 0 ||
        std::strcmp(arg, "-h") == 0) {
      std::fputs(HelpText(help).c_str(), stdout);
      return 0;
    }
    if (std::strcmp(arg, "--version") == 0 || std::strcmp(arg, "-version") == 0) {
      std::fputs(VersionText(help.name).c_str(), stdout);
      return 0;
    }
  }
  return std::nullopt;
}

}  // namespace glmserve::cli
