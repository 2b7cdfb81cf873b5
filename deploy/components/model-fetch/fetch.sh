#!/bin/sh
# Fills the model volume from a mirror and verifies it (deploy/components/model-fetch).
#   SOURCE_DIR  the checkpoint as published: config.json, *.safetensors, the index, and
#               SHA256SUMS ("<sha256>  <file>" lines, e.g. from the Hub's LFS hashes)
#   MODEL_DIR   where glm-server reads it (the pods' --model)
# Copies into MODEL_DIR.partial, checks every file SHA256SUMS lists (size and hash) and that
# every shard the index names is there, then renames it into place and writes the marker the
# pods' wait-for-model init container checks. Re-running after success does nothing;
# re-running after a failure starts over. POSIX sh and coreutils only.
set -eu
SOURCE_DIR=${SOURCE_DIR:-/source}
MODEL_DIR=${MODEL_DIR:-/models/model}
MARKER="$MODEL_DIR/.glmserve-verified"
say() { echo "model-fetch: $*"; }

[ -f "$SOURCE_DIR/SHA256SUMS" ] || { say "no $SOURCE_DIR/SHA256SUMS: cannot verify"; exit 1; }
if [ -f "$MARKER" ] && cmp -s "$MARKER" "$SOURCE_DIR/SHA256SUMS"; then
  say "$MODEL_DIR already verified against this SHA256SUMS"
  exit 0
fi
partial="$MODEL_DIR.partial"
rm -rf "$partial"
mkdir -p "$partial"
say "copying $SOURCE_DIR to $partial"
cp -R "$SOURCE_DIR"/. "$partial"/
cd "$partial"
say "verifying $(wc -l < SHA256SUMS) files"
sha256sum -c --quiet SHA256SUMS || { say "checksum mismatch"; exit 1; }
while read -r _ file; do
  [ "$(stat -c %s "$file")" = "$(stat -c %s "$SOURCE_DIR/$file")" ] ||
    { say "$file: size differs from the source"; exit 1; }
done < SHA256SUMS
[ -f config.json ] || { say "no config.json"; exit 1; }
grep -q "config.json" SHA256SUMS || { say "SHA256SUMS does not cover config.json"; exit 1; }
if [ -f model.safetensors.index.json ]; then
  for shard in $(grep -o '"[^"]*\.safetensors"' model.safetensors.index.json | tr -d '"' | sort -u); do
    [ -f "$shard" ] || { say "the index names $shard, which is missing"; exit 1; }
    grep -q "  $shard\$" SHA256SUMS || { say "SHA256SUMS does not cover $shard"; exit 1; }
  done
elif [ ! -f model.safetensors ]; then
  say "neither model.safetensors nor model.safetensors.index.json"
  exit 1
fi
cd /
rm -rf "$MODEL_DIR.old"
[ -e "$MODEL_DIR" ] && mv "$MODEL_DIR" "$MODEL_DIR.old"
mv "$partial" "$MODEL_DIR"
cp "$MODEL_DIR/SHA256SUMS" "$MARKER"
rm -rf "$MODEL_DIR.old"
say "done: $MODEL_DIR verified"
