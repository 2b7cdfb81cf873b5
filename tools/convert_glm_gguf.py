#!/usr/bin/env python3
"""llama.cpp's convert_hf_to_gguf.py for a checkpoint that carries the repository's small
GLM-structured tokenizer (models/glm-4.5-mini), run by tools/compare_llamacpp.sh.

The converter names the tokenizer's pre-tokenizer by hashing the token ids of a fixed text,
and knows only the hashes of published tokenizers: the repository's 8,228-token tokenizer has
GLM-4.5's pre-tokenizer (tools/make_default_tokenizer.py builds it with the same split rules)
but other ids, so the hash is unknown and the converter stops. This wrapper answers "glm4"
(GLM-4.5's pre-tokenizer in llama.cpp) for that one tokenizer and leaves every other step to
the converter; the vocabulary is padded to the config's vocab_size by the converter itself
([PADn] tokens for the rows the tokenizer does not use).

    python tools/convert_glm_gguf.py LLAMA_CPP_DIR CHECKPOINT --outtype bf16 --outfile X.gguf
"""
import os
import runpy
import sys


def main():
    llama_cpp_dir = sys.argv[1]
    sys.argv = [os.path.join(llama_cpp_dir, "convert_hf_to_gguf.py")] + sys.argv[2:]
    sys.path.insert(0, llama_cpp_dir)
    sys.path.insert(1, os.path.join(llama_cpp_dir, "gguf-py"))
    from conversion import base  # llama.cpp's converter package

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            added = tokenizer.get_added_vocab()
            # Only the GLM-structured tokenizer: GLM-4.5's special tokens must be there.
            if "[gMASK]" in added and "<|user|>" in added:
                return "glm4"
            raise

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
