// The access log: one line per finished GlmService call (request id, RPC, status code, prompt
// and generated tokens, queue / time-to-first-token / total milliseconds), as plain
// `key=value` text or one JSON object per line.
//
// Record() only copies the entry into a queue under a mutex; a writer thread formats and
// writes it, so neither the engine thread nor gRPC's threads ever wait on the disk.
//
// Kept in-house rather than a logging library: Debian 12's Abseil (20220623) predates
// absl::log, and glog or spdlog would add a runtime package for one line format.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace glmserve {

enum class LogFormat { kText, kJson };
absl::StatusOr<LogFormat> ParseLogFormat(const std::string& text);  // "text" or "json"

struct AccessRecord {
  absl::Time time;         // when the call finished
  std::string rpc;         // "Generate", "Forward", ...
  std::string code;        // gRPC code name, "OK", "INVALID_ARGUMENT", ...
  std::string request_id;  // the client's request_id (empty when it sent none)
  std::string peer;        // the client's address, as gRPC reports it
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  std::optional<double> queue_ms;  // until first scheduled (engine calls that got that far)
  std::optional<double> ttft_ms;   // Generate: until the first token was sampled
  double total_ms = 0;             // handler entry to the call's end
};

// One line, without the newline.
std::string FormatAccessRecord(const AccessRecord& record, LogFormat format);

class AccessLog {
 public:
  // `path`: a file (appended to) or "-" for standard output.
  static absl::StatusOr<std::unique_ptr<AccessLog>> Open(const std::string& path, LogFormat format);
  ~AccessLog();  // writes what is queued, then closes

  void Record(AccessRecord record);
  // Blocks until every record queued so far is written and flushed (tests, shutdown).
  void Flush();

 private:
  AccessLog(FILE* file, bool owned, LogFormat format);
  void WriterLoop();

  FILE* const file_;
  const bool owned_;
  const LogFormat format_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable flushed_cv_;
  std::deque<AccessRecord> queue_;  // guarded by mu_
  int64_t queued_ = 0;              // guarded by mu_: records ever queued
  int64_t written_ = 0;             // guarded by mu_: records written and flushed
  bool stop_ = false;               // guarded by mu_
  std::thread writer_;
};

}  // namespace glmserve
