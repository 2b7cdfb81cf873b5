#include "core/text/tokenizer.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/file_io.h"
#include "core/base/status_macros.h"
#include "core/text/pretokenizer.h"
#include "core/text/unicode.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using Json = nlohmann::json;

// Per-thread scratch beyond this many elements is released after use, so that one huge text
// does not leave hundreds of MB with every thread that ever encoded one.
constexpr size_t kKeptScratch = size_t{1} << 16;

// GLM-4.5's Split pattern, the only one core/text/pretokenizer.cc implements.
constexpr std::string_view kGlm45Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 are shifted
// to U+0100 and up, so that every byte is a visible character of the vocabulary's strings.
struct ByteAlphabet {
  uint32_t byte_to_cp[256];
  absl::flat_hash_map<uint32_t, uint8_t> cp_to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? b : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& Alphabet() {
  static const auto* a = new ByteAlphabet();
  return *a;
}

// A vocabulary string's bytes: each character mapped back through the alphabet, or, when one
// is outside it, the string's own UTF-8 (what the ByteLevel decoder does per token).
std::string TokenToBytes(std::string_view token, bool* mapped) {
  std::string out;
  size_t i = 0;
  *mapped = true;
  while (i < token.size()) {
    uint32_t cp;
    const int n = Utf8Next(token, i, &cp);
    auto it = n > 0 ? Alphabet().cp_to_byte.find(cp) : Alphabet().cp_to_byte.end();
    if (it == Alphabet().cp_to_byte.end()) {
      *mapped = false;
      return std::string(token);
    }
    out.push_back(static_cast<char>(it->second));
    i += static_cast<size_t>(n);
  }
  return out;
}

absl::Status Refuse(const std::string& origin, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(origin, ": ", what,
                   "; glmserve implements only GLM-4.5's tokenizer structure (byte-level "
                   "BPE, GLM-4.5 Split pre-tokenizer, ByteLevel decoder), see docs/text.md"));
}

bool IsNullOrAbsent(const Json& j, const char* key) {
  return !j.contains(key) || j.at(key).is_null();
}

bool BoolField(const Json& j, const char* key, bool dflt) {
  if (!j.contains(key) || !j.at(key).is_boolean()) return dflt;
  return j.at(key).get<bool>();
}

