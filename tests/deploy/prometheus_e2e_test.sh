#!/usr/bin/env bash
# End to end: a real Prometheus server (Debian's prometheus package) scrapes a running
# glm-server (--model=tiny) on loopback every second, with deploy/prometheus/alerts.yaml
# loaded. After known traffic (3 Generate calls of 4 tokens, 1 rejected call), PromQL through
# Prometheus' HTTP API must return exactly those counts; every alert rule must evaluate without
# error and none may fire; every dashboard query must evaluate without error.
# Usage: prometheus_e2e_test.sh REPO_ROOT GLM_SERVER GLM_CLIENT [PYTHON3]
set -euo pipefail
root=$1 glm_server=$2 glm_client=$3 python=${4:-python3}
for tool in prometheus promtool curl jq; do
  command -v $tool >/dev/null || { echo "SKIP: $tool not installed (tools/install_deps.sh)"; exit 77; }
done
source "$root/tests/deploy/lib.sh"
start_server

# ---- Prometheus: config, then start on a free loopback port (retry if the port was taken)
cat >"$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $root/deploy/prometheus/alerts.yaml
scrape_configs:
  # Named like the Service the ServiceMonitor scrapes, as the alert rules expect.
  - job_name: glmserve
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
YAML
promtool check config "$tmp/prometheus.yml" >/dev/null
prom=""
for attempt in 1 2 3; do
  port=$(free_port)
  prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
  prometheus_pid=$!
  for _ in $(seq 1 300); do
    if curl -fsS --max-time 2 "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; then
      prom="http://127.0.0.1:$port"
      break
    fi
    kill -0 "$prometheus_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$prom" ] && break
  kill -TERM "$prometheus_pid" 2>/dev/null || true
  wait "$prometheus_pid" 2>/dev/null || true
  prometheus_pid=""
  echo "prometheus did not start on port $port (attempt $attempt)"
done
[ -n "$prom" ] || fail "prometheus did not start"
echo "prometheus: $prom"

# query EXPR: the API's JSON answer to an instant query (fails on an HTTP or PromQL error)
query() {
  local out
  out=$(curl -fsS --max-time 5 "$prom/api/v1/query" --data-urlencode "query=$1") || return 1
  [ "$(jq -r .status <<<"$out")" = success ] || return 1
  echo "$out"
}
# scalar EXPR: the single value of an instant query, or "none"
scalar() {
  query "$1" | jq -r 'if (.data.result | length) == 1 then .data.result[0].value[1] else "none" end'
}
# wait_for EXPR VALUE: polls (30 s at most) until EXPR equals VALUE
wait_for() {
  local got=""
  for _ in $(seq 1 60); do
    got=$(scalar "$1" || echo error)
    [ "$got" = "$2" ] && { echo "ok: $1 = $got"; return 0; }
    sleep 0.5
  done
  fail "$1 = $got after 30 s, expected $2"
}

wait_for 'up{job="glmserve"}' 1
# The OK series exist at 0 from the first scrape (created up front by the server).
wait_for 'sum(glmserve_requests_total{job="glmserve", rpc="Generate", code="OK"})' 0

# ---- known traffic
for i in 1 2 3; do
  client --prompt=1,2,$i --max_new_tokens=4 --ignore_eos generate >/dev/null 2>&1 || fail "generate $i failed"
done
if client --prompt=100000 generate >/dev/null 2>&1; then fail "an out-of-vocabulary prompt was accepted"; fi

wait_for 'sum(glmserve_requests_total{job="glmserve", rpc="Generate", code="OK"})' 3
wait_for 'sum(glmserve_requests_total{job="glmserve", rpc="Generate", code="INVALID_ARGUMENT"})' 1
wait_for 'sum(glmserve_requests_total{job="glmserve"})' 4
wait_for 'glmserve_generation_tokens_total{job="glmserve"}' 12
wait_for 'glmserve_prompt_tokens_total{job="glmserve"}' 9
wait_for 'glmserve_time_to_first_token_seconds_count{job="glmserve"}' 3
wait_for 'glmserve_inter_token_latency_seconds_count{job="glmserve"}' 9
wait_for 'sum(glmserve_request_duration_seconds_count{job="glmserve", rpc="Generate"})' 4
wait_for 'glmserve_requests_running{job="glmserve"} + glmserve_requests_waiting{job="glmserve"}' 0
wait_for 'count(glmserve_build_info{job="glmserve", model="tiny", device="cpu"})' 1

# ---- the alert rules: loaded, evaluated without error, none firing
rules_ok=""
expected_rules=$(grep -c '^ *- alert:' "$root/deploy/prometheus/alerts.yaml")
for _ in $(seq 1 40); do
  rules=$(curl -fsS --max-time 5 "$prom/api/v1/rules")
  n=$(jq '[.data.groups[].rules[] | select(.type == "alerting")] | length' <<<"$rules")
  evaluated=$(jq '[.data.groups[].rules[] | select(.type == "alerting" and .health == "ok")] | length' <<<"$rules")
  if [ "$n" -eq "$expected_rules" ] && [ "$evaluated" -eq "$expected_rules" ]; then
    rules_ok=1
    break
  fi
  sleep 0.5
done
[ -n "$rules_ok" ] || fail "alert rules not all evaluated: $(jq -c '[.data.groups[].rules[] | {name, health, lastError}]' <<<"$rules")"
echo "ok: 5 alert rules evaluate without error"
firing=$(curl -fsS --max-time 5 "$prom/api/v1/alerts" | jq -r '[.data.alerts[] | select(.state == "firing") | .labels.alertname] | join(",")')
[ -z "$firing" ] || fail "alerts firing on a healthy server: $firing"
echo "ok: no alert firing"

# ---- every dashboard query evaluates (template variables as "All")
n=0
while IFS= read -r expr; do
  query "$expr" >/dev/null || fail "dashboard query fails in Prometheus: $expr"
  n=$((n + 1))
done < <("$python" "$root/tests/deploy/dashboard_rules.py" "$root/deploy/grafana/glmserve.json" --list)
echo "ok: $n dashboard queries evaluate"
# Rates over the last minute have data (what the request-rate panel shows).
wait_for 'count(rate(glmserve_requests_total{job="glmserve", rpc="Generate", code="OK"}[1m]) > 0)' 1
echo "prometheus_e2e: passed"
