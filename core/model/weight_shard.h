// One rank's slice of a model's weights (the rules: core/model/parallel_layout.h).
//
// Rows of a matrix (output features) are views into the whole model's memory, so a rank reads
// only its rows of a mapped checkpoint; columns (input features: o_proj, the down projections)
// are copied into memory of the rank's own, on the thread that slices (a rank pinned to a NUMA
// node first-touches its copies there). Vectors are copied. The result's config is the
// rank's (RankLayout::LocalConfig); routed experts a rank does not hold stay empty matrices.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/model/parallel_layout.h"
#include "core/model/weights.h"

namespace glmserve {

// The unit an FFN width is split in for these weights: the FP8 scale block along a width
// (128 for the published block-scaled checkpoints), the int8 group (32) for weights
// quantized at load, 1 for dense weights. Pass it to CheckParallelLayout / LayoutOf.
int64_t WeightSplitUnit(const ModelWeights& weights);

// Rank `layout.rank`'s weights. FAILED_PRECONDITION for weights a rank cannot slice (FP8
// codes generated on a device); INVALID_ARGUMENT when a column split does not fall on a scale
// block or int8 group boundary (a layout not made with WeightSplitUnit).
absl::StatusOr<ModelWeights> ShardWeights(const ModelWeights& whole, const RankLayout& layout);

}  // namespace glmserve
