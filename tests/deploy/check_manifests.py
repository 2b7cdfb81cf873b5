#!/usr/bin/env python3
"""Checks deploy/'s Kubernetes manifests: every YAML file parses; each overlay (cpu, gpu, gpu-8,
lws-cpu and lws-gpu (checked by lws_checks.py), and
each with the optional autoscaling component) renders, with this directory's own Kustomize
renderer (deploylib.render) and, where kubectl is installed, with `kubectl kustomize`, whose
output must equal ours; and the rendered objects agree with each other and with glm-server:

- Deployment: the container's args are real glm-server flags (server/main.cc); containerPorts
  named grpc and metrics equal --port and --metrics_port (or their defaults), and one named
  http equals --http_port when the args serve the OpenAI endpoint; the process
  listens on every interface (ENTRYPOINT of the Dockerfile + args); startup/readiness/liveness
  probes are native gRPC probes on the grpc port asking the health service names glm-server
  registers (server/server.h); terminationGracePeriodSeconds exceeds the preStop sleep plus
  --drain_grace; non-root (the image's uid), read-only root filesystem, no privilege
  escalation, all capabilities dropped; the model comes from a PVC mounted read-only and
  --model lies under the mount; memory requested; GPU limit and --device=cuda in the gpu
  overlays (gpu, and gpu-8 with --tensor_parallel equal to its GPU count and a memory-backed
  /dev/shm for NCCL), no GPU and --device=cpu in the cpu overlay; the selector matches the pod
  labels.
- Services: a regular one with ports grpc, metrics (and http when served), a headless one with
  grpc only; their
  selectors pick the pods and their targetPorts name real container ports.
- PodDisruptionBudget, NetworkPolicy (admits exactly the grpc, metrics and served http ports),
  ServiceMonitor
  (selects exactly one Service, with the port it scrapes; its job name is the one the alert
  rules expect), PrometheusRule (identical to deploy/prometheus/alerts.yaml), HPA (targets the
  Deployment, which then has no replicas field; its metric is served by the adapter rules).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402
import lws_checks  # noqa: E402
import yaml  # noqa: E402

KNOWN = {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "NetworkPolicy",
         "ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler", "Job", "ConfigMap",
         "LeaderWorkerSet"}


def project_version(root):
    m = re.search(r"project\(glmserve VERSION ([0-9.]+)", open(os.path.join(root, "CMakeLists.txt")).read())
    return m.group(1) if m else None


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
    http_port = int(eff.get("http_port", dl.flag_default_int(flags, "http_port")))
    ports = {p["name"]: p for p in c.get("ports", [])}
    want_ports = {"grpc", "metrics"} | ({"http"} if http_port > 0 else set())
    f.check(set(ports) == want_ports, f"{name}: container ports must be named {sorted(want_ports)}, are {sorted(ports)}")
    if http_port > 0:
        f.check(ports.get("http", {}).get("containerPort") == http_port, f"{name}: port http must be --http_port={http_port}")
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

    # version label and placement
    version = project_version(root)
    for where, labels in (("Deployment", dep["metadata"].get("labels", {})), ("pod template", pod_labels)):
        f.check(labels.get("app.kubernetes.io/version") == version,
                f"{name}: {where} label app.kubernetes.io/version must be the project's {version}, is "
                f"{labels.get('app.kubernetes.io/version')}")
    f.check("app.kubernetes.io/version" not in spec["selector"]["matchLabels"],
            f"{name}: the selector must not hold the version (it changes with every release)")
    spread = {t.get("topologyKey"): t for t in pod.get("topologySpreadConstraints", [])}
    host = spread.get("kubernetes.io/hostname")
    if f.check(host is not None, f"{name}: replicas must be spread over nodes (topologySpreadConstraints)"):
        f.check(host.get("whenUnsatisfiable") == "DoNotSchedule" and host.get("maxSkew") == 1,
                f"{name}: the node spread must be maxSkew 1, DoNotSchedule")
        f.check(selects(host.get("labelSelector", {}).get("matchLabels"), pod_labels),
                f"{name}: the node spread's labelSelector must select the pods")

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
        # A tensor-parallel group runs a rank per GPU in this one process (docs/parallel.md).
        tp = int(eff.get("tensor_parallel", 0) or 0)
        f.check(max(tp, 1) == gpus, f"{name}: --tensor_parallel={tp} must equal the {gpus} GPUs the pod gets")
        if tp > 1:
            shm = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/dev/shm"]
            f.check(bool(shm) and "emptyDir" in {v["name"]: v for v in pod.get("volumes", [])}.get(shm[0]["name"], {}),
                    f"{name}: a tensor-parallel pod needs a memory-backed /dev/shm for NCCL")
    else:
        f.check(gpus == 0, f"{name}: the cpu overlay must not ask for GPUs")
        f.check(eff.get("device") == "cpu", f"{name}: the cpu overlay must run --device=cpu")
        f.check(c["image"].endswith("-cpu"), f"{name}: the cpu overlay must use the CPU image, uses {c['image']}")
        threads = int(eff.get("threads", 0))
        cpu = str(res.get("requests", {}).get("cpu", "0"))
        f.check(threads > 0 and cpu.isdigit() and threads == int(cpu),
                f"{name}: --threads ({threads}) should equal the CPU request ({cpu})")

    if "Job" in kinds:
        check_model_fetch(f, name, kinds, dep, eff, root)

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
            ok = tp in ports if isinstance(tp, str) else tp in (port, metrics_port, http_port)
            f.check(ok, f"{name}: Service {sname} port {p.get('name')} targets {tp}, not a container port")
            f.check(p.get("name") in ports and (tp == p["name"] or ports[p["name"]]["containerPort"] == tp),
                    f"{name}: Service {sname} port {p.get('name')} must target the container port of that name")
    if regular:
        f.check({p["name"] for p in regular[0]["spec"]["ports"]} == want_ports,
                f"{name}: the regular Service must expose {sorted(want_ports)}")
    if headless:
        f.check({p["name"] for p in headless[0]["spec"]["ports"]} == {"grpc"},
                f"{name}: the headless Service must expose grpc only")
        f.check(headless[0]["spec"].get("publishNotReadyAddresses") is not True,
                f"{name}: the headless Service must list ready pods only")

    # PDB
    for pdb in kinds.get("PodDisruptionBudget", []):
        f.check(selects(pdb["spec"]["selector"]["matchLabels"], pod_labels), f"{name}: the PDB does not select the pods")
        f.check("maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"], f"{name}: the PDB sets no budget")

    # NetworkPolicy: exactly the grpc, metrics (and http, when served) ports
    for np in kinds.get("NetworkPolicy", []):
        npname = np["metadata"]["name"]
        f.check(selects(np["spec"]["podSelector"]["matchLabels"], pod_labels), f"{name}: NetworkPolicy {npname} does not select the pods")
        f.check("Ingress" in np["spec"].get("policyTypes", []), f"{name}: NetworkPolicy {npname} must restrict Ingress")
        admitted = set()
        for rule in np["spec"].get("ingress", []):
            f.check(bool(rule.get("ports")), f"{name}: NetworkPolicy {npname} has a rule without ports (admits every port)")
            for p in rule.get("ports", []):
                v = p.get("port")
                admitted.add(v if isinstance(v, str) else {port: "grpc", metrics_port: "metrics", http_port: "http"}.get(v, v))
        f.check(admitted == want_ports, f"{name}: NetworkPolicy {npname} admits {admitted}, expected {sorted(want_ports)}")

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


def check_model_fetch(f, name, kinds, dep, eff, root):
    """The model-fetch component: its Job writes the serving pods' claim at their --model, as
    their user, with the script in deploy/components/model-fetch, and the pods wait for the
    marker that script writes."""
    jobs = [j for j in kinds["Job"] if j["metadata"]["name"] == "glmserve-model-fetch"]
    if not f.check(len(jobs) == 1, f"{name}: expected Job glmserve-model-fetch"):
        return
    job = jobs[0]
    jpod = job["spec"]["template"]["spec"]
    pod = dep["spec"]["template"]["spec"]
    f.check(jpod.get("restartPolicy") in ("Never", "OnFailure"), f"{name}: the Job's restartPolicy")
    f.check(0 < job["spec"].get("backoffLimit", 6) <= 6, f"{name}: the Job needs a small backoffLimit")
    f.check(job["spec"].get("activeDeadlineSeconds", 0) > 0, f"{name}: the Job needs activeDeadlineSeconds")
    jc = jpod["containers"][0]
    env = {e["name"]: e.get("value") for e in jc.get("env", [])}
    f.check(env.get("MODEL_DIR") == eff.get("model"),
            f"{name}: the Job fills {env.get('MODEL_DIR')}, the pods read --model={eff.get('model')}")
    f.check(jc["image"].split(":")[0] == [c for c in pod["containers"] if c["name"] == "glm-server"][0]["image"].split(":")[0],
            f"{name}: the Job runs the serving image")
    jsc, psc = jpod.get("securityContext", {}), pod.get("securityContext", {})
    f.check(jsc.get("runAsNonRoot") is True and jsc.get("runAsUser") == psc.get("runAsUser"),
            f"{name}: the Job must run as the serving pods' non-root user")
    f.check(jc.get("securityContext", {}).get("readOnlyRootFilesystem") is True,
            f"{name}: the Job's root filesystem must be read-only")
    vols = {v["name"]: v for v in jpod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in jc.get("volumeMounts", [])}
    claim = [v for v in pod["volumes"] if "persistentVolumeClaim" in v][0]["persistentVolumeClaim"]["claimName"]
    model_mount = [m for p, m in mounts.items() if (env.get("MODEL_DIR") or "").startswith(p.rstrip("/") + "/")]
    if f.check(len(model_mount) == 1, f"{name}: the Job must mount the model volume above MODEL_DIR"):
        v = vols.get(model_mount[0]["name"], {})
        f.check(v.get("persistentVolumeClaim", {}).get("claimName") == claim,
                f"{name}: the Job must write the pods' claim {claim}")
        f.check(not model_mount[0].get("readOnly"), f"{name}: the Job's model mount must be writable")
    f.check(mounts.get(env.get("SOURCE_DIR"), {}).get("readOnly") is True, f"{name}: the source must be mounted read-only")
    pvc = [p for p in kinds["PersistentVolumeClaim"] if p["metadata"]["name"] == claim][0]
    f.check({"ReadWriteMany", "ReadOnlyMany"} <= set(pvc["spec"]["accessModes"]),
            f"{name}: with model-fetch the claim must be ReadWriteMany (the Job) and ReadOnlyMany (the pods)")
    script = open(os.path.join(root, "deploy/components/model-fetch/fetch.sh")).read()
    cms = [c for c in kinds.get("ConfigMap", []) if c["metadata"]["name"] == "glmserve-model-fetch"]
    f.check(bool(cms) and cms[0]["data"].get("fetch.sh") == script,
            f"{name}: the ConfigMap's fetch.sh must equal deploy/components/model-fetch/fetch.sh")
    f.check('MARKER="$MODEL_DIR/.glmserve-verified"' in script, "fetch.sh must write $MODEL_DIR/.glmserve-verified")
    inits = pod.get("initContainers", [])
    marker = f"{eff.get('model')}/.glmserve-verified"
    f.check(any(marker in " ".join(i.get("command", [])) for i in inits),
            f"{name}: the pods need an init container that waits for {marker}")


def run_fetch_script(f, root):
    """Runs fetch.sh on a copy of the 5-shard golden checkpoint: it must copy and verify a good
    mirror (and do nothing the second time) and refuse a corrupted or incomplete one."""
    import hashlib
    script = os.path.join(root, "deploy/components/model-fetch/fetch.sh")
    golden = os.path.join(root, "tests/golden/sharded_fp32")
    tmp = tempfile.mkdtemp(prefix="glm-fetch-")
    try:
        def mirror(name, files):
            d = os.path.join(tmp, name)
            os.makedirs(d)
            with open(os.path.join(d, "SHA256SUMS"), "w") as sums:
                for fn in files:
                    shutil.copy(os.path.join(golden, fn), d)
                    digest = hashlib.sha256(open(os.path.join(golden, fn), "rb").read()).hexdigest()
                    sums.write(f"{digest}  {fn}\n")
            return d

        def run(source, model):
            return subprocess.run(["sh", script], env={"PATH": os.environ["PATH"], "SOURCE_DIR": source,
                                                       "MODEL_DIR": model}, capture_output=True, text=True)
        files = sorted(fn for fn in os.listdir(golden) if fn.endswith((".json", ".safetensors")))
        good = mirror("good", files)
        model = os.path.join(tmp, "models", "model")
        r = run(good, model)
        f.check(r.returncode == 0 and os.path.exists(os.path.join(model, ".glmserve-verified")),
                f"fetch.sh must copy and verify a good mirror: {r.stdout}{r.stderr}")
        for fn in files:
            f.check(os.path.exists(os.path.join(model, fn)) and
                    open(os.path.join(model, fn), "rb").read() == open(os.path.join(golden, fn), "rb").read(),
                    f"fetch.sh: {fn} not copied intact")
        r = run(good, model)
        f.check(r.returncode == 0 and "already verified" in r.stdout, f"fetch.sh must be idempotent: {r.stdout}")
        bad = mirror("bad", files)
        shard = [fn for fn in files if fn.endswith(".safetensors")][2]
        with open(os.path.join(bad, shard), "r+b") as fh:
            fh.seek(-1, 2)
            last = fh.read(1)
            fh.seek(-1, 2)
            fh.write(bytes([last[0] ^ 1]))
        model2 = os.path.join(tmp, "models2", "model")
        r = run(bad, model2)
        f.check(r.returncode != 0 and "checksum mismatch" in r.stdout and not os.path.exists(model2),
                f"fetch.sh must refuse a corrupted shard: rc {r.returncode} {r.stdout}{r.stderr}")
        short = mirror("short", [fn for fn in files if fn != shard])
        r = run(short, os.path.join(tmp, "models3", "model"))
        f.check(r.returncode != 0 and f"names {shard}, which is missing" in r.stdout,
                f"fetch.sh must refuse a mirror without a shard the index names: {r.stdout}{r.stderr}")
        print("fetch.sh: copies and verifies a good mirror; refuses a corrupted or incomplete one")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        # gpu-8: a tensor-parallel group of 8 GPUs in one pod, checked as a gpu overlay.
        cases.append(("overlays/gpu-8", os.path.join(deploy, "overlays", "gpu-8"), "gpu"))
        # lws-cpu: one instance over several pods (a LeaderWorkerSet; lws_checks.py).
        cases.append(("overlays/lws-cpu", os.path.join(deploy, "overlays", "lws-cpu"), "lws"))
        cases.append(("overlays/lws-gpu", os.path.join(deploy, "overlays", "lws-gpu"), "lws"))
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
            # ... and plus the model-fetch component
            d = os.path.join(tmp, f"{variant}-model-fetch")
            os.makedirs(d)
            with open(os.path.join(d, "kustomization.yaml"), "w") as fh:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                "resources": [os.path.relpath(overlay, d)],
                                "components": [os.path.relpath(os.path.join(deploy, "components", "model-fetch"), d)]},
                               fh)
            cases.append((f"overlays/{variant}+model-fetch", d, variant))
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
            rendered = theirs if theirs is not None else ours
            if variant == "lws":
                lws_checks.check_lws_render(f, name, rendered, root)
            else:
                check_render(f, name, rendered, root, variant)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    run_fetch_script(f, root)
    return f.finish("check_manifests")


if __name__ == "__main__":
    sys.exit(main())
