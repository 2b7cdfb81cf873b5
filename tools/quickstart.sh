#!/usr/bin/env bash
# Builds glm-server and glm-client, starts the server with the embedded default model
# (glm-4.5-kjv: GLM-4.5's architecture at 10M parameters, trained on the King James Bible;
# models/glm-4.5-kjv, docs/default_model.md) on a free loopback port, waits until it reports
# ready, sends one chat message through glm-client (text in, GLM-4.5's chat format, text
# streamed out), then stops the server (SIGTERM: a graceful drain).
#   tools/quickstart.sh [extra glm-client chat flags, e.g. --max_new_tokens=64 --thinking=off]
#   MESSAGE="Write a haiku" tools/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
TARGETS="glm-server glm-client" BUILD_DIR="$BUILD_DIR" bash tools/build.sh

log=$(mktemp)
# --port=0: the kernel picks a free port (printed by the server), so that runs never collide.
"$BUILD_DIR"/server/glm-server --address=127.0.0.1 --port=0 --metrics_port=-1 >"$log" 2>&1 &
server_pid=$!
stop_server() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -f "$log"
}
trap stop_server EXIT

target=""
for _ in $(seq 1 300); do
  target=$(sed -n 's/^glm-server: listening on \([^,]*\).*/\1/p' "$log" | head -n 1)
  [ -n "$target" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.1
done
[ -n "$target" ] || { echo "quickstart: glm-server did not start" >&2; cat "$log"; exit 1; }
echo "quickstart: glm-server on $target, loading the model..."

# Readiness (grpc.health.v1, service "readiness"): weights loaded and a warm-up step run.
"$BUILD_DIR"/client/glm-client --target="$target" --service=readiness --wait=600s health
message=${MESSAGE:-"Hello! What can you do?"}
cat <<EOF
quickstart: NOTE: glm-4.5-kjv is a tiny model (10M parameters, GLM-4.5's architecture) trained
quickstart: only on the King James Bible: it answers in that book's English, not with facts.
quickstart: Serve a real checkpoint (glm-server --model=/models/GLM-4.5-Air) for real answers.
quickstart: you> $message
EOF
"$BUILD_DIR"/client/glm-client --target="$target" --max_new_tokens=64 "$@" chat \
  --message="$message"
