# shellcheck shell=bash disable=SC2154  # glm_server, glm_client, python: set by the caller
# Shared by the deployment tests that run glm-server (sourced, bash).
# Requires: glm_server, glm_client, python (set by the caller); sets server_pid, grpc_target,
# metrics_port; cleanup() stops everything started and removes $tmp.

tmp=$(mktemp -d)
server_pid=""
prometheus_pid=""

cleanup() {
  local rc=$?
  set +e
  if [ -n "$prometheus_pid" ]; then kill -TERM "$prometheus_pid" 2>/dev/null; wait "$prometheus_pid" 2>/dev/null; fi
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for log in "$tmp"/*.log; do
      [ -f "$log" ] && { echo "---- $(basename "$log") (last 30 lines)"; tail -n 30 "$log"; }
    done
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server: glm-server --model=tiny on loopback, gRPC and metrics on ports the kernel picks;
# waits until it is ready (health service "readiness").
start_server() {
  "$glm_server" --model=tiny --address=127.0.0.1 --port=0 --metrics_port=0 >"$tmp/server.log" 2>&1 &
  server_pid=$!
  local line=""
  for _ in $(seq 1 300); do
    line=$(grep -m1 '^glm-server: listening on' "$tmp/server.log" || true)
    [ -n "$line" ] && break
    kill -0 "$server_pid" 2>/dev/null || fail "glm-server exited"
    sleep 0.1
  done
  [ -n "$line" ] || fail "glm-server did not report its ports"
  grpc_target=$(sed -n 's/^glm-server: listening on \([^,]*\),.*/\1/p' <<<"$line")
  metrics_port=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' <<<"$line")
  if [ -z "$grpc_target" ] || [ -z "$metrics_port" ]; then fail "cannot parse: $line"; fi
  timeout 90 "$glm_client" --target="$grpc_target" --service=readiness --wait=60s health >/dev/null ||
    fail "glm-server did not turn ready"
  echo "glm-server: gRPC $grpc_target, metrics 127.0.0.1:$metrics_port"
}

# client ARGS...: glm-client against the test server, bounded in time.
client() {
  timeout 60 "$glm_client" --target="$grpc_target" "$@"
}
