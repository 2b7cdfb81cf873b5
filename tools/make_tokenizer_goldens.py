#!/usr/bin/env python3
"""Tokenizer golden fixtures for core/text (run by hand, never in CI).

The real GLM-4.5 tokenizer.json cannot be downloaded here, so this script builds one with the
same structure using Hugging Face `tokenizers` itself: byte-level BPE (ignore_merges, no unk,
no byte fallback), GLM-4.5's Split pre-tokenizer regex followed by ByteLevel(use_regex=False),
the ByteLevel decoder, and GLM-4.5's added tokens (special up to <|end_of_transcription|>,
non-special from <|code_prefix|> on), trained on public-domain / free text found locally
(Debian's common-licenses, gettext catalogs, Python sources). It then writes a corpus of
strings with the ids and decodes that `tokenizers` produces, for tests/core/text.

    python3 -m venv /tmp/gvenv && /tmp/gvenv/bin/pip install -r tools/requirements-goldens.txt
    /tmp/gvenv/bin/python tools/make_tokenizer_goldens.py [--out tests/golden/tokenizer]
                                                      [--bench_corpus /tmp/bench.txt]

Outputs (OUT/):
  glm45_small/tokenizer.json, tokenizer_config.json, generation_config.json
  encode.jsonl   one case a line: {"t": text, "ids": [...]} ; {"d": decode} only where the
                 decode differs from t; {"ds": decode with skip_special_tokens} likewise
  decode.jsonl   {"ids": [...], "d": decode, "ds": decode skipping special tokens}
  invalid_utf8.jsonl {"hex": bytes}: inputs `tokenizers` cannot take (a Python str is always
                 valid Unicode); glmserve refuses them with InvalidArgument.
With --bench_corpus, also writes the benchmark text and prints HF's single-threaded encode
throughput on it (recorded in docs/performance.md).
"""
import argparse
import gettext
import glob
import gzip
import json
import os
import random
import sys
import time

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# GLM-4.5's pre-tokenizer regex (tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex).
GLM45_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GLM-4.5's added tokens in id order (they follow the BPE vocabulary). The first 18 are
# special (skipped by skip_special_tokens); the rest are ordinary added tokens.
SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
           "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
           "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|begin_of_audio|>",
           "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>"]
NON_SPECIAL = ["<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>",
               "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
               "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>",
               "<|end_of_box|>", "<|image|>", "<|video|>"]
ADDED = SPECIAL + NON_SPECIAL


def read_text(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read().decode("utf-8", "ignore")
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "ignore")
    except OSError:
        return ""


def gettext_strings(lang, limit):
    """Translated messages (msgstr) from the gettext catalogs Debian installs."""
    out = []
    for mo in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
        try:
            with open(mo, "rb") as f:
                cat = gettext.GNUTranslations(f)
        except Exception:  # a catalog in a format the module does not read: skip it
            continue
        for v in cat._catalog.values():  # pylint: disable=protected-access
            if isinstance(v, str) and v.strip():
                out.append(v)
        if len(out) >= limit:
            break
    return out[:limit]


def training_texts():
    texts = [read_text(p) for p in sorted(glob.glob("/usr/share/common-licenses/*"))]
    py = sorted(glob.glob("/usr/lib/python3*/json/*.py") + glob.glob("/usr/lib/python3*/email/*.py"))
    texts += [read_text(p) for p in py[:60]]
    for lang in ("zh_CN", "zh_TW", "ja", "ko", "ru", "de", "fr", "ar", "hi", "el"):
        texts += gettext_strings(lang, 4000)
    return texts


def build_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM45_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(training_texts(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL])
    return tok


# ---- corpus -------------------------------------------------------------------------------

WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u0085", "\u2028",
      "\u2029", "\u000b", "\u000c", "\u1680", "\u2003", "\u202f", "\u205f", "\u200b", "\u180e",
      "\u001c", "\u001f"]
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "❤️", "🤖", "🧪", "𝐀𝐁𝐂", "𝔘𝔫𝔦", "𠀀𠀁",
         "𝟘𝟙𝟚", "🎵", "𓀀", "🀄", "\U0010FFFD", "\U000E0041"]
