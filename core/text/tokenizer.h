// GLM-4.5's tokenizer: a Hugging Face `tokenizer.json` holding a byte-level BPE model, the
// GLM-4.5 Split pre-tokenizer (core/text/pretokenizer.h), the ByteLevel decoder and added
// tokens matched before BPE. Encoding and decoding are identical to Hugging Face `tokenizers`
// (tests/core/text/tokenizer_test.cc checks >= 10,000 strings against it); any other
// tokenizer type, pre-tokenizer, normalizer or option is refused at load with an error that
// names it, rather than tokenizing differently. Immutable after loading: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace glmserve {

struct TokenizerLimits {
  uint64_t max_file_bytes = uint64_t{64} << 20;  // tokenizer.json (GLM-4.5's is ~20 MB)
  uint32_t max_vocab = uint32_t{1} << 22;        // ids and entries
  size_t max_input_bytes = size_t{16} << 20;     // one Encode call's text
  size_t max_tokens = size_t{4} << 20;           // one Encode / Decode call's ids
};

class Tokenizer {
 public:
  // Parses tokenizer.json's content. `origin` names it in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json,
                                                             std::string_view origin,
                                                             const TokenizerLimits& limits = {});
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path,
                                                             const TokenizerLimits& limits = {});

  // The ids of `text` (valid UTF-8, else INVALID_ARGUMENT with the offset), added tokens
  // included, nothing prepended (HF's encode(text, add_special_tokens=False)).
  // RESOURCE_EXHAUSTED as soon as the ids would exceed `max_tokens` (0: the limit's).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, size_t max_tokens = 0) const;

  // HF's decode(ids, skip_special_tokens): the tokens' bytes joined, ill-formed UTF-8 replaced
  // with U+FFFD. An id without a token is INVALID_ARGUMENT (HF drops it silently).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // One past the largest id (the embedding rows a model needs at least).
  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }
  bool HasId(int32_t id) const { return id >= 0 && id < id_limit() && tokens_[id].present; }
  bool IsSpecial(int32_t id) const { return HasId(id) && tokens_[id].special; }
  bool IsAdded(int32_t id) const { return HasId(id) && tokens_[id].added; }
  // The bytes an id decodes to (before U+FFFD replacement); empty for an absent id.
  std::string_view TokenBytes(int32_t id) const {
    return HasId(id) ? std::string_view(tokens_[id].bytes) : std::string_view();
  }
  // The id of an added token's content (e.g. "<|user|>"), if any.
  std::optional<int32_t> AddedTokenId(std::string_view content) const;
  size_t num_added_tokens() const { return added_.size(); }
  const TokenizerLimits& limits() const { return limits_; }

 private:
  struct TokenInfo {
    std::string bytes;
    bool present = false;
    bool added = false;
    bool special = false;
  };
  struct AddedToken {
    std::string content;
    int32_t id;
    bool normalized;
  };
  struct MergeValue {
    uint32_t rank;
    int32_t merged;
  };

  Tokenizer() = default;
  struct JsonLoader;  // FromJson's parts (tokenizer.cc)
  friend struct JsonLoader;
  // Appends the ids of one pre-token (raw bytes).
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;
  // Appends the ids of a stretch of text with no added token in it. False, with the work
  // stopped, once the ids would pass `limit` (known before any work when even the fewest
  // tokens the text could take, one per max_token_bytes_, pass it).
  bool EncodePlain(std::string_view text, std::vector<int32_t>* ids, size_t limit) const;
  // Splits out the added tokens (those with normalized == normalized_pass), leftmost-longest,
  // and encodes the text between them; false as EncodePlain.
  bool SplitAdded(std::string_view text, bool normalized_pass, std::vector<int32_t>* ids,
                  size_t limit) const;

  TokenizerLimits limits_;
  std::vector<TokenInfo> tokens_;                     // by id
  absl::flat_hash_map<std::string, int32_t> vocab_;   // BPE vocabulary, keys as raw bytes
  absl::flat_hash_map<uint64_t, MergeValue> merges_;  // (left id << 32 | right id)
  int32_t byte_id_[256];                              // the single-byte tokens
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;       // longest first
  bool added_first_byte_[2][256] = {};  // [normalized] may an added token start here
  bool has_added_[2] = {false, false};
  bool added_has_newline_ = false;  // then Encode cannot slice at newlines
  size_t max_token_bytes_ = 1;      // the longest token's bytes: a text of n bytes takes at
                                    // least n / max_token_bytes_ tokens
};

}  // namespace glmserve
