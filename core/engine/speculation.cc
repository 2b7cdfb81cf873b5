// Speculative decoding with the model's MTP layer (docs/mtp.md), on the engine thread.
//
// Per generation with draft_k > 0, every step:
//  1. The model's step feeds the last token and the sequence's drafts d1..dk (DraftsToVerify
//     sizes them) and returns a logits row and a head input for each.
//  2. VerifyDrafts emits row 0's token as the sampler would without speculation, then row
//     j + 1's while d(j+1) equals the token just emitted: only then was row j + 1's input
//     the real next token, so its logits are those the plain decode would compute (the
//     kernels are batch-invariant) and its sampled token the one it would draw (the random
//     stream is indexed by output position). Greedy or sampled, the output is the output
//     without speculation, token for token and logprob for logprob. Rows after the first
//     mismatch are dropped: `computed` stops before them, so their K/V (the model's and the
//     MTP layer's) are overwritten by the next step, which is the paged cache's rollback.
//  3. RunMtp runs the MTP layer over the pairs (t[i+1], h[i]) now known, one batch for all
//     sequences (a prompt's pairs too, chunk by chunk, filling the layer's own cache), and
//     the last pair's argmax is the first draft; k - 1 chained passes, each on one position
//     per sequence with the previous draft and the MTP layer's own head input, draft the rest.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/engine/engine_impl.h"
#include "core/engine/scoring.h"

