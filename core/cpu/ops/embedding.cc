#include "core/cpu/ops/embedding.h"

#include "core/cpu/ops/linear.h"

namespace glmserve {

void EmbedTokens(const Matrix& table, const int32_t* ids, int64_t tokens, float* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    internal::WidenPanel(table, ids[t], 1, 0, table.cols, out + t * table.cols);
  }
}

}  // namespace glmserve