CODE = ["int main(int argc, char** argv) {\n  return 0;\n}", "for (auto& x : xs) sum += x;",
        "def f(a, b=2):\n    return a ** b  # power", "if x != y && z >= 3 { println!(\"{}\", x); }",
        "SELECT id, name FROM users WHERE age > 30;", "const f = (a) => a?.b ?? 'c';",
        "#include <vector>\n", "    \t\tindented();\n\n\n", "x=1;y=2;z=x+y", "<div class=\"a\">hi</div>",
        "a_b_c = {'k': [1, 2, 3]}", "std::vector<std::string> v{\"a\", \"b\"};", "$ ls -la | grep foo",
        "// comment ...\n/* block */", "0x7fffffff + 1e-10 - 3.14159", "λx.λy.x y", "→ ⇒ ∀x∈ℝ"]
CONTRACTIONS = ["it's", "IT'S", "we're", "WE'RE", "they've", "I'm", "you'll", "he'd", "'s", "'S",
                "'ſ", "don't", "O'Neil", "rock'n'roll", "''", "' s", "'", "’s", "'LL", "'Ll", "'dd"]
NUMBERS = ["1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "٣٤٥",
           "१२३४", "½", "²³", "Ⅻ", "１２３４", "〇一二", "①②③", "2026-12-01", "0000", "9" * 40]