namespace glmserve {
namespace {

// Drafts a sequence can still use: a verify step emits up to drafts + 1 tokens, within the
// request's max_new_tokens and the model's context.
int64_t DraftRoom(const Generation& gen, int64_t max_positions) {
  const int64_t tokens = static_cast<int64_t>(gen.tokens.size());
  return std::min<int64_t>({gen.draft_k, gen.request.stop.max_new_tokens - gen.generated - 1,
                            max_positions - tokens - 1});
}

// The id range a request samples from; a draft outside it could never be accepted.
int64_t SampledIds(const Generation& gen, int64_t vocab) {
  return gen.request.sample_vocab_limit > 0 ? gen.request.sample_vocab_limit : vocab;
}

}  // namespace

int64_t Engine::Impl::DraftsToVerify(Sequence* seq, int64_t base, int64_t room) {
  Generation* gen = seq->generation();
  if (gen == nullptr || gen->drafts.empty()) return 0;
  // Drafts follow tokens.back(): only a step that feeds exactly that token verifies them.
  int64_t k = static_cast<int64_t>(gen->drafts.size());
  if (base != 1 || seq->computed + 1 != seq->total_inputs()) k = 0;
  k = std::max<int64_t>(
      0, std::min({k, room, DraftRoom(*gen, model_->config().max_position_embeddings)}));
  if (k > 0) {
    // Blocks for the drafts' positions only where free: speculation never preempts anyone.
    BlockTable& table = seq->blocks();
    const int64_t first = seq->base_position + seq->computed + 1;  // the first draft's position
    const int64_t needed =
        BlocksFor(first + k, options_.block_size) - static_cast<int64_t>(table.size());
    if (needed > 0 && (!prefix_.EnsureFree(needed) || !cache_->Reserve(&table, first + k).ok())) {
      k = std::max<int64_t>(0, static_cast<int64_t>(table.size()) * options_.block_size - first);
    }
  }
  gen->drafts.resize(static_cast<size_t>(k));
  return k;
}

int64_t Engine::Impl::VerifyDrafts(Sequence* seq, const float* logits, int64_t rows) {
  Generation& gen = *seq->generation();
  const int64_t vocab = model_->config().vocab_size;
  int64_t valid = 1;  // row 0's input, tokens.back(), is always right
  int64_t accepted = 0;
  for (int64_t j = 0; j < rows; ++j) {
    SampledToken sampled;
    const bool finite = SampleOne(*seq, logits + j * vocab, nullptr, &sampled);
    const int32_t token = sampled.token;
    AfterGenerateStep(seq, std::move(sampled), finite);
    if (seq->finished || j + 1 == rows || gen.drafts[static_cast<size_t>(j)] != token) break;
    // Draft j was the token emitted: row j + 1 is the plain decode's next step.
    ++accepted;
    ++valid;
    ++seq->computed;
  }
  spec_draft_tokens_ += rows - 1;
  spec_accepted_tokens_ += accepted;
  ++spec_verify_steps_;
  ++spec_acceptance_lengths_[static_cast<size_t>(accepted + 1)];
  gen.drafts.clear();
  return valid;
}

void Engine::Impl::KeepHeadInputs(Sequence* seq, const float* head_input, int64_t valid) {
  Generation& gen = *seq->generation();
  if (gen.draft_k == 0 || head_input == nullptr) return;
  const int64_t hidden = model_->config().hidden_size;
  gen.mtp_hidden.insert(gen.mtp_hidden.end(), head_input, head_input + valid * hidden);
}

void Engine::Impl::RunMtp(const std::vector<Sequence*>& selected, StepReport* report) {
  if (options_.mtp_draft_tokens == 0) return;  // the engine runs no MTP layer
  if (PauseDrafting(selected)) return;
  std::vector<MtpDrafting> drafting;
  if (!MtpFirstPass(selected, report, &drafting)) return;
  MtpChainedPasses(std::move(drafting), report);
}

bool Engine::Impl::PauseDrafting(const std::vector<Sequence*>& selected) {
  // A busy step (more decoding sequences than mtp_max_batch) drafts nothing and skips the
  // layer: the pending pairs are dropped, their MTP cache rows left as they are.
  int64_t decoding = 0;
  for (Sequence* seq : selected) {
    const Generation* gen = seq->generation();
    if (gen != nullptr && !seq->finished &&
        seq->computed + 1 == static_cast<int64_t>(gen->tokens.size())) {
      ++decoding;
    }
  }
  if (options_.mtp_max_batch <= 0 || decoding <= options_.mtp_max_batch) return false;
  for (Sequence* seq : selected) {
    Generation* gen = seq->generation();
    if (gen == nullptr || seq->finished || gen->draft_k == 0) continue;
    gen->mtp_computed = seq->computed;
    gen->mtp_hidden.clear();
  }
  return true;
}

bool Engine::Impl::MtpFirstPass(const std::vector<Sequence*>& selected, StepReport* report,
                                std::vector<MtpDrafting>* drafting) {
  const ModelConfig& c = model_->config();
  const int64_t hidden = c.hidden_size;
  // Every pending pair (t[i+1], h[i]), i in [mtp_computed, min(computed, tokens - 1)).
  std::vector<Sequence*> passed;
  std::vector<int64_t> pairs_of;
  std::vector<int32_t> ids;
  std::vector<float> hs;
  ForwardBatch batch;
  ForwardOptions options;
  options.mtp = true;
  for (Sequence* seq : selected) {
    Generation* gen = seq->generation();
    if (gen == nullptr || seq->finished || gen->draft_k == 0) continue;
    const int64_t last = static_cast<int64_t>(gen->tokens.size()) - 1;
    const int64_t end = std::min(seq->computed, last);
    const int64_t pairs = end - gen->mtp_computed;
    if (pairs <= 0 || static_cast<int64_t>(gen->mtp_hidden.size()) < pairs * hidden) continue;
    const int64_t room = end == last ? DraftRoom(*gen, c.max_position_embeddings) : 0;
    batch.sequences.push_back({pairs, seq->base_position + gen->mtp_computed, &seq->blocks()});
    ids.insert(ids.end(), gen->tokens.begin() + gen->mtp_computed + 1,
               gen->tokens.begin() + end + 1);
    hs.insert(hs.end(), gen->mtp_hidden.begin(), gen->mtp_hidden.begin() + pairs * hidden);
    options.sequence_logits.push_back(room > 0 ? LogitsRows::kLast : LogitsRows::kNone);
    options.return_head_input |= room > 1;
    passed.push_back(seq);
    pairs_of.push_back(pairs);
  }
  if (passed.empty()) return false;
  batch.token_ids = ids;
  batch.hidden_in = hs;
  ForwardResult& result = mtp_result_;
  absl::Status status = model_->Forward(batch, cache_.get(), options, &result);
  report->mtp_tokens += batch.total_tokens();
  int64_t row = 0, logits_row = 0;
  for (size_t i = 0; i < passed.size(); ++i) {
    Sequence* seq = passed[i];
    Generation& gen = *seq->generation();
    const int64_t pairs = pairs_of[i];
    row += pairs;
    if (!status.ok()) continue;
    gen.mtp_computed += pairs;
    gen.mtp_hidden.erase(gen.mtp_hidden.begin(), gen.mtp_hidden.begin() + pairs * hidden);
    if (options.sequence_logits[i] != LogitsRows::kLast) continue;
    const float* logits = result.logits.data() + logits_row++ * c.vocab_size;
    gen.drafts = {ArgMaxRow(logits, SampledIds(gen, c.vocab_size))};
    const int64_t room = DraftRoom(gen, c.max_position_embeddings);
    if (room > 1) {
      const float* h = result.head_input.data() + (row - 1) * hidden;
      drafting->push_back({seq, room, std::vector<float>(h, h + hidden)});
    }
  }
  if (!status.ok()) {
    for (Sequence* seq : passed) {
      Finish(seq, FinishReason::kError,
             absl::InternalError(absl::StrCat("MTP step failed: ", status.message())));
    }
    return false;
  }
  return true;
}

void Engine::Impl::MtpChainedPasses(std::vector<MtpDrafting> drafting, StepReport* report) {
  const ModelConfig& c = model_->config();
  const int64_t hidden = c.hidden_size;
  ForwardResult& result = mtp_result_;
  // Chained passes: one position per sequence, the previous draft and the MTP layer's own
  // head input, at position tokens - 2 + j for draft j + 1 (the cache layer's rows there are
  // provisional: the next pass 1 rewrites them once the tokens are known).
  for (int64_t j = 1; !drafting.empty(); ++j) {
    ForwardBatch chain;
    ForwardOptions chain_options;
    chain_options.mtp = true;
    chain_options.logits = LogitsRows::kLast;
    std::vector<int32_t> chain_ids;
    std::vector<float> chain_hs;
    std::vector<MtpDrafting*> members;
    for (MtpDrafting& d : drafting) {
      Generation& gen = *d.seq->generation();
      const int64_t position =
          d.seq->base_position + static_cast<int64_t>(gen.tokens.size()) - 2 + j;
      BlockTable& table = d.seq->blocks();
      const int64_t needed =
          BlocksFor(position + 1, options_.block_size) - static_cast<int64_t>(table.size());
      if (needed > 0 &&
          (!prefix_.EnsureFree(needed) || !cache_->Reserve(&table, position + 1).ok())) {
        continue;  // no free block for it: fewer drafts
      }
      chain.sequences.push_back({1, position, &table});
      chain_ids.push_back(gen.drafts.back());
      chain_hs.insert(chain_hs.end(), d.chain.begin(), d.chain.end());
      members.push_back(&d);
    }
    if (members.empty()) break;
    chain.token_ids = chain_ids;
    chain.hidden_in = chain_hs;
    chain_options.return_head_input = true;
    const absl::Status status = model_->Forward(chain, cache_.get(), chain_options, &result);
    report->mtp_tokens += chain.total_tokens();
    if (!status.ok()) {
      for (MtpDrafting* d : members) {
        Finish(d->seq, FinishReason::kError,
               absl::InternalError(absl::StrCat("MTP step failed: ", status.message())));
      }
      return;
    }
    std::vector<MtpDrafting> next;
    for (size_t m = 0; m < members.size(); ++m) {
      MtpDrafting& d = *members[m];
      Generation& gen = *d.seq->generation();
      gen.drafts.push_back(
          ArgMaxRow(result.logits.data() + m * c.vocab_size, SampledIds(gen, c.vocab_size)));
      if (static_cast<int64_t>(gen.drafts.size()) < d.room) {
        const float* h = result.head_input.data() + m * hidden;
        next.push_back({d.seq, d.room, std::vector<float>(h, h + hidden)});
      }
    }
    drafting = std::move(next);
  }
}

absl::Status Engine::Impl::CheckSpeculation(const Sequence& seq, const Generation& gen) const {
  const int64_t last = static_cast<int64_t>(gen.tokens.size()) - 1;
  if (!gen.drafts.empty() &&
      (seq.computed != last || static_cast<int64_t>(gen.drafts.size()) > gen.draft_k)) {
    return absl::InternalError("drafts held by a sequence that is not at its last token");
  }
  if (gen.mtp_computed > seq.computed) {
    return absl::InternalError("the MTP layer is ahead of the model");
  }
  const int64_t rows = static_cast<int64_t>(gen.mtp_hidden.size()) / model_->config().hidden_size;
  if (gen.draft_k > 0 && rows != seq.computed - gen.mtp_computed) {
    return absl::InternalError(absl::StrCat("MTP head inputs for ", rows, " positions, but ",
                                            seq.computed - gen.mtp_computed, " wait for it"));
  }
  return absl::OkStatus();
}

}  // namespace glmserve
