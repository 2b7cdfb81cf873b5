#include "core/model/step_codec.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace glmserve {
namespace {

// Appends fixed-width little-endian fields (the hosts glmserve builds for are little-endian;
// the hello compares builds, so both ends agree on every width).
class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void PutSpan(const T* data, size_t n) {
    Put<uint64_t>(n);
    out_.append(reinterpret_cast<const char*>(data), n * sizeof(T));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what Writer wrote; every read checks the bytes left, and a count is checked against
// them (and a limit) before anything is allocated for it.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  template <typename T>
  bool GetVector(int64_t limit, std::vector<T>* v) {
    uint64_t n = 0;
    if (!Get(&n) || n > static_cast<uint64_t>(limit) || n > in_.size() / sizeof(T)) return false;
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), in_.data(), n * sizeof(T));
    in_.remove_prefix(n * sizeof(T));
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  absl::string_view in_;
};

void PutSampling(Writer& w, const samplemath::RowSampling& p) {
  w.Put(p.temperature);
  w.Put(p.top_p);
  w.Put(p.min_p);
  w.Put(p.repetition_penalty);
  w.Put(p.top_k);
  w.Put(p.penalised_begin);
  w.Put(p.penalised_count);
  w.Put(p.columns);
  w.Put(p.forced);
  w.Put<uint8_t>(p.logprob ? 1 : 0);
  w.Put(p.top_logprobs);
  w.Put(p.seed);
  w.Put(p.token_index);
}

bool GetSampling(Reader& r, samplemath::RowSampling* p) {
  uint8_t logprob = 0;
  const bool ok = r.Get(&p->temperature) && r.Get(&p->top_p) && r.Get(&p->min_p) &&
                  r.Get(&p->repetition_penalty) && r.Get(&p->top_k) && r.Get(&p->penalised_begin) &&
                  r.Get(&p->penalised_count) && r.Get(&p->columns) && r.Get(&p->forced) &&
                  r.Get(&logprob) && r.Get(&p->top_logprobs) && r.Get(&p->seed) &&
                  r.Get(&p->token_index);
  p->logprob = logprob != 0;
  return ok && logprob <= 1;
}

bool ValidLogitsRows(uint8_t v) { return v <= static_cast<uint8_t>(LogitsRows::kAll); }

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed step from the leader: ", what));
}

}  // namespace

std::string EncodeForward(int64_t cache_id, const ForwardBatch& batch,
                          const ForwardOptions& options) {
  Writer w;
  w.Put(cache_id);
  w.PutSpan(batch.token_ids.data(), batch.token_ids.size());
  w.PutSpan(batch.hidden_in.data(), batch.hidden_in.size());
  w.Put<uint64_t>(batch.sequences.size());
  for (const SequenceSlice& s : batch.sequences) {
    w.Put(s.num_tokens);
    w.Put(s.start_position);
    static const BlockTable kNone;
    const BlockTable& t = s.blocks != nullptr ? *s.blocks : kNone;
    w.PutSpan(t.data(), t.size());
  }
  w.Put(static_cast<uint8_t>(options.logits));
  std::vector<uint8_t> per_sequence;
  for (LogitsRows r : options.sequence_logits) per_sequence.push_back(static_cast<uint8_t>(r));
  w.PutSpan(per_sequence.data(), per_sequence.size());
  const uint8_t flags = (options.return_hidden ? 1 : 0) | (options.return_layer_hidden ? 2 : 0) |
                        (options.return_expert_choices ? 4 : 0) |
                        (options.return_head_input ? 8 : 0) | (options.mtp ? 16 : 0);
  w.Put(flags);
  w.Put<uint64_t>(options.sample.size());
  for (const RowSampleRequest& s : options.sample) {
    w.Put<uint8_t>((s.sample ? 1 : 0) | (s.keep_logits ? 2 : 0));
    PutSampling(w, s.params);
  }
  w.PutSpan(options.penalised_ids.data(), options.penalised_ids.size());
  w.Put(options.layer_begin);
  w.Put(options.layer_end);
  return w.Take();
}

