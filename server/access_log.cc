#include "server/access_log.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

std::string Millis(double ms) { return absl::StrFormat("%.3f", ms); }

// Text values are quoted when they could break the key=value split (ids are client input).
std::string TextValue(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \"=\\\n\r\t") == std::string::npos) return value;
  return nlohmann::json(value).dump();  // a quoted, escaped string
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(const std::string& text) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format='", text, "' is neither text nor json"));
}

std::string FormatAccessRecord(const AccessRecord& r, LogFormat format) {
  const std::string time = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", r.time, absl::UTCTimeZone());
  if (format == LogFormat::kJson) {
    nlohmann::json j = {{"time", time},
                        {"rpc", r.rpc},
                        {"code", r.code},
                        {"request_id", r.request_id},
                        {"peer", r.peer},
                        {"prompt_tokens", r.prompt_tokens},
                        {"generated_tokens", r.generated_tokens},
                        {"total_ms", r.total_ms}};
    j["queue_ms"] = r.queue_ms ? nlohmann::json(*r.queue_ms) : nlohmann::json(nullptr);
    j["ttft_ms"] = r.ttft_ms ? nlohmann::json(*r.ttft_ms) : nlohmann::json(nullptr);
    // Client-chosen ids may hold invalid UTF-8: replace rather than throw.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return absl::StrCat(time, " rpc=", r.rpc, " code=", r.code,
                      " request_id=", r.request_id.empty() ? "-" : TextValue(r.request_id),
                      " peer=", r.peer.empty() ? "-" : TextValue(r.peer),
                      " prompt_tokens=", r.prompt_tokens, " generated_tokens=", r.generated_tokens,
                      " queue_ms=", r.queue_ms ? Millis(*r.queue_ms) : "-",
                      " ttft_ms=", r.ttft_ms ? Millis(*r.ttft_ms) : "-",
                      " total_ms=", Millis(r.total_ms));
}

absl::StatusOr<std::unique_ptr<AccessLog>> AccessLog::Open(const std::string& path,
                                                           LogFormat format) {
  if (path.empty()) return absl::InvalidArgumentError("access log: empty path");
  if (path == "-") return std::unique_ptr<AccessLog>(new AccessLog(stdout, false, format));
  FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("access log: cannot open '", path, "' for appending: ", std::strerror(errno)));
  }
  return std::unique_ptr<AccessLog>(new AccessLog(file, true, format));
}

AccessLog::AccessLog(FILE* file, bool owned, LogFormat format)
    : file_(file), owned_(owned), format_(format), writer_([this] { WriterLoop(); }) {}

AccessLog::~AccessLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
  if (owned_) std::fclose(file_);
}

void AccessLog::Record(AccessRecord record) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(record));
    ++queued_;
  }
  cv_.notify_one();
}

void AccessLog::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = queued_;
  flushed_cv_.wait(lock, [&] { return written_ >= target; });
}

void AccessLog::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) return;
    std::deque<AccessRecord> batch;
    batch.swap(queue_);
    lock.unlock();
    std::string lines;
    for (const AccessRecord& r : batch)
      absl::StrAppend(&lines, FormatAccessRecord(r, format_), "\n");
    std::fwrite(lines.data(), 1, lines.size(), file_);
    std::fflush(file_);
    lock.lock();
    written_ += static_cast<int64_t>(batch.size());
    flushed_cv_.notify_all();
  }
}

}  // namespace glmserve
