#!/usr/bin/env python3
"""Writes every PromQL expression of the Grafana dashboard (template variables replaced by
values Prometheus accepts) as a recording rule, so that `promtool check rules` parses them;
with --list, one expression per line instead (for querying a Prometheus server):
    dashboard_rules.py DASHBOARD.json > rules.yaml
    dashboard_rules.py DASHBOARD.json --list"""
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402
import yaml  # noqa: E402

_, queries = dl.dashboard_queries(sys.argv[1])
if "--list" in sys.argv[2:]:
    for _, e in queries:
        print(" ".join(dl.substitute_grafana(e).split()))
    sys.exit(0)
rules = [{"record": f"dashboard:query_{i}", "expr": dl.substitute_grafana(e)}
         for i, (_, e) in enumerate(queries)]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sys.stdout, width=1000)
