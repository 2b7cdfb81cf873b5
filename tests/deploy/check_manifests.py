#!/usr/bin/env python3
"""Checks deploy/'s Kubernetes manifests: every YAML file parses; each overlay (cpu, gpu, and
each with the optional autoscaling component) renders, with this directory's own Kustomize
renderer (deploylib.render) and, where kubectl is installed, with `kubectl kustomize`, whose
output must equal ours; and the rendered objects agree with each other and with glm-server:

- Deployment: the container's args are real glm-server flags (server/main.cc); containerPorts
  named grpc and metrics equal --port and --metrics_port (or their defaults); the process
  listens on every interface (ENTRYPOINT of the Dockerfile + args); startup/readiness/liveness
  probes are native gRPC probes on the grpc port asking the health service names glm-server
  registers (server/server.h); terminationGracePeriodSeconds exceeds the preStop sleep plus
  --drain_grace; non-root (the image's uid), read-only root filesystem, no privilege
  escalation, all capabilities dropped; the model comes from a PVC mounted read-only and
  --model lies under the mount; memory requested; GPU limit and --device=cuda in the gpu
  overlay, no GPU and --device=cpu in the cpu overlay; the selector matches the pod labels.
- Services: a regular one with ports grpc and metrics, a headless one with grpc only; their
  selectors pick the pods and their targetPorts name real container ports.
- PodDisruptionBudget, NetworkPolicy (admits exactly the grpc and metrics ports), ServiceMonitor
  (selects exactly one Service, with the port it scrapes; its job name is the one the alert
  rules expect), PrometheusRule (identical to deploy/prometheus/alerts.yaml), HPA (targets the
  Deployment, which then has no replicas field; its metric is served by the adapter rules).
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402
import yaml  # noqa: E402

KNOWN = {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "NetworkPolicy",
         "ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler"}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_render(f, name, resources, root, variant):
    flags = dl.server_flags(root)
    live, ready = dl.health_services(root)
    by = dl.index(resources)
    kinds = {}
    for r in resources:
        f.check(r.get("apiVersion") and r.get("kind") and r.get("metadata", {}).get("name"),
                f"{name}: an object without apiVersion/kind/metadata.name: {r}")
        f.check(r["kind"] in KNOWN, f"{name}: unexpected kind {r['kind']}")
        kinds.setdefault(r["kind"], []).append(r)
    f.check(len(by) == len(resources), f"{name}: duplicate kind/name")
    for k in ("Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "NetworkPolicy",
              "ServiceMonitor", "PrometheusRule"):
        f.check(k in kinds, f"{name}: no {k}")
    deps = kinds.get("Deployment", [])
    if not f.check(len(deps) == 1, f"{name}: expected one Deployment"):
        return
    dep = deps[0]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    f.check(selects(spec["selector"]["matchLabels"], pod_labels), f"{name}: Deployment selector must match its pod labels")
    containers = {c["name"]: c for c in pod["containers"]}
    c = containers.get("glm-server")
    if not f.check(c is not None, f"{name}: no container glm-server"):
        return

    # flags: the image's ENTRYPOINT flags, then args (absl: the last value wins)
    entry = dl.dockerfile_entrypoint(root)
    f.check("command" not in c, f"{name}: do not override the image's ENTRYPOINT (command)")
    try:
        args = dl.parse_flags(c.get("args", []))
        eff = dl.parse_flags(entry[1:])
        eff.update(args)
    except ValueError as e:
        f.check(False, f"{name}: {e}")
        return
    for flag in args:
        f.check(flag in flags, f"{name}: --{flag} is not a glm-server flag (server/main.cc)")
    port = int(eff.get("port", dl.flag_default_int(flags, "port")))
    metrics_port = int(eff.get("metrics_port", dl.flag_default_int(flags, "metrics_port")))
    f.check(eff.get("address") in ("0.0.0.0", "::", "[::]"),
            f"{name}: glm-server must listen on every interface in a pod, --address={eff.get('address')}")
    f.check(eff.get("metrics_address", "") in ("", "0.0.0.0", "::", "[::]"),
            f"{name}: --metrics_address must be empty or every interface to be scraped")
    f.check(port == dl.flag_default_int(flags, "port") and metrics_port == dl.flag_default_int(flags, "metrics_port"),
            f"{name}: ports {port}/{metrics_port} differ from glm-server's defaults (keep the Dockerfile's EXPOSE in step)")
    ports = {p["name"]: p for p in c.get("ports", [])}
    f.check(set(ports) == {"grpc", "metrics"}, f"{name}: container ports must be named grpc and metrics, are {sorted(ports)}")
    f.check(ports.get("grpc", {}).get("containerPort") == port, f"{name}: port grpc must be --port={port}")
    f.check(ports.get("metrics", {}).get("containerPort") == metrics_port,
            f"{name}: port metrics must be --metrics_port={metrics_port}")

    # probes
    want = {"startupProbe": (ready, live), "readinessProbe": (ready,), "livenessProbe": (live,)}
    for probe, services in want.items():
        p = c.get(probe)
        if not f.check(p is not None and "grpc" in p, f"{name}: {probe} must be a native gRPC probe"):
            continue
        f.check(p["grpc"].get("port") == port, f"{name}: {probe} must probe the grpc port {port}")
        f.check(p["grpc"].get("service") in services,
                f"{name}: {probe} asks service {p['grpc'].get('service')!r}; glm-server has {services}")
    sp = c.get("startupProbe", {})
    f.check(sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3) >= 600,
            f"{name}: the startupProbe must allow at least 10 minutes to load a model")

    # shutdown
    drain = dl.parse_duration_seconds(eff["drain_grace"]) if "drain_grace" in eff else \
        dl.flag_default_seconds(flags, "drain_grace")
    pre = 0
    cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if len(cmd) == 2 and cmd[0].endswith("sleep"):
        pre = float(cmd[1])
    grace = pod.get("terminationGracePeriodSeconds", 30)
    f.check(grace > pre + drain, f"{name}: terminationGracePeriodSeconds {grace} must exceed preStop {pre} s + drain {drain} s")

    # security
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid = dl.dockerfile_user(root).split(":")[0]
    f.check(psc.get("runAsNonRoot") is True, f"{name}: runAsNonRoot must be true")
    f.check(str(psc.get("runAsUser")) == uid, f"{name}: runAsUser {psc.get('runAsUser')} must be the image's uid {uid}")
    f.check(csc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem must be true")
    f.check(csc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation must be false")
    f.check("ALL" in csc.get("capabilities", {}).get("drop", []), f"{name}: capabilities must drop ALL")
    f.check(csc.get("privileged") in (None, False), f"{name}: must not be privileged")
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        f.check(not pod.get(host), f"{name}: the pod must not set {host}")

    # model volume
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    pvc_vols = [v for v in vols.values() if "persistentVolumeClaim" in v]
    if f.check(len(pvc_vols) == 1, f"{name}: the model must come from one PVC volume"):
        v = pvc_vols[0]
        claim = v["persistentVolumeClaim"]["claimName"]
        f.check(("PersistentVolumeClaim", claim) in by, f"{name}: PVC {claim} is not in the render")
        f.check(v["persistentVolumeClaim"].get("readOnly") is True, f"{name}: the PVC volume must be readOnly")
        m = mounts.get(v["name"])
        if f.check(m is not None, f"{name}: the model volume is not mounted"):
            f.check(m.get("readOnly") is True, f"{name}: the model mount must be readOnly")
            model = eff.get("model", "")
            f.check(model.startswith(m["mountPath"].rstrip("/") + "/"),
                    f"{name}: --model={model} must lie under the model mount {m['mountPath']}")
        pvc = by.get(("PersistentVolumeClaim", claim), {})
        f.check("ReadOnlyMany" in pvc.get("spec", {}).get("accessModes", []) or spec.get("replicas", 2) == 1,
                f"{name}: replicas on several nodes need a ReadOnlyMany claim")
    for mname, m in mounts.items():
        f.check(mname in vols, f"{name}: mount {mname} has no volume")

    # resources and variant
    res = c.get("resources", {})
    f.check("memory" in res.get("requests", {}), f"{name}: memory must be requested")
    f.check("memory" in res.get("limits", {}), f"{name}: memory must be limited")
    gpus = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
    if variant == "gpu":
        f.check(gpus >= 1, f"{name}: the gpu overlay must limit nvidia.com/gpu")
        f.check(eff.get("device") == "cuda", f"{name}: the gpu overlay must run --device=cuda")
        f.check(c["image"].endswith("-cuda"), f"{name}: the gpu overlay must use the CUDA image, uses {c['image']}")
    else:
        f.check(gpus == 0, f"{name}: the cpu overlay must not ask for GPUs")
        f.check(eff.get("device") == "cpu", f"{name}: the cpu overlay must run --device=cpu")
        f.check(c["image"].endswith("-cpu"), f"{name}: the cpu overlay must use the CPU image, uses {c['image']}")
        threads = int(eff.get("threads", 0))
        cpu = str(res.get("requests", {}).get("cpu", "0"))
        f.check(threads > 0 and cpu.isdigit() and threads == int(cpu),
                f"{name}: --threads ({threads}) should equal the CPU request ({cpu})")

    # Services
    svcs = kinds.get("Service", [])
    regular = [s for s in svcs if s["spec"].get("clusterIP") != "None"]
    headless = [s for s in svcs if s["spec"].get("clusterIP") == "None"]
    f.check(len(regular) == 1 and len(headless) == 1, f"{name}: expected one regular and one headless Service")
    for s in svcs:
        sname = s["metadata"]["name"]
        f.check(selects(s["spec"].get("selector", {}), pod_labels), f"{name}: Service {sname} does not select the pods")
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort", p["port"])
            ok = tp in ports if isinstance(tp, str) else tp in (port, metrics_port)
            f.check(ok, f"{name}: Service {sname} port {p.get('name')} targets {tp}, not a container port")
            f.check(p.get("name") in ports and (tp == p["name"] or ports[p["name"]]["containerPort"] == tp),
                    f"{name}: Service {sname} port {p.get('name')} must target the container port of that name")
    if regular:
        f.check({p["name"] for p in regular[0]["spec"]["ports"]} == {"grpc", "metrics"},
                f"{name}: the regular Service must expose grpc and metrics")
    if headless:
        f.check({p["name"] for p in headless[0]["spec"]["ports"]} == {"grpc"},
                f"{name}: the headless Service must expose grpc only")
        f.check(headless[0]["spec"].get("publishNotReadyAddresses") is not True,
                f"{name}: the headless Service must list ready pods only")

    # PDB
    for pdb in kinds.get("PodDisruptionBudget", []):
        f.check(selects(pdb["spec"]["selector"]["matchLabels"], pod_labels), f"{name}: the PDB does not select the pods")
        f.check("maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"], f"{name}: the PDB sets no budget")

    # NetworkPolicy: exactly the grpc and metrics ports
    for np in kinds.get("NetworkPolicy", []):
        npname = np["metadata"]["name"]
        f.check(selects(np["spec"]["podSelector"]["matchLabels"], pod_labels), f"{name}: NetworkPolicy {npname} does not select the pods")
        f.check("Ingress" in np["spec"].get("policyTypes", []), f"{name}: NetworkPolicy {npname} must restrict Ingress")
        admitted = set()
        for rule in np["spec"].get("ingress", []):
            f.check(bool(rule.get("ports")), f"{name}: NetworkPolicy {npname} has a rule without ports (admits every port)")
            for p in rule.get("ports", []):
                v = p.get("port")
                admitted.add(v if isinstance(v, str) else {port: "grpc", metrics_port: "metrics"}.get(v, v))
        f.check(admitted == {"grpc", "metrics"}, f"{name}: NetworkPolicy {npname} admits {admitted}, expected grpc and metrics")

    # ServiceMonitor
    job = None
    for sm in kinds.get("ServiceMonitor", []):
        sel = sm["spec"]["selector"]["matchLabels"]
        hits = [s for s in svcs if selects(sel, s["metadata"].get("labels", {}))]
        eps = sm["spec"]["endpoints"]
        with_port = [s for s in hits if all(any(p["name"] == e["port"] for p in s["spec"]["ports"]) for e in eps)]
        f.check(len(with_port) == 1, f"{name}: the ServiceMonitor must scrape exactly one Service, scrapes {[s['metadata']['name'] for s in with_port]}")
        for e in eps:
            f.check(e["port"] == "metrics", f"{name}: the ServiceMonitor must scrape the metrics port")
            f.check(e.get("path", "/metrics") == "/metrics", f"{name}: glm-server serves /metrics")
        if with_port:
            job = with_port[0]["metadata"]["name"]
    alerts = dl.alert_rules(os.path.join(root, "deploy/prometheus/alerts.yaml"))
    up_rules = [r for r in alerts if "up{" in r["expr"]]
    f.check(job is not None and all(f'job="{job}"' in r["expr"] for r in up_rules) and up_rules,
            f"{name}: the target-down alert must select the ServiceMonitor's job {job!r}")

    # PrometheusRule == alerts.yaml
    with open(os.path.join(root, "deploy/prometheus/alerts.yaml")) as fh:
        groups = yaml.safe_load(fh)["groups"]
    for pr in kinds.get("PrometheusRule", []):
        f.check(pr["spec"]["groups"] == groups, f"{name}: PrometheusRule differs from deploy/prometheus/alerts.yaml")

    # HPA
    for hpa in kinds.get("HorizontalPodAutoscaler", []):
        ref = hpa["spec"]["scaleTargetRef"]
        f.check(ref["kind"] == "Deployment" and ref["name"] == dep["metadata"]["name"], f"{name}: the HPA must scale the Deployment")
        f.check("replicas" not in spec, f"{name}: with an HPA, the Deployment must not set replicas")
        f.check(hpa["spec"]["minReplicas"] >= 2, f"{name}: keep at least 2 replicas (PDB, drains)")
        with open(os.path.join(root, "deploy/prometheus/prometheus-adapter-rules.yaml")) as fh:
            adapter = yaml.safe_load(fh)
        served = {r["name"]["as"] for r in adapter["rules"]}
        for m in hpa["spec"]["metrics"]:
            if m["type"] == "Pods":
                f.check(m["pods"]["metric"]["name"] in served,
                        f"{name}: the HPA's metric {m['pods']['metric']['name']} is not in the adapter rules")


def kubectl_render(directory):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None
    out = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    root = os.path.abspath(ap.parse_args().root)
    deploy = os.path.join(root, "deploy")
    f = dl.Failures()

    # every YAML file parses
    files = sorted(glob.glob(os.path.join(deploy, "**/*.yaml"), recursive=True))
    f.check(len(files) >= 15, f"expected the deploy/ manifests, found {len(files)} YAML files")
    for path in files:
        try:
            docs = dl.load_docs(path)
            f.check(bool(docs), f"{path}: empty")
        except yaml.YAMLError as e:
            f.check(False, f"{path}: {e}")

    have_kubectl = shutil.which("kubectl") is not None
    if not have_kubectl:
        print("note: kubectl not installed: rendering with tests/deploy's own renderer only")
    tmp = tempfile.mkdtemp(prefix="glm-deploy-")
    try:
        cases = []
        for variant in ("cpu", "gpu"):
            overlay = os.path.join(deploy, "overlays", variant)
            cases.append((f"overlays/{variant}", overlay, variant))
            # the overlay plus the optional autoscaling component
            d = os.path.join(tmp, f"{variant}-autoscaling")
            os.makedirs(d)
            with open(os.path.join(d, "kustomization.yaml"), "w") as fh:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                "resources": [os.path.relpath(overlay, d)],
                                "components": [os.path.relpath(os.path.join(deploy, "components", "autoscaling"), d)]},
                               fh)
            cases.append((f"overlays/{variant}+autoscaling", d, variant))
        for name, directory, variant in cases:
            try:
                ours = dl.render(directory)
            except Exception as e:  # noqa: BLE001
                f.check(False, f"{name}: does not render: {e}")
                continue
            f.check(True, f"{name}: renders")
            try:
                theirs = kubectl_render(directory)
            except Exception as e:  # noqa: BLE001
                f.check(False, str(e))
                theirs = None
            if theirs is not None:
                a, b = dl.index(ours), dl.index(theirs)
                f.check(set(a) == set(b), f"{name}: kubectl kustomize renders {sorted(b)}, ours {sorted(a)}")
                for key in set(a) & set(b):
                    f.check(a[key] == b[key], f"{name}: {key} differs between kubectl kustomize and our renderer:\n"
                            f"kubectl: {b[key]}\nours:    {a[key]}")
                print(f"{name}: {len(theirs)} objects, identical to kubectl kustomize")
            else:
                print(f"{name}: {len(ours)} objects")
            check_render(f, name, theirs if theirs is not None else ours, root, variant)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f.finish("check_manifests")


if __name__ == "__main__":
    sys.exit(main())
