#!/usr/bin/env python3
"""Checks that the dashboard, the alert rules, the HPA and the adapter rules query only what
glm-server exports, and that the dashboard has every panel the operations guide promises.

    check_queries.py --root REPO --exposition FILE      # FILE: a scrape of a running glm-server

- every metric name in every PromQL expression (dashboard targets and template variables,
  alert rules, adapter rules, the HPA's metric) is a sample name of the exposition (histograms
  as _bucket/_sum/_count, counters with _total), or `up`, which Prometheus adds;
- every glmserve_* family the server exports appears in the dashboard;
- the dashboard has the panels of docs/operations.md: request rate and errors by code, TTFT,
  inter-token, end-to-end and queue latency percentiles, running and waiting requests, KV cache
  usage, batch tokens per step, step time by phase, tokens/s, preemptions, prefix cache hit
  rate; every panel uses the ${datasource} variable.
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402
import yaml  # noqa: E402

# What a panel must query for each promised topic: (description, regex over one expression).
REQUIRED_PANELS = [
    ("request rate by code", r"rate\(glmserve_requests_total\{.*\}\[.*by \([^)]*\bcode\b|by \([^)]*\bcode\b[^)]*\) \(rate\(glmserve_requests_total"),
    ("errors by code", r'glmserve_requests_total\{[^}]*code!="OK"'),
    ("TTFT percentiles", r"histogram_quantile\(0\.\d+, .*glmserve_time_to_first_token_seconds_bucket"),
    ("inter-token percentiles", r"histogram_quantile\(0\.\d+, .*glmserve_inter_token_latency_seconds_bucket"),
    ("end-to-end percentiles", r"histogram_quantile\(0\.\d+, .*glmserve_request_duration_seconds_bucket"),
    ("queue time percentiles", r"histogram_quantile\(0\.\d+, .*glmserve_queue_duration_seconds_bucket"),
    ("running requests", r"glmserve_requests_running"),
    ("waiting requests", r"glmserve_requests_waiting"),
    ("KV cache usage", r"glmserve_kv_cache_usage_ratio"),
    ("batch tokens per step", r"glmserve_batch_tokens_(sum|bucket)"),
    ("step time by phase", r"by \([^)]*\bphase\b[^)]*\) \(rate\(glmserve_step_duration_seconds_(sum|bucket)"),
    ("tokens/s", r"rate\(glmserve_generation_tokens_total"),
    ("preemptions", r"rate\(glmserve_preemptions_total"),
    ("prefix cache hit rate", r"rate\(glmserve_prefix_cache_hit_tokens_total.*\) / .*rate\(glmserve_prefix_cache_query_tokens_total"),
]

PROMETHEUS_SYNTHETIC = {"up"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--exposition", required=True)
    a = ap.parse_args()
    deploy = os.path.join(a.root, "deploy")
    f = dl.Failures()
    samples, families = dl.exposition_names(open(a.exposition).read())
    f.check(any(n.startswith("glmserve_") for n in samples), "the exposition has no glmserve_ samples")
    known = samples | PROMETHEUS_SYNTHETIC

    exprs = []  # (where, expr)
    dash, queries = dl.dashboard_queries(os.path.join(deploy, "grafana/glmserve.json"))
    exprs += [(f"dashboard panel '{t}'", e) for t, e in queries]
    for r in dl.alert_rules(os.path.join(deploy, "prometheus/alerts.yaml")):
        exprs.append((f"alert {r['alert']}", r["expr"]))
    with open(os.path.join(deploy, "prometheus/prometheus-adapter-rules.yaml")) as fh:
        for rule in yaml.safe_load(fh)["rules"]:
            exprs.append(("adapter seriesQuery", rule["seriesQuery"]))
            exprs.append(("adapter name", rule["name"]["as"]))
    with open(os.path.join(deploy, "components/autoscaling/hpa.yaml")) as fh:
        for m in yaml.safe_load(fh)["spec"]["metrics"]:
            if m["type"] == "Pods":
                exprs.append(("HPA metric", m["pods"]["metric"]["name"]))

    used = set()
    for where, expr in exprs:
        names = dl.metric_names(dl.substitute_grafana(expr))
        f.check(bool(names), f"{where}: no metric name found in {expr!r}")
        for n in names:
            used.add(n)
            f.check(n in known, f"{where}: {n} is not exported by glm-server (expression: {expr})")

    # every glmserve family is on the dashboard
    dash_names = set()
    for _, e in queries:
        dash_names |= dl.metric_names(dl.substitute_grafana(e))
    for fam, kind in sorted(families.items()):
        if not fam.startswith("glmserve_"):
            continue
        forms = {fam} if kind != "histogram" else {fam + s for s in ("_bucket", "_sum", "_count")}
        f.check(bool(forms & dash_names), f"dashboard: no panel shows {fam} ({kind})")

    # the promised panels
    flat = [(t, re.sub(r"\s+", " ", e)) for t, e in queries]
    for topic, rx in REQUIRED_PANELS:
        hits = [t for t, e in flat if re.search(rx, e)]
        f.check(bool(hits), f"dashboard: no panel for {topic} (/{rx}/)")

    # data source and ids
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p.get("id"))
            if p.get("type") != "row":
                f.check(p.get("datasource", {}).get("uid") == "${datasource}",
                        f"dashboard panel '{p.get('title')}' must use the ${{datasource}} variable")
                for t in p.get("targets", []):
                    f.check(t.get("datasource", {}).get("uid") == "${datasource}",
                            f"dashboard panel '{p.get('title')}' target must use the ${{datasource}} variable")
            walk(p.get("panels", []))
    walk(dash["panels"])
    f.check(len(ids) == len(set(ids)), "dashboard: panel ids must be unique")
    f.check(any(v.get("type") == "datasource" and v.get("name") == "datasource" for v in dash["templating"]["list"]),
            "dashboard: needs a 'datasource' template variable")
    f.check(bool(dash.get("uid")), "dashboard: needs a uid")
    print(f"metric names used: {', '.join(sorted(used))}")
    return f.finish("check_queries")


if __name__ == "__main__":
    sys.exit(main())
