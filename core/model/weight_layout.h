// The list of Hugging Face tensors that make up a span of the model, each tied to the field of
// ModelWeights it fills. The checkpoint loader, the random-weight generator and the checkpoint
// writer all walk this one list, so they cannot disagree about names, shapes or structure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/weights.h"

namespace glmserve {

// How RandomWeights initialises a tensor (HF-like: matrices normal, gains one, biases zero).
enum class ParamInit : uint8_t { kNormal, kOnes, kZeros };

// Which matrix of a routed expert a slot is; the fused checkpoint form stores them per layer.
enum class ExpertPart : uint8_t { kNone, kGate, kUp, kDown };

struct WeightSlot {
  std::string name;                      // HF name; routed experts in their per-expert form
  std::vector<int64_t> shape;            // expected shape
  Matrix* matrix = nullptr;              // 2-D weights, kept in stored dtype
  std::vector<float>* vector = nullptr;  // 1-D parameters, widened to fp32
  ParamInit init = ParamInit::kNormal;
  int64_t layer = -1;   // model layer index, -1 outside the layer stack
  int64_t expert = -1;  // routed expert index, -1 otherwise
  ExpertPart part = ExpertPart::kNone;
  // A linear layer's matrix that weight quantization converts (core/cpu/quantize.h): GLM-4.5
  // attention's q/k/v/o, every FFN (dense, routed and shared experts) and the head; not the
  // embedding, the router or GLM-5's latent attention. ModelWeights::LinearMatrices lists them.
  bool linear = false;
};

// "model.layers.<layer>."
std::string LayerPrefix(int64_t layer);

// Sets config and span on `w` and sizes its layers and expert lists for [begin, end); the
// span must already be validated. Matrices and vectors are left empty.
void PrepareWeights(const ModelConfig& config, int64_t begin, int64_t end, ModelWeights* w);

// Adds the MTP layer to prepared whole-model weights (docs/mtp.md): ListWeightSlots then lists
// its tensors (shared_head.head only when w->mtp_head_stored).
void PrepareMtp(ModelWeights* w);
// The MTP layer's FFN form: MoE unless the model's layers are all dense.
bool MtpLayerIsMoe(const ModelConfig& config);

// Every tensor the prepared span `w` holds, pointing into `w` (which must not move while the
// slots are used). When the head is tied to the embedding it is not a slot of its own: the
// model.embed_tokens.weight slot fills embed_tokens (begin == 0) or lm_head (begin > 0), and
// FinishWeights makes lm_head the view of the embedding; unless head_stored_despite_tie,
// when lm_head.weight is a slot as for an untied head.
std::vector<WeightSlot> ListWeightSlots(ModelWeights* w);

// After every slot is filled: ties the head, records weight_dtype.
void FinishWeights(ModelWeights* w);

}  // namespace glmserve
