// The bytes of a step sent from the leader of a tensor-parallel group to a worker process
// (core/model/remote_ranks.h, docs/parallel.md "Ranks in several processes"): a ForwardBatch
// with its block tables, its ForwardOptions, and the few other calls a rank runner takes
// (CreateCache, SetKvCacheDType), plus the worker's reply. Both ends run the same build (the
// hello checks it), so the format is plain little-endian fields in a fixed order, no schema
// evolution; a decoder still checks every count against the bytes left before it allocates,
// so a corrupt or hostile frame is an error, never a crash or an unbounded allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve {

// What a frame from the leader asks of a worker.
enum class StepCall : uint32_t {
  kCreateCache = 1,   // num_blocks, block_size -> cache id
  kSetKvDType = 2,    // KvCacheDType
  kForward = 3,       // cache id, batch, options
  kDestroyCache = 4,  // cache id
  kEnableMtp = 5,     // no payload
};

// A decoded step: owns what the ForwardBatch views (token ids, hidden rows, block tables).
struct DecodedStep {
  int64_t cache_id = 0;
  std::vector<int32_t> token_ids;
  std::vector<float> hidden_in;
  std::vector<BlockTable> tables;
  ForwardBatch batch;  // views into the vectors above
  ForwardOptions options;
};

// kForward's payload.
std::string EncodeForward(int64_t cache_id, const ForwardBatch& batch,
                          const ForwardOptions& options);
// INVALID_ARGUMENT for a malformed payload (naming what), or one whose counts exceed `limits`.
struct StepLimits {
  int64_t max_tokens = int64_t{1} << 22;        // rows of a step
  int64_t max_sequences = int64_t{1} << 16;     // sequences of a step
  int64_t max_table_blocks = int64_t{1} << 24;  // blocks of one table
  int64_t hidden_size = 0;                      // floats per hidden_in row (0: none accepted)
};
absl::Status DecodeForward(absl::string_view payload, const StepLimits& limits, DecodedStep* out);

// The small calls: kCreateCache (num_blocks, block_size), kSetKvDType, kDestroyCache.
std::string EncodeInts(const std::vector<int64_t>& values);
absl::Status DecodeInts(absl::string_view payload, size_t count, std::vector<int64_t>* values);

// A reply: the call's status, and for kCreateCache the new cache's id.
std::string EncodeReply(const absl::Status& status, int64_t value = 0);
absl::Status DecodeReply(absl::string_view payload, absl::Status* status, int64_t* value);

// The group's handshake. A worker's hello: its build (both ends must run the same build), the
// group's token (pods of another group are refused) and its node index (1..nodes-1).
struct WorkerHello {
  std::string build;
  std::string token;
  int64_t node = 0;
};
std::string EncodeHello(const WorkerHello& hello);
absl::Status DecodeHello(absl::string_view payload, WorkerHello* hello);

// What a worker reports once its ranks are built (or why they could not be).
struct WorkerInfo {
  absl::Status status;
  int64_t kv_bytes_per_token = 0;
  int64_t weight_bytes = 0;
  std::string device_name;
};
std::string EncodeWorkerInfo(const WorkerInfo& info);
absl::Status DecodeWorkerInfo(absl::string_view payload, WorkerInfo* info);

}  // namespace glmserve
