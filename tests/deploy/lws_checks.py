"""Checks of the LeaderWorkerSet overlays (deploy/overlays/lws-*), called by check_manifests.py on
their render: one glm-server model instance over several pods (docs/parallel.md "Ranks in
several processes").

- One LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) and no Deployment; group restart on any
  pod's failure (RecreateGroupOnPodRestart); size >= 2.
- Leader and workers run the same image and agree on every group flag (--tensor_parallel,
  --nodes, --leader_address, --group_token, --model, --device, --expert_parallel); every arg is
  a real glm-server flag; --nodes equals the group size and divides --tensor_parallel; the
  leader is --node_rank=0, the workers $(LWS_WORKER_INDEX); the leader address is the LWS
  leader's ($(LWS_LEADER_ADDRESS)) at a port the leader's container exposes, with the next one
  (the collectives) exposed too; every $(VAR) in args is one LWS injects or the container
  defines.
- CUDA groups: each pod gets --tensor_parallel / --nodes GPUs, the CUDA image, a memory-backed
  /dev/shm for NCCL and the GPU toleration; CPU groups no GPU and the CPU image.
- The leader serves (grpc, metrics and http ports equal to its flags; native gRPC probes on
  the health services glm-server registers); a worker serves no front end and has no probes.
- Both pods: non-root as the image's user, read-only root filesystem, no privilege escalation,
  all capabilities dropped; the model from the PVC, mounted read-only, with --model under it.
- The Services select leaders only (worker-index "0"), never workers; the NetworkPolicy admits
  the group's step channel and collectives from glmserve pods.
"""
import re

import deploylib as dl

LWS_API = "leaderworkerset.x-k8s.io/v1"
INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_ENV = {"LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE", "LWS_NAME"}
GROUP_FLAGS = ("tensor_parallel", "nodes", "leader_address", "group_token", "model", "device",
               "expert_parallel")


def _container(f, name, template, role):
    containers = {c["name"]: c for c in template["spec"].get("containers", [])}
    c = containers.get("glm-server")
    f.check(c is not None, f"{name}: the {role} has no container glm-server")
    return c


def _flags(f, name, c, role, root, server_flags):
    f.check("command" not in c, f"{name}: the {role} must not override the image's ENTRYPOINT")
    try:
        args = dl.parse_flags(c.get("args", []))
        eff = dl.parse_flags(dl.dockerfile_entrypoint(root)[1:])
        eff.update(args)
    except ValueError as e:
        f.check(False, f"{name}: {role}: {e}")
        return {}
    for flag in args:
        f.check(flag in server_flags, f"{name}: {role}: --{flag} is not a glm-server flag")
    defined = {e["name"] for e in c.get("env", [])} | LWS_ENV
    for a in c.get("args", []):
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            f.check(var in defined, f"{name}: {role}: $({var}) in {a} is neither LWS's nor in env")
    return eff


def _pod_hygiene(f, name, template, c, eff, role, root, by):
    pod = template["spec"]
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid = dl.dockerfile_user(root).split(":")[0]
    f.check(psc.get("runAsNonRoot") is True and str(psc.get("runAsUser")) == uid,
            f"{name}: the {role} must run as the image's non-root uid {uid}")
    f.check(csc.get("readOnlyRootFilesystem") is True, f"{name}: {role}: readOnlyRootFilesystem")
    f.check(csc.get("allowPrivilegeEscalation") is False, f"{name}: {role}: allowPrivilegeEscalation")
    f.check("ALL" in csc.get("capabilities", {}).get("drop", []), f"{name}: {role}: drop ALL")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    pvcs = [v for v in vols.values() if "persistentVolumeClaim" in v]
    if f.check(len(pvcs) == 1, f"{name}: the {role}'s model must come from one PVC"):
        v = pvcs[0]
        claim = v["persistentVolumeClaim"]["claimName"]
        f.check(("PersistentVolumeClaim", claim) in by, f"{name}: PVC {claim} is not in the render")
        f.check(v["persistentVolumeClaim"].get("readOnly") is True, f"{name}: {role}: PVC readOnly")
        m = mounts.get(v["name"])
        if f.check(m is not None and m.get("readOnly") is True,
                   f"{name}: the {role} must mount the model read-only"):
            f.check(eff.get("model", "").startswith(m["mountPath"].rstrip("/") + "/"),
                    f"{name}: {role}: --model must lie under {m['mountPath']}")
    for mname in mounts:
        f.check(mname in vols, f"{name}: {role}: mount {mname} has no volume")
    res = c.get("resources", {})
    f.check("memory" in res.get("requests", {}) and "memory" in res.get("limits", {}),
            f"{name}: {role}: memory must be requested and limited")