absl::Status CheckPreTokenizer(const Json& pre, const std::string& origin) {
  if (!pre.is_object() || pre.value("type", "") != "Sequence" || !pre.contains("pretokenizers") ||
      !pre.at("pretokenizers").is_array() || pre.at("pretokenizers").size() != 2) {
    return Refuse(origin, "pre_tokenizer is not Sequence[Split, ByteLevel]");
  }
  const Json& split = pre.at("pretokenizers")[0];
  const Json& bl = pre.at("pretokenizers")[1];
  if (!split.is_object() || split.value("type", "") != "Split" || !split.contains("pattern") ||
      !split.at("pattern").is_object() || !split.at("pattern").contains("Regex") ||
      !split.at("pattern").at("Regex").is_string()) {
    return Refuse(origin, "pre_tokenizer's first step is not a Split on a regex");
  }
  if (split.at("pattern").at("Regex").get<std::string>() != kGlm45Pattern) {
    return Refuse(origin, "the Split regex is not GLM-4.5's");
  }
  if (split.value("behavior", "") != "Isolated" || BoolField(split, "invert", false)) {
    return Refuse(origin, "the Split is not behavior Isolated, invert false");
  }
  if (!bl.is_object() || bl.value("type", "") != "ByteLevel" ||
      BoolField(bl, "add_prefix_space", false) || BoolField(bl, "use_regex", true)) {
    return Refuse(origin,
                  "pre_tokenizer's second step is not ByteLevel(add_prefix_space false, "
                  "use_regex false)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path,
                                                               const TokenizerLimits& limits) {
  ASSIGN_OR_RETURN(std::string json, ReadRegularFile(path, limits.max_file_bytes));
  return FromJson(json, path, limits);
}

// FromJson's parts, each a step of reading tokenizer.json (a friend: they fill the
// tokenizer's private tables).
struct Tokenizer::JsonLoader {
  const std::string& origin;
  const TokenizerLimits& limits;
  Tokenizer* tok;

  // Everything outside byte-level BPE with GLM-4.5's pre-tokenizer is refused, naming it.
  static absl::Status CheckStructure(const Json& j, const std::string& origin) {
    if (!IsNullOrAbsent(j, "normalizer")) return Refuse(origin, "a normalizer is set");
    if (!IsNullOrAbsent(j, "truncation") || !IsNullOrAbsent(j, "padding")) {
      return Refuse(origin, "truncation or padding is set");
    }
    if (!IsNullOrAbsent(j, "post_processor") &&
        j.at("post_processor").value("type", "") != "ByteLevel") {
      return Refuse(origin, "post_processor is neither null nor ByteLevel");
    }
    if (!j.contains("pre_tokenizer")) return Refuse(origin, "no pre_tokenizer");
    RETURN_IF_ERROR(CheckPreTokenizer(j.at("pre_tokenizer"), origin));
    if (!j.contains("decoder") || !j.at("decoder").is_object() ||
        j.at("decoder").value("type", "") != "ByteLevel") {
      return Refuse(origin, "decoder is not ByteLevel");
    }
    if (!j.contains("model") || !j.at("model").is_object()) return Refuse(origin, "no model");
    const Json& model = j.at("model");
    if (model.value("type", "") != "BPE") return Refuse(origin, "model type is not BPE");
    if (!IsNullOrAbsent(model, "dropout")) return Refuse(origin, "BPE dropout is set");
    if (!IsNullOrAbsent(model, "unk_token")) return Refuse(origin, "BPE unk_token is set");
    if (BoolField(model, "byte_fallback", false)) return Refuse(origin, "BPE byte_fallback is on");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!IsNullOrAbsent(model, key) &&
          !(model.at(key).is_string() && model.at(key).get<std::string>().empty())) {
        return Refuse(origin, absl::StrCat("BPE ", key, " is set"));
      }
    }
    if (!model.contains("vocab") || !model.at("vocab").is_object() || !model.contains("merges") ||
        !model.at("merges").is_array()) {
      return Refuse(origin, "BPE model without a vocab object and a merges array");
    }
    return absl::OkStatus();
  }

  // Makes room for token `id`: INVALID_ARGUMENT (naming `what`) outside [0, max_vocab).
  absl::Status Place(int64_t id, const std::string& what) const {
    if (id < 0 || id >= static_cast<int64_t>(limits.max_vocab)) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": ", what, " has id ", id,
                                                     ", outside [0, ", limits.max_vocab, ")"));
    }
    if (static_cast<size_t>(id) >= tok->tokens_.size()) tok->tokens_.resize(id + 1);
    return absl::OkStatus();
  }

  // model.vocab: the tokens' bytes, the byte -> id table; `by_string` gets string -> id.
  absl::Status ReadVocab(const Json& model,
                         absl::flat_hash_map<std::string, int32_t>* by_string_out) const {
    absl::flat_hash_map<std::string, int32_t>& by_string = *by_string_out;
    const Json& vocab = model.at("vocab");
    if (vocab.size() > limits.max_vocab) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": vocabulary of ", vocab.size(),
                                                     " entries, more than ", limits.max_vocab));
    }
    by_string.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin, ": vocab entry '", it.key(), "' has no integer id"));
      }
      const int64_t id = it.value().get<int64_t>();
      RETURN_IF_ERROR(Place(id, absl::StrCat("vocab entry '", it.key(), "'")));
      TokenInfo& info = tok->tokens_[id];
      if (info.present) {
        return absl::InvalidArgumentError(absl::StrCat(origin, ": id ", id, " appears twice"));
      }
      bool mapped;
      info.bytes = TokenToBytes(it.key(), &mapped);
      info.present = true;
      by_string[it.key()] = static_cast<int32_t>(id);
      if (mapped) tok->vocab_[info.bytes] = static_cast<int32_t>(id);
    }
    for (int b = 0; b < 256; ++b) {
      auto it = tok->vocab_.find(std::string(1, static_cast<char>(b)));
      if (it == tok->vocab_.end()) {
        // HF would drop such bytes from the output silently: refuse instead.
        return Refuse(origin, absl::StrCat("the vocabulary lacks the token of byte ", b));
      }
      tok->byte_id_[b] = it->second;
    }
    return absl::OkStatus();
  }

  // model.merges ("a b" strings or [a, b] pairs), by rank.
  absl::Status ReadMerges(const Json& model,
                          const absl::flat_hash_map<std::string, int32_t>& by_string) const {
    const Json& merges = model.at("merges");
    if (merges.size() > limits.max_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": ", merges.size(), " merges, more than ", limits.max_vocab));
    }
    tok->merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const Json& m = merges[rank];
      std::string a, b;
      if (m.is_string()) {  // "a b"
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat(origin, ": merge ", rank, " is not 'a b'"));
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(origin, ": merge ", rank, " is malformed"));
      }
      auto ia = by_string.find(a), ib = by_string.find(b), iab = by_string.find(a + b);
      if (ia == by_string.end() || ib == by_string.end() || iab == by_string.end()) {
        return absl::InvalidArgumentError(absl::StrCat(origin, ": merge ", rank, " ('", a, "', '",
                                                       b,
                                                       "') names a token not in the vocabulary"));
      }
      // A repeated pair keeps its last rank, as HF's map construction does.
      tok->merges_[(uint64_t{static_cast<uint32_t>(ia->second)} << 32) |
                   static_cast<uint32_t>(ib->second)] = {static_cast<uint32_t>(rank), iab->second};
    }
    return absl::OkStatus();
  }

  // added_tokens: content, id, special / normalized; refused options named.
  absl::Status ReadAddedTokens(const Json& j) const {
    const Json& added = j.at("added_tokens");
    if (!added.is_array()) return Refuse(origin, "added_tokens is not an array");
    if (added.size() > 65536) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": ", added.size(), " added tokens"));
    }
    for (const Json& a : added) {
      if (!a.is_object() || !a.contains("id") || !a.at("id").is_number_integer() ||
          !a.contains("content") || !a.at("content").is_string() ||
          a.at("content").get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin, ": malformed added token ", a.dump().substr(0, 200)));
      }
      const std::string content = a.at("content").get<std::string>();
      RETURN_IF_ERROR(ValidateUtf8(content, absl::StrCat(origin, ": an added token")));
      for (const char* opt : {"single_word", "lstrip", "rstrip"}) {
        if (BoolField(a, opt, false)) {
          return Refuse(origin, absl::StrCat("added token '", content, "' sets ", opt));
        }
      }
      const int64_t id = a.at("id").get<int64_t>();
      RETURN_IF_ERROR(Place(id, absl::StrCat("added token '", content, "'")));
      TokenInfo& info = tok->tokens_[id];
      bool mapped;
      std::string bytes = TokenToBytes(content, &mapped);
      if (info.present && !info.added && info.bytes != bytes) {
        return absl::InvalidArgumentError(absl::StrCat(origin, ": added token '", content,
                                                       "' reuses id ", id, " of another token"));
      }
      info.bytes = std::move(bytes);
      info.present = true;
      info.added = true;
      info.special = BoolField(a, "special", false);
      const bool normalized = BoolField(a, "normalized", !info.special);
      tok->added_.push_back({content, static_cast<int32_t>(id), normalized});
      tok->added_first_byte_[normalized][static_cast<uint8_t>(content[0])] = true;
      tok->has_added_[normalized] = true;
      if (content.find_first_of("\r\n") != std::string::npos) tok->added_has_newline_ = true;
    }
    // Longest first, so that the first match at a position is the longest one.
    std::stable_sort(tok->added_.begin(), tok->added_.end(),
                     [](const AddedToken& x, const AddedToken& y) {
                       return x.content.size() > y.content.size();
                     });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view text,
                                                               std::string_view origin_view,
                                                               const TokenizerLimits& limits) {
  const std::string origin(origin_view);
  if (text.size() > limits.max_file_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": ", text.size(), " bytes, more than the limit ", limits.max_file_bytes));
  }
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  }
  RETURN_IF_ERROR(JsonLoader::CheckStructure(j, origin));
  const Json& model = j.at("model");
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  tok->limits_ = limits;
  tok->ignore_merges_ = BoolField(model, "ignore_merges", false);
  const JsonLoader loader{origin, limits, tok.get()};
  // The vocabulary as a string -> id map too (merges name tokens by their strings).
  absl::flat_hash_map<std::string, int32_t> by_string;
  RETURN_IF_ERROR(loader.ReadVocab(model, &by_string));
  RETURN_IF_ERROR(loader.ReadMerges(model, by_string));
  if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) {
    RETURN_IF_ERROR(loader.ReadAddedTokens(j));
  }
  for (const TokenInfo& t : tok->tokens_) {
    tok->max_token_bytes_ = std::max(tok->max_token_bytes_, t.bytes.size());
  }
  return tok;
}

