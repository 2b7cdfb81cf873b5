#!/usr/bin/env bash
# Development check of docs/python/generate.py (not run by CI, which has no PyPI): creates a
# virtual environment with grpcio and grpcio-tools, generates the Python stubs from proto/,
# starts glm-server on the tiny model and checks that the Python client's greedy tokens equal
# glm-client's.   tools/python_example.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q grpcio grpcio-tools
mkdir -p "$work/gen"
"$work/venv/bin/python" -m grpc_tools.protoc -I proto --python_out="$work/gen" \
  --grpc_python_out="$work/gen" proto/glmserve/v1/glmserve.proto

"$build/server/glm-server" --model=tiny --port=0 --metrics_port=-1 >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do grep -q "ready" "$work/server.log" && break; sleep 0.1; done
target=$(sed -n 's/^glm-server: listening on \([^,]*\).*/\1/p' "$work/server.log")
out=$(PYTHONPATH="$work/gen" "$work/venv/bin/python" docs/python/generate.py \
  --target="$target" --prompt=11,22,33 --max_new_tokens=8)
echo "$out"
want=$("$build/client/glm-client" --target="$target" --json --prompt=11,22,33 \
  --max_new_tokens=8 --ignore_eos generate | python3 -c \
  'import json,sys; print(" ".join(str(t["token_id"]) for t in json.load(sys.stdin)["tokens"]))')
grep -qx "tokens $want" <<<"$out" || { echo "FAIL: Python tokens differ from glm-client's ($want)"; exit 1; }
echo "python example: same tokens as glm-client"