def check_lws_render(f, name, resources, root):
    by = dl.index(resources)
    server_flags = dl.server_flags(root)
    live, ready = dl.health_services(root)
    kinds = {}
    for r in resources:
        kinds.setdefault(r["kind"], []).append(r)
    f.check("Deployment" not in kinds, f"{name}: the LeaderWorkerSet replaces the Deployment")
    sets = kinds.get("LeaderWorkerSet", [])
    if not f.check(len(sets) == 1, f"{name}: expected one LeaderWorkerSet"):
        return
    lws = sets[0]
    f.check(lws.get("apiVersion") == LWS_API, f"{name}: apiVersion must be {LWS_API}")
    tpl = lws["spec"]["leaderWorkerTemplate"]
    size = tpl.get("size", 1)
    f.check(isinstance(size, int) and size >= 2, f"{name}: a group needs size >= 2, has {size}")
    f.check(tpl.get("restartPolicy") == "RecreateGroupOnPodRestart",
            f"{name}: a failed pod must restart its whole group (RecreateGroupOnPodRestart)")
    leader_t, worker_t = tpl.get("leaderTemplate"), tpl.get("workerTemplate")
    if not f.check(leader_t is not None and worker_t is not None,
                   f"{name}: leader and worker templates must both be given"):
        return
    lc = _container(f, name, leader_t, "leader")
    wc = _container(f, name, worker_t, "worker")
    if lc is None or wc is None:
        return
    le = _flags(f, name, lc, "leader", root, server_flags)
    we = _flags(f, name, wc, "worker", root, server_flags)
    f.check(lc.get("image") == wc.get("image"), f"{name}: leader and workers must run one image")
    for flag in GROUP_FLAGS:
        f.check(le.get(flag) == we.get(flag),
                f"{name}: --{flag} differs: leader {le.get(flag)!r}, workers {we.get(flag)!r}")
    nodes = int(le.get("nodes", 1))
    tp = int(le.get("tensor_parallel", 0))
    f.check(nodes == size, f"{name}: --nodes={nodes} must equal the group size {size}")
    f.check(tp >= nodes and tp % nodes == 0, f"{name}: --tensor_parallel={tp} over {nodes} nodes")
    f.check(le.get("node_rank") == "0", f"{name}: the leader must be --node_rank=0")
    f.check(we.get("node_rank") == "$(LWS_WORKER_INDEX)",
            f"{name}: workers must take --node_rank=$(LWS_WORKER_INDEX)")
    address = le.get("leader_address", "")
    f.check(address.startswith("$(LWS_LEADER_ADDRESS):"),
            f"{name}: --leader_address must be $(LWS_LEADER_ADDRESS):port, is {address!r}")
    step_port = int(address.rsplit(":", 1)[-1]) if address.rsplit(":", 1)[-1].isdigit() else -1
    lports = {p["name"]: p for p in lc.get("ports", [])}
    f.check(lports.get("steps", {}).get("containerPort") == step_port and
            lports.get("collectives", {}).get("containerPort") == step_port + 1,
            f"{name}: the leader must expose steps {step_port} and collectives {step_port + 1}")

    # the leader serves; workers do not
    port = int(le.get("port", dl.flag_default_int(server_flags, "port")))
    metrics_port = int(le.get("metrics_port", dl.flag_default_int(server_flags, "metrics_port")))
    http_port = int(le.get("http_port", dl.flag_default_int(server_flags, "http_port")))
    f.check(le.get("address") in ("0.0.0.0", "::", "[::]"), f"{name}: the leader must listen on every interface")
    f.check(lports.get("grpc", {}).get("containerPort") == port and
            lports.get("metrics", {}).get("containerPort") == metrics_port and
            (http_port <= 0 or lports.get("http", {}).get("containerPort") == http_port),
            f"{name}: the leader's ports must be its --port, --metrics_port and --http_port")
    for probe, services in {"startupProbe": (ready, live), "readinessProbe": (ready,),
                            "livenessProbe": (live,)}.items():
        p = lc.get(probe)
        if f.check(p is not None and "grpc" in p, f"{name}: leader {probe} must be a gRPC probe"):
            f.check(p["grpc"].get("port") == port and p["grpc"].get("service") in services,
                    f"{name}: leader {probe} must ask {services} on port {port}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        f.check(probe not in wc, f"{name}: a worker serves no gRPC: no {probe}")
    for flag in ("port", "http_port", "metrics_port"):
        f.check(flag not in we or we[flag] in ("0", "-1"),
                f"{name}: workers serve no front end (--{flag})")
    _pod_hygiene(f, name, leader_t, lc, le, "leader", root, by)
    _pod_hygiene(f, name, worker_t, wc, we, "worker", root, by)

    # the device: CUDA pods get a GPU per rank, the CUDA image and NCCL's /dev/shm; CPU pods none
    for role, t, c in (("leader", leader_t, lc), ("worker", worker_t, wc)):
        gpus = int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        if le.get("device") == "cuda":
            f.check(gpus == tp // max(nodes, 1),
                    f"{name}: a {role} pod must get --tensor_parallel / --nodes = {tp // max(nodes, 1)} GPUs, gets {gpus}")
            f.check(c.get("image", "").endswith("-cuda"), f"{name}: {role}: the CUDA image")
            vols = {v["name"]: v for v in t["spec"].get("volumes", [])}
            shm = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/dev/shm"]
            f.check(bool(shm) and vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
                    f"{name}: {role}: NCCL needs a memory-backed /dev/shm")
            f.check(any(tol.get("key") == "nvidia.com/gpu" for tol in t["spec"].get("tolerations", [])),
                    f"{name}: {role}: the GPU nodes' toleration")
        else:
            f.check(le.get("device") == "cpu", f"{name}: --device must be cpu or cuda")
            f.check(gpus == 0, f"{name}: a CPU {role} asks for no GPU")
            f.check(c.get("image", "").endswith("-cpu"), f"{name}: {role}: the CPU image")

    # Services: leaders only; the NetworkPolicy admits the group's ports
    leader_labels = dict(leader_t["metadata"]["labels"], **{INDEX_LABEL: "0"})
    worker_labels = dict(worker_t["metadata"]["labels"], **{INDEX_LABEL: "1"})
    for svc in kinds.get("Service", []):
        sel = svc["spec"].get("selector", {})
        f.check(all(leader_labels.get(k) == v for k, v in sel.items()),
                f"{name}: Service {svc['metadata']['name']} must select the leaders")
        f.check(not all(worker_labels.get(k) == v for k, v in sel.items()),
                f"{name}: Service {svc['metadata']['name']} must not select workers")
    for np in kinds.get("NetworkPolicy", []):
        admitted = set()
        for rule in np["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                admitted.add(p.get("port"))
        f.check({"steps", "collectives"} <= admitted,
                f"{name}: NetworkPolicy {np['metadata']['name']} must admit the group's steps and collectives")
