#!/usr/bin/env bash
# Scrapes a running glm-server (--model=tiny, loopback) after some traffic, then:
#   promtool check metrics < exposition          (Prometheus' linter on the exposition)
#   check_queries.py --exposition                (the dashboard, alerts, HPA and adapter query
#                                                 only metric names the server exports)
# Usage: metrics_test.sh REPO_ROOT GLM_SERVER GLM_CLIENT [PYTHON3]
set -euo pipefail
root=$1 glm_server=$2 glm_client=$3 python=${4:-python3}
for tool in promtool curl; do
  command -v $tool >/dev/null || { echo "SKIP: $tool not installed (tools/install_deps.sh)"; exit 77; }
done
source "$root/tests/deploy/lib.sh"
start_server

# Traffic through every RPC, so that the labelled series exist and histograms have samples.
client --prompt=1,2,3 --max_new_tokens=4 --ignore_eos generate >/dev/null
client --prompt=1,2,3 --logits --last_only forward >/dev/null
client info >/dev/null
if client --prompt=100000 generate >/dev/null 2>&1; then fail "an out-of-vocabulary prompt was accepted"; fi

curl -fsS --max-time 10 "http://127.0.0.1:$metrics_port/metrics" >"$tmp/exposition.txt"
grep -q '^glmserve_requests_total{api="glmserve",code="INVALID_ARGUMENT",rpc="Generate"} 1' "$tmp/exposition.txt" ||
  fail "the exposition does not count the rejected call"
echo "promtool check metrics:"
promtool check metrics <"$tmp/exposition.txt"
"$python" "$root/tests/deploy/check_queries.py" --root "$root" --exposition "$tmp/exposition.txt"
