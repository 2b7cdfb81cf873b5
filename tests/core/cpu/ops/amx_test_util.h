// Tests of the AMX kernels that need the tile unit start with GLM_REQUIRE_AMX(usable, "what"):
// where `usable` is false they are skipped with the reason (the emulation still runs in the
// other tests), unless GLMSERVE_REQUIRE_AMX=1 is set (the GPU bundle's run.sh sets it on a CPU
// whose flags show AMX), which turns the skip into a failure.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace glmserve::testing {

inline bool AmxRequired() {
  const char* v = std::getenv("GLMSERVE_REQUIRE_AMX");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace glmserve::testing

#define GLM_REQUIRE_AMX(usable, what)                                         \
  do {                                                                        \
    if (!(usable)) {                                                          \
      if (::glmserve::testing::AmxRequired()) {                               \
        FAIL() << "GLMSERVE_REQUIRE_AMX=1 but " what " is not usable here";   \
      }                                                                       \
      GTEST_SKIP() << "no " what                                              \
                      " on this CPU, or the OS refused the tile state: only " \
                      "the emulation runs here";                              \
    }                                                                         \
  } while (0)
