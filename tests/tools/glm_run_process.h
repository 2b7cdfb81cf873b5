// Runs the glm-run binary this build made (GLM_RUN_PATH, compiled in by tests/CMakeLists.txt)
// and captures what it prints: the tests of glm-run drive it as a user does.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace glmserve::testing {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

inline RunResult RunGlmRun(const std::string& args) {
  const std::string command = absl::StrCat(GLM_RUN_PATH, " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), output};
}

}  // namespace glmserve::testing
