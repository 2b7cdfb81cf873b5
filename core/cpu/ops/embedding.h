// Token embedding lookup: rows of the [vocab, hidden] table, widened to fp32.
#pragma once

#include <cstdint>

#include "core/model/weights.h"

namespace glmserve {

// out: [tokens, table.cols]. Token ids must be in [0, table.rows) (checked by the caller).
void EmbedTokens(const Matrix& table, const int32_t* ids, int64_t tokens, float* out);

}  // namespace glmserve