std::optional<int32_t> Tokenizer::AddedTokenId(std::string_view content) const {
  for (const AddedToken& a : added_) {
    if (a.content == content) return a.id;
  }
  return std::nullopt;
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.size() == 1) {
    ids->push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = vocab_.find(absl::string_view(word.data(), word.size()));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // BPE as HF's Word::merge_all does it: a min-heap of (rank, position) candidates; a popped
  // candidate is applied if its symbol is alive, has a right neighbour, and that pair still
  // merges into the same token (HF's exact staleness test, kept for identical results).
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
    bool operator<(const Candidate& o) const {  // priority_queue is a max-heap: invert
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<int32_t> sym;
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<Candidate> heap_storage;
  const size_t n = word.size();
  sym.resize(n);
  prev.resize(n);
  next.resize(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = byte_id_[static_cast<uint8_t>(word[i])];
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  const auto lookup = [&](int32_t a, int32_t b) -> const MergeValue* {
    auto it = merges_.find((uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  heap_storage.clear();
  std::priority_queue<Candidate, std::vector<Candidate>> heap(std::less<Candidate>(),
                                                              std::move(heap_storage));
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const MergeValue* m = lookup(sym[i], sym[i + 1])) {
      heap.push({m->rank, static_cast<uint32_t>(i), m->merged});
    }
  }
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const int32_t p = static_cast<int32_t>(top.pos);
    if (sym[p] < 0 || next[p] < 0) continue;  // merged away, or the last symbol
    const int32_t q = next[p];
    const MergeValue* m = lookup(sym[p], sym[q]);
    if (m == nullptr || m->merged != top.merged) continue;
    sym[p] = top.merged;
    sym[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    if (prev[p] >= 0) {
      if (const MergeValue* mp = lookup(sym[prev[p]], sym[p])) {
        heap.push({mp->rank, static_cast<uint32_t>(prev[p]), mp->merged});
      }
    }
    if (next[p] >= 0) {
      if (const MergeValue* mn = lookup(sym[p], sym[next[p]])) {
        heap.push({mn->rank, static_cast<uint32_t>(p), mn->merged});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i]) ids->push_back(sym[i]);
  if (sym.capacity() > kKeptScratch) {
    std::vector<int32_t>().swap(sym);
    std::vector<int32_t>().swap(prev);
    std::vector<int32_t>().swap(next);
  }
}

bool Tokenizer::EncodePlain(std::string_view text, std::vector<int32_t>* ids, size_t limit) const {
  if (ids->size() + text.size() / max_token_bytes_ > limit) return false;
  thread_local std::vector<ByteSpan> spans;
  spans.clear();
  Glm45PreTokenize(text, &spans);
  bool within = true;
  for (const ByteSpan& s : spans) {
    const std::string_view word = text.substr(s.begin, s.end - s.begin);
    if (ids->size() + word.size() / max_token_bytes_ > limit) {
      within = false;
      break;
    }
    EncodeWord(word, ids);
    if (ids->size() > limit) {
      within = false;
      break;
    }
  }
  // A huge text's scratch is not kept by the thread for ever.
  if (spans.capacity() > kKeptScratch) std::vector<ByteSpan>().swap(spans);
  return within;
}

bool Tokenizer::SplitAdded(std::string_view text, bool normalized_pass, std::vector<int32_t>* ids,
                           size_t limit) const {
  const bool* first = added_first_byte_[normalized_pass];
  size_t plain_begin = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!first[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : added_) {  // longest first: the first hit is the longest
      if (a.normalized == normalized_pass && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    std::string_view plain = text.substr(plain_begin, i - plain_begin);
    if (!plain.empty()) {
      const bool within = !normalized_pass && has_added_[1] ? SplitAdded(plain, true, ids, limit)
                                                            : EncodePlain(plain, ids, limit);
      if (!within) return false;
    }
    ids->push_back(hit->id);
    if (ids->size() > limit) return false;
    i += hit->content.size();
    plain_begin = i;
  }
  std::string_view rest = text.substr(plain_begin);
  if (rest.empty()) return true;
  return !normalized_pass && has_added_[1] ? SplitAdded(rest, true, ids, limit)
                                           : EncodePlain(rest, ids, limit);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       size_t max_tokens) const {
  if (text.size() > limits_.max_input_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text of ", text.size(), " bytes, more than the limit ", limits_.max_input_bytes));
  }
  RETURN_IF_ERROR(ValidateUtf8(text, "text"));
  const size_t limit =
      max_tokens == 0 ? limits_.max_tokens : std::min(max_tokens, limits_.max_tokens);
  // The fewest tokens the text could take already pass the limit: refused before any work.
  if (text.size() / max_token_bytes_ > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("text is more than ", limit, " tokens (the limit)"));
  }
  std::vector<int32_t> ids;
  ids.reserve(std::min(text.size() / 3, limit) + 4);
  // Encoded in slices that end at a newline (a pre-token boundary unless inside a run of
  // white space, and added tokens hold no newline in GLM-4.5), so that the token limit stops
  // the work early on huge inputs. Splitting must not change the result: a slice ends just
  // after a newline that is followed by a non-space character, where the regex always splits.
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.size();
    size_t probe = begin + (size_t{64} << 10);
    while (!added_has_newline_ && probe < text.size()) {
      const size_t nl = text.find('\n', probe);
      if (nl == std::string_view::npos || nl + 1 >= text.size()) break;
      const auto c = static_cast<uint8_t>(text[nl + 1]);
      if (c > ' ' && c < 0x80) {
        end = nl + 1;
        break;
      }
      probe = nl + 1;
    }
    if (!SplitAdded(text.substr(begin, end - begin), false, &ids, limit) || ids.size() > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("text is more than ", limit, " tokens (the limit)"));
    }
    begin = end;
  }
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  if (ids.size() > limits_.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " ids, more than the limit ", limits_.max_tokens));
  }
  std::string bytes;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (!HasId(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", id, " at position ", k, " is not a token of this tokenizer"));
    }
    if (skip_special_tokens && tokens_[id].special) continue;
    bytes += tokens_[id].bytes;
  }
  return Utf8Lossy(bytes);
}

}  // namespace glmserve
