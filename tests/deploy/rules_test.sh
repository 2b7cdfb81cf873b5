#!/usr/bin/env bash
# promtool on the alert rules and the dashboard's queries (Debian package prometheus):
#   promtool check rules deploy/prometheus/alerts.yaml         syntax, templates
#   promtool test rules deploy/prometheus/alerts_test.yaml     unit tests of every alert
#   promtool check rules <every dashboard expression as a recording rule>
# Usage: rules_test.sh REPO_ROOT [PYTHON3]
set -euo pipefail
root=$1
python=${2:-python3}
command -v promtool >/dev/null || { echo "SKIP: promtool not installed (tools/install_deps.sh installs prometheus)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root/deploy/prometheus"
promtool check rules alerts.yaml
promtool test rules alerts_test.yaml
"$python" "$root/tests/deploy/dashboard_rules.py" "$root/deploy/grafana/glmserve.json" > "$tmp/dashboard.yaml"
promtool check rules "$tmp/dashboard.yaml"
echo "rules_test: alert rules and dashboard queries pass promtool"
