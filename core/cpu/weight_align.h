// Linear-layer matrices on cache lines, for the AMX kernel (CpuMath::kBf16Amx).
//
// The AMX kernel reads bf16 weights in place as tile operands, 16 rows of 64 bytes per tile
// load; a row that straddles two cache lines costs two accesses, and measured on an AMX Xeon
// the tile loop then runs at 0.28-0.37 of its aligned rate (bench/amx_tile_bench). Random
// presets are allocated aligned, but a safetensors file puts its tensors wherever its header
// ends (a multiple of 8 bytes): the glm-run --save checkpoints and Hugging Face's alike sit 16
// bytes off. So in that mode the engine copies such matrices once at load.
#pragma once

#include <cstdint>

#include "core/model/weights.h"

namespace glmserve {

// Copies every dense (kDense) linear matrix (ModelWeights::LinearMatrices) whose data is not
// 64-byte aligned into one aligned buffer joined to weights->storage, and repoints it (the
// original mapping then holds only page cache). Values are unchanged, so every result is too.
// Returns the bytes copied; 0 when all were aligned, or when the buffer cannot be had (the
// matrices then stay where they are: slower, never wrong).
int64_t AlignLinearMatrices(ModelWeights* weights);

}  // namespace glmserve