absl::Status DecodeForward(absl::string_view payload, const StepLimits& limits, DecodedStep* out) {
  Reader r(payload);
  *out = DecodedStep{};
  if (!r.Get(&out->cache_id)) return Malformed("cache id");
  if (!r.GetVector(limits.max_tokens, &out->token_ids)) return Malformed("token ids");
  if (!r.GetVector(limits.max_tokens * limits.hidden_size, &out->hidden_in)) {
    return Malformed("hidden rows");
  }
  uint64_t sequences = 0;
  if (!r.Get(&sequences) || sequences > static_cast<uint64_t>(limits.max_sequences)) {
    return Malformed("sequence count");
  }
  out->tables.resize(sequences);
  std::vector<std::pair<int64_t, int64_t>> slices(sequences);
  for (uint64_t i = 0; i < sequences; ++i) {
    if (!r.Get(&slices[i].first) || !r.Get(&slices[i].second) ||
        !r.GetVector(limits.max_table_blocks, &out->tables[i])) {
      return Malformed(absl::StrCat("sequence ", i));
    }
  }
  // The views, now that the tables will not move.
  for (uint64_t i = 0; i < sequences; ++i) {
    out->batch.sequences.push_back({slices[i].first, slices[i].second, &out->tables[i]});
  }
  out->batch.token_ids = out->token_ids;
  out->batch.hidden_in = out->hidden_in;

  ForwardOptions& o = out->options;
  uint8_t logits = 0, flags = 0;
  std::vector<uint8_t> per_sequence;
  if (!r.Get(&logits) || !ValidLogitsRows(logits)) return Malformed("logits rows");
  o.logits = static_cast<LogitsRows>(logits);
  if (!r.GetVector(limits.max_sequences, &per_sequence)) return Malformed("sequence logits");
  for (uint8_t v : per_sequence) {
    if (!ValidLogitsRows(v)) return Malformed("sequence logits");
    o.sequence_logits.push_back(static_cast<LogitsRows>(v));
  }
  if (!r.Get(&flags) || flags > 31) return Malformed("flags");
  o.return_hidden = flags & 1;
  o.return_layer_hidden = flags & 2;
  o.return_expert_choices = flags & 4;
  o.return_head_input = flags & 8;
  o.mtp = flags & 16;
  uint64_t samples = 0;
  if (!r.Get(&samples) || samples > static_cast<uint64_t>(limits.max_tokens)) {
    return Malformed("sample requests");
  }
  o.sample.resize(samples);
  for (RowSampleRequest& s : o.sample) {
    uint8_t bits = 0;
    if (!r.Get(&bits) || bits > 3 || !GetSampling(r, &s.params)) return Malformed("sample request");
    s.sample = bits & 1;
    s.keep_logits = bits & 2;
  }
  if (!r.GetVector(limits.max_tokens * 64, &o.penalised_ids)) return Malformed("penalised ids");
  if (!r.Get(&o.layer_begin) || !r.Get(&o.layer_end)) return Malformed("layer span");
  if (!r.done()) return Malformed("trailing bytes");
  return absl::OkStatus();
}

std::string EncodeInts(const std::vector<int64_t>& values) {
  Writer w;
  for (int64_t v : values) w.Put(v);
  return w.Take();
}

absl::Status DecodeInts(absl::string_view payload, size_t count, std::vector<int64_t>* values) {
  Reader r(payload);
  values->assign(count, 0);
  for (int64_t& v : *values) {
    if (!r.Get(&v)) return Malformed("integers");
  }
  if (!r.done()) return Malformed("trailing bytes");
  return absl::OkStatus();
}

std::string EncodeReply(const absl::Status& status, int64_t value) {
  Writer w;
  w.Put(static_cast<int32_t>(status.code()));
  w.Put(value);
  const absl::string_view message = status.message().substr(0, 4096);
  w.PutSpan(message.data(), message.size());
  return w.Take();
}

absl::Status DecodeReply(absl::string_view payload, absl::Status* status, int64_t* value) {
  Reader r(payload);
  int32_t code = 0;
  std::vector<char> message;
  if (!r.Get(&code) || !r.Get(value) || !r.GetVector(1 << 16, &message) || !r.done() || code < 0 ||
      code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError("malformed reply from a worker process");
  }
  *status = absl::Status(static_cast<absl::StatusCode>(code),
                         absl::string_view(message.data(), message.size()));
  return absl::OkStatus();
}

namespace {

void PutString(Writer& w, absl::string_view s) { w.PutSpan(s.data(), s.size()); }

bool GetString(Reader& r, std::string* s) {
  std::vector<char> chars;
  if (!r.GetVector(1 << 16, &chars)) return false;
  s->assign(chars.begin(), chars.end());
  return true;
}

}  // namespace

std::string EncodeHello(const WorkerHello& hello) {
  Writer w;
  PutString(w, hello.build);
  PutString(w, hello.token);
  w.Put(hello.node);
  return w.Take();
}

absl::Status DecodeHello(absl::string_view payload, WorkerHello* hello) {
  Reader r(payload);
  if (!GetString(r, &hello->build) || !GetString(r, &hello->token) || !r.Get(&hello->node) ||
      !r.done()) {
    return absl::InvalidArgumentError("malformed hello from a worker process");
  }
  return absl::OkStatus();
}

std::string EncodeWorkerInfo(const WorkerInfo& info) {
  Writer w;
  const std::string reply = EncodeReply(info.status);
  PutString(w, reply);
  w.Put(info.kv_bytes_per_token);
  w.Put(info.weight_bytes);
  PutString(w, info.device_name);
  return w.Take();
}

absl::Status DecodeWorkerInfo(absl::string_view payload, WorkerInfo* info) {
  Reader r(payload);
  std::string reply;
  int64_t unused = 0;
  if (!GetString(r, &reply) || !DecodeReply(reply, &info->status, &unused).ok() ||
      !r.Get(&info->kv_bytes_per_token) || !r.Get(&info->weight_bytes) ||
      !GetString(r, &info->device_name) || !r.done()) {
    return absl::InternalError("malformed report from a worker process");
  }
  return absl::OkStatus();
}

}  // namespace glmserve
