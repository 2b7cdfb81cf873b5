// Greedy continuation of a prompt of token ids with llama.cpp, printed as ids: the llama.cpp
// side of tools/compare_llamacpp.sh's conversion check (glm-run prints the same for
// glmserve). Built by that script against llama.cpp's library (not part of the CMake build).
//   llama_greedy MODEL.gguf 151331,151333,9703 16 [threads]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf ID,ID,... NEW_TOKENS [THREADS]\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> prompt;
  std::stringstream ids(argv[2]);
  for (std::string id; std::getline(ids, id, ',');) prompt.push_back(std::atoi(id.c_str()));
  const int new_tokens = std::atoi(argv[3]);
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  if (prompt.empty() || new_tokens <= 0 || threads <= 0) return 2;

  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (model == nullptr) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(prompt.size() + new_tokens + 8);
  cp.n_batch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  std::vector<llama_token> out;
  llama_batch batch = llama_batch_get_one(prompt.data(), static_cast<int32_t>(prompt.size()));
  llama_token next = 0;
  for (int step = 0; step < new_tokens; ++step) {
    if (llama_decode(ctx, batch) != 0) return 1;
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int v = 1; v < vocab; ++v) best = logits[v] > logits[best] ? v : best;
    next = best;
    out.push_back(next);
    batch = llama_batch_get_one(&next, 1);
  }
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
