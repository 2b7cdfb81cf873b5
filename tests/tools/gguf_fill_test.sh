#!/usr/bin/env bash
# tools/gguf_fill on a hand-made checkpoint and manifest: the rebuilt file must be the skeleton,
# then each record's bytes at its offset (copied, or bf16 widened to fp32), the gaps zero; a
# checkpoint whose header hash differs, a record past the end and an unknown record must be
# refused with a non-zero exit and nothing that looks finished.
#   gguf_fill_test.sh PATH_TO_gguf_fill
set -euo pipefail
fill="$(realpath "$1")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
mkdir ckpt
# A "safetensors" file: 8 header bytes, then data. Only the bytes matter to gguf_fill.
printf 'HDR12345' > ckpt/a.safetensors
printf '\x01\x02\x03\x04\x80\x3f\x00\xc0' >> ckpt/a.safetensors  # 4 raw bytes, then bf16 1.0, -2.0
printf 'SKEL' > skeleton.bin
# FNV-1a 64 of "HDR12345", computed the way gguf_fill does (bash arithmetic wraps at 2^64).
fnv() {
  local s="$1" h=-3750763034362895579 i c
  for ((i = 0; i < ${#s}; i++)); do
    printf -v c '%d' "'${s:i:1}"
    h=$(((h ^ c) * 1099511628211))
  done
  printf '%016x' "$h"
}
hash="$(fnv HDR12345)"
cat > manifest.txt <<M
gguf-fill 1 24
check a.safetensors 8 $hash
copy 4 a.safetensors 8 4
f32 12 a.safetensors 12 4
M
"$fill" skeleton.bin manifest.txt ckpt out.gguf > /dev/null
# SKEL, the 4 copied bytes, a 4-byte gap, 1.0f and -2.0f widened from bf16, a 4-byte tail:
# gaps and tail zero.
expected="$(printf 'SKEL\x01\x02\x03\x04\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x00' | od -An -tx1)"
got="$(od -An -tx1 out.gguf)"
[ "$got" = "$expected" ] || { echo "FAIL: rebuilt bytes"; echo "got      $got"; echo "expected $expected"; exit 1; }

refuse() {  # name manifest-text
  printf '%s\n' "$2" > bad.txt
  if "$fill" skeleton.bin bad.txt ckpt bad.gguf > out.txt 2>&1; then
    echo "FAIL: $1 was accepted"; cat out.txt; exit 1
  fi
  grep -q "gguf_fill:" out.txt || { echo "FAIL: $1: no message"; cat out.txt; exit 1; }
}
refuse "another checkpoint" "$(printf 'gguf-fill 1 24\ncheck a.safetensors 8 0000000000000000')"
refuse "a record past the end" "$(printf 'gguf-fill 1 24\ncopy 22 a.safetensors 8 4')"
refuse "a record inside the skeleton" "$(printf 'gguf-fill 1 24\ncopy 0 a.safetensors 8 4')"
refuse "a short source" "$(printf 'gguf-fill 1 24\ncopy 4 a.safetensors 14 4')"
refuse "an unknown record" "$(printf 'gguf-fill 1 24\nmove 4 a.safetensors 8 4')"
refuse "a missing file" "$(printf 'gguf-fill 1 24\ncopy 4 b.safetensors 8 4')"
refuse "a copy before the size" "copy 4 a.safetensors 8 4"
echo "PASS"