def rand_codepoint(rng):
    while True:
        r = rng.random()
        if r < 0.4:
            cp = rng.randrange(0x20, 0x250)
        elif r < 0.7:
            cp = rng.randrange(0x250, 0x3000)
        elif r < 0.85:
            cp = rng.randrange(0x3000, 0x10000)
        else:
            cp = rng.randrange(0x10000, 0x110000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def make_corpus(rng, words, cjk, code_lines):
    cases = []

    def add(s):
        if s is not None:
            cases.append(s)

    for _ in range(2000):  # English-ish sentences from the licenses
        n = rng.randrange(1, 25)
        i = rng.randrange(0, max(1, len(words) - n))
        add(" ".join(words[i:i + n]))
    for _ in range(1500):  # Chinese, Japanese, Korean, ... translations
        add(rng.choice(cjk))
    for _ in range(800):
        add(rng.choice(code_lines) if code_lines and rng.random() < 0.7 else rng.choice(CODE))
    for _ in range(600):
        add("".join(rng.choice(EMOJI + [" ", "a", "字"]) for _ in range(rng.randrange(1, 10))))
    for _ in range(800):  # whitespace runs, with and without words around them
        parts = []
        for _ in range(rng.randrange(1, 8)):
            parts.append("".join(rng.choice(WS) for _ in range(rng.randrange(1, 12))))
            if rng.random() < 0.6:
                parts.append(rng.choice(words + ["x", "7", "!", "字"]))
        add("".join(parts))
    for _ in range(700):  # digits
        add(" ".join(rng.choice(NUMBERS + [str(rng.randrange(10**rng.randrange(1, 12)))])
                     for _ in range(rng.randrange(1, 5))))
    for _ in range(600):  # contractions
        add(rng.choice(words) + rng.choice(CONTRACTIONS) + rng.choice(["", " ", "s", "ve", "!"]))
    for _ in range(1000):  # mixed scripts
        pool = [rng.choice(words), rng.choice(cjk)[:12], rng.choice(EMOJI), rng.choice(NUMBERS),
                rng.choice(WS), rng.choice(CONTRACTIONS), rng.choice(CODE)[:10]]
        add("".join(rng.choice(pool) for _ in range(rng.randrange(2, 9))))
    for _ in range(1000):  # added tokens inside text, whole and broken
        pieces = []
        for _ in range(rng.randrange(1, 7)):
            r = rng.random()
            if r < 0.4:
                pieces.append(rng.choice(ADDED))
            elif r < 0.5:
                t = rng.choice(ADDED)
                pieces.append(t[:rng.randrange(1, len(t))])
            else:
                pieces.append(rng.choice(words + [" ", "\n", "字", "x"]))
        add("".join(pieces))
    for _ in range(1200):  # random code points from every plane
        add("".join(rand_codepoint(rng) for _ in range(rng.randrange(1, 16))))
    add("")
    add(" " * 300)
    add("\n" * 50 + "a")
    add(("word " * 400).strip())
    return cases


def invalid_utf8_cases(rng):
    fixed = [b"\xff", b"\xc0\xaf", b"abc\x80def", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
             b"\xf0\x9f\x98", b"\xc3", b"ok \xfe ok", b"\xe0\x80\xaf"]
    out = list(fixed)
    for _ in range(190):
        b = bytearray("héllo 字 😀".encode())
        pos = rng.randrange(len(b) + 1)
        b[pos:pos] = bytes([rng.choice([0x80, 0xbf, 0xc0, 0xc1, 0xf5, 0xff, 0xe0, 0xf0])])
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            out.append(bytes(b))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "golden",
                                                  "tokenizer"))
    ap.add_argument("--vocab_size", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--bench_corpus", default="")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    tok = build_tokenizer(args.vocab_size)
    tdir = os.path.join(args.out, "glm45_small")
    os.makedirs(tdir, exist_ok=True)
    tok.save(os.path.join(tdir, "tokenizer.json"))
    # Reload what was written, so that the goldens come from the file the C++ side reads.
    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    # GLM-4.5's chat template (tests/golden/chat, see tools/make_chat_goldens.py) rides along,
    # as in the real checkpoint's tokenizer_config.json.
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                           "chat", "glm45_chat_template.jinja")) as f:
        chat_template = f.read()
    with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
                   "model_max_length": 128000, "do_lower_case": False,
                   "chat_template": chat_template}, f, indent=2, ensure_ascii=False)
    ids_of = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")}
    with open(os.path.join(tdir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [ids_of["<|endoftext|>"], ids_of["<|user|>"],
                                    ids_of["<|observation|>"]],
                   "pad_token_id": ids_of["<|endoftext|>"]}, f, indent=2)

    words = " ".join(read_text(p) for p in sorted(glob.glob("/usr/share/common-licenses/*"))).split()
    cjk = [s for lang in ("zh_CN", "ja", "ko", "zh_TW") for s in gettext_strings(lang, 3000)]
    code_lines = [l for p in sorted(glob.glob("/usr/include/*.h"))[:40]
                  for l in read_text(p).splitlines() if l.strip()]
    cases = make_corpus(rng, words, cjk, code_lines)

    with open(os.path.join(args.out, "encode.jsonl"), "w", encoding="utf-8") as f:
        for s in cases:
            ids = tok.encode(s, add_special_tokens=False).ids
            rec = {"t": s, "ids": ids}
            d = tok.decode(ids, skip_special_tokens=False)
            ds = tok.decode(ids, skip_special_tokens=True)
            if d != s:
                rec["d"] = d
            if ds != d:
                rec["ds"] = ds
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    n_ids = tok.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(args.out, "decode.jsonl"), "w", encoding="utf-8") as f:
        for _ in range(2000):
            ids = [rng.randrange(n_ids) if rng.random() < 0.8 else rng.randrange(256)
                   for _ in range(rng.randrange(1, 12))]
            f.write(json.dumps({"ids": ids, "d": tok.decode(ids, skip_special_tokens=False),
                                "ds": tok.decode(ids, skip_special_tokens=True)},
                               ensure_ascii=False) + "\n")
    with open(os.path.join(args.out, "invalid_utf8.jsonl"), "w") as f:
        for b in invalid_utf8_cases(rng):
            f.write(json.dumps({"hex": b.hex()}) + "\n")
    print(f"{len(cases)} encode cases, vocab {n_ids}", file=sys.stderr)

    if args.bench_corpus:
        # The benchmark text: the corpus strings joined by newlines, repeated to ~8 MB.
        text = "\n".join(cases)
        text = (text + "\n") * max(1, (8 << 20) // max(1, len(text.encode())))
        with open(args.bench_corpus, "w", encoding="utf-8") as f:
            f.write(text)
        lines = text.split("\n")
        chunks, b, raw = [], 0, text.encode()
        while b < len(raw):  # ~1 MB newline-aligned chunks, as bench/tokenizer_bench.cc cuts
            e = min(len(raw), b + (1 << 20))
            nl = raw.find(b"\n", e)
            e = len(raw) if nl < 0 else nl + 1
            chunks.append(raw[b:e].decode())
            b = e
        # encode() of one string runs on one thread (RAYON only parallelizes batches).
        for name, pieces in (("lines", lines), ("chunks", chunks)):
            best, tokens = 0.0, 0
            for _ in range(3):
                t0 = time.perf_counter()
                tokens = sum(len(tok.encode(p, add_special_tokens=False).ids) for p in pieces)
                best = max(best, len(raw) / (time.perf_counter() - t0) / 1e6)
            print(f"HF tokenizers encode ({name}, 1 thread): {best:.2f} MB/s, {tokens} tokens, "
                  f"{len(raw) / 1e6:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
