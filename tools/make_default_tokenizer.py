#!/usr/bin/env python3
"""The tokenizer shipped with the embedded default model (glm-4.5-mini), run by hand.

Same structure as GLM-4.5's (tools/make_tokenizer_goldens.py builds it the same way, with
Hugging Face `tokenizers`): byte-level BPE trained on local free text to 8,192 tokens, then
GLM-4.5's 36 added tokens (ids 8192..8227), GLM-4.5's chat template in tokenizer_config.json
and its three stop tokens in generation_config.json. Every id is below the default model's
151,552 embedding rows; the model's rows above 8,227 have no token (the random-weight model
can sample them: a server using this tokenizer must mask or skip them).

    V/bin/python tools/make_default_tokenizer.py   # writes models/glm-4.5-mini/
"""
import json
import os

import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_goldens as g  # noqa: E402  (the shared builder)

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    out = os.path.join(HERE, "..", "models", "glm-4.5-mini")
    os.makedirs(out, exist_ok=True)
    tok = g.build_tokenizer(8192)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=False))
    with open(os.path.join(HERE, "..", "tests", "golden", "chat", "glm45_chat_template.jinja")) as f:
        template = f.read()
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
                   "model_max_length": 8192, "chat_template": template}, f, indent=2,
                  ensure_ascii=False)
    ids = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": ids, "pad_token_id": ids[0]}, f, indent=2)
    # A few encodings to pin the shipped file against `tokenizers` in the C++ test.
    samples = ["[gMASK]<sop><|user|>\nHello, world! 你好<|assistant|>",
               "The quick brown fox jumps over the lazy dog.", "  x = 12345;\n\n\tcode()",
               "emoji 😀 and <think>thoughts</think>"]
    with open(os.path.join(out, "samples.jsonl"), "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps({"t": s, "ids": tok.encode(s, add_special_tokens=False).ids},
                               ensure_ascii=False) + "\n")
    print(f"vocab {tok.get_vocab_size()} -> {out}")


if __name__ == "__main__":
    main()
