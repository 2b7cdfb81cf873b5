"""Shared helpers of the deployment tests (tests/deploy): what the server's sources say (flags,
health service names), a Dockerfile parser, a small Kustomize renderer, and PromQL metric-name
extraction. Python 3 standard library plus PyYAML (Debian's python3-yaml)."""

import copy
import json
import os
import re
import shlex
import sys

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.stderr.write("PyYAML is missing: run tools/install_deps.sh (Debian package python3-yaml)\n")
    sys.exit(77)


class Failures:
    """Collects check failures so that one run reports all of them."""

    def __init__(self):
        self.items = []
        self.checked = 0

    def check(self, cond, message):
        self.checked += 1
        if not cond:
            self.items.append(message)
        return cond

    def finish(self, name):
        for m in self.items:
            print(f"FAIL: {m}")
        print(f"{name}: {self.checked - len(self.items)} passed, {len(self.items)} failed")
        return 1 if self.items else 0


# ---- the server's sources -------------------------------------------------------------------

def server_flags(root):
    """{name: default text} of every ABSL_FLAG in server/main.cc."""
    text = open(os.path.join(root, "server/main.cc")).read()
    flags = {}
    for m in re.finditer(r"ABSL_FLAG\(\s*([\w:]+)\s*,\s*(\w+)\s*,\s*(.*?),\s*\n?\s*\"", text, re.S):
        flags[m.group(2)] = m.group(3).strip()
    return flags


def flag_default_int(flags, name):
    return int(flags[name])


def flag_default_seconds(flags, name):
    m = re.fullmatch(r"absl::Seconds\((\d+)\)", flags[name])
    if not m:
        raise ValueError(f"cannot read the default of --{name}: {flags[name]}")
    return int(m.group(1))


def health_services(root):
    """The liveness and readiness service names glm-server registers (server/server.h)."""
    text = open(os.path.join(root, "server/server.h")).read()
    live = re.search(r'kLivenessService\[\]\s*=\s*"([^"]*)"', text).group(1)
    ready = re.search(r'kReadinessService\[\]\s*=\s*"([^"]*)"', text).group(1)
    return live, ready


def parse_duration_seconds(text):
    """absl duration flag syntax, the subset used here: 30s, 1m, 1m30s, 500ms, 0."""
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", text):
        if m.start() != pos:
            raise ValueError(f"bad duration {text!r}")
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"bad duration {text!r}")
    return total


def parse_flags(args):
    """['--a=1', '--b', ...] -> {'a': '1', 'b': 'true'}; later values win, as in absl."""
    out = {}
    for a in args:
        if not a.startswith("--"):
            raise ValueError(f"not a --flag: {a!r}")
        name, eq, value = a[2:].partition("=")
        out[name] = value if eq else "true"
    return out


# ---- Dockerfile -----------------------------------------------------------------------------

class Stage:
    def __init__(self, base, name, index):
        self.base, self.name, self.index = base, name, index
        self.instructions = []  # (KEYWORD, argument text)

    def all(self, keyword):
        return [arg for k, arg in self.instructions if k == keyword]

    def last(self, keyword):
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(path):
    """Returns (global ARG defaults, [Stage]) with line continuations joined and comments and
    parser directives dropped."""
    lines, cur = [], ""
    for raw in open(path).read().splitlines():
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):  # comment lines inside a continuation are dropped
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append((cur + s).strip())
        cur = ""
    if cur:
        lines.append(cur.strip())
    global_args, stages = {}, []
    for line in lines:
        keyword, _, arg = line.partition(" ")
        keyword = keyword.upper()
        arg = arg.strip()
        if keyword == "FROM":
            parts = arg.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name, len(stages)))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{keyword} before the first FROM")
            n, eq, v = arg.partition("=")
            global_args[n] = v.strip('"') if eq else None
        else:
            stages[-1].instructions.append((keyword, arg))
    return global_args, stages


def substitute(text, variables):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), text)


def exec_form(arg):
    """JSON exec form ["a", "b"] -> list, shell form -> ['/bin/sh', '-c', text]."""
    arg = arg.strip()
    if arg.startswith("["):
        return json.loads(arg)
    return ["/bin/sh", "-c", arg]


def dockerfile_entrypoint(root):
    """The final stage's ENTRYPOINT of the repository's Dockerfile, as a list."""
    _, stages = parse_dockerfile(os.path.join(root, "Dockerfile"))
    return exec_form(stages[-1].last("ENTRYPOINT"))


def dockerfile_user(root):
    _, stages = parse_dockerfile(os.path.join(root, "Dockerfile"))
    return stages[-1].last("USER")


# ---- Kustomize ------------------------------------------------------------------------------

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "components", "patches", "images"}

# Strategic merge: the merge key of the lists this renderer merges element by element; other
# lists are replaced whole (as for args, command and tolerations).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name",
              "volumeMounts": "mountPath", "env": "name", "imagePullSecrets": "name",
              "ports": "containerPort"}


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomization_file(directory):
    for n in KUSTOMIZATION_FILES:
        p = os.path.join(directory, n)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"{directory}: no kustomization.yaml")


def strategic_merge(base, patch, key=None):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS and \
            all(isinstance(x, dict) for x in base + patch):
        mk = MERGE_KEYS[key]
        out = [copy.deepcopy(x) for x in base]
        added = []
        for item in patch:
            for i, b in enumerate(out):
                if b.get(mk) == item.get(mk):
                    out[i] = strategic_merge(b, item)
                    break
            else:
                added.append(copy.deepcopy(item))
        # Elements only the patch has come first, in its order: kustomize's (kyaml's) merge
        # orders them so, and `kubectl kustomize` is the reference this renderer must equal.
        return added + out
    return copy.deepcopy(patch)


def _pointer(path):
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json6902(doc, ops):
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if kind == "remove":
                del parent[idx]
            elif kind == "replace":
                parent[idx] = op["value"]
            elif kind == "add":
                parent.insert(idx, op["value"])
            else:
                raise ValueError(f"unsupported JSON patch op {kind}")
        else:
            if kind == "remove":
                del parent[last]
            elif kind in ("replace", "add"):
                if kind == "replace" and last not in parent:
                    raise KeyError(op["path"])
                parent[last] = op["value"]
            else:
                raise ValueError(f"unsupported JSON patch op {kind}")
    return doc


def _group_version(api_version):
    g, _, v = api_version.rpartition("/")
    return g, v


def _matches(res, target):
    g, v = _group_version(res.get("apiVersion", ""))
    checks = {"group": g, "version": v, "kind": res.get("kind"),
              "name": res.get("metadata", {}).get("name")}
    return all(target[k] == checks[k] for k in checks if k in target)


def pod_specs(node):
    """Every pod spec inside an object (a Deployment's template, a Job's, a LeaderWorkerSet's
    leader and worker templates): kustomize's image transformer finds containers anywhere."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for v in node.values():
            yield from pod_specs(v)
    elif isinstance(node, list):
        for v in node:
            yield from pod_specs(v)


def _set_images(resources, images):
    for res in resources:
        for spec in list(pod_specs(res)):
            _set_pod_images(spec, images)


def _set_pod_images(spec, images):
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        image = c.get("image", "")
        name, tag = image, None
        if "@" in name:
            name = name.split("@")[0]
        elif ":" in name.rsplit("/", 1)[-1]:
            name, tag = name.rsplit(":", 1)
        for im in images:
            if im["name"] == name:
                new = im.get("newName", name)
                if "digest" in im:
                    new += "@" + im["digest"]
                elif "newTag" in im:
                    new += ":" + str(im["newTag"])
                elif tag:
                    new += ":" + tag
                c["image"] = new


def _apply_patches(resources, patches, directory):
    for p in patches:
        unknown = set(p) - {"path", "patch", "target"}
        if unknown:
            raise ValueError(f"{directory}: patch keys not supported by this renderer: {unknown}")
        if "path" in p:
            with open(os.path.join(directory, p["path"])) as f:
                body = yaml.safe_load(f)
        else:
            body = yaml.safe_load(p["patch"])
        if isinstance(body, list):  # JSON 6902
            target = p.get("target")
            if not target:
                raise ValueError(f"{directory}: a JSON patch needs a target")
            hits = [i for i, r in enumerate(resources) if _matches(r, target)]
            for i in hits:
                resources[i] = json6902(resources[i], body)
        else:  # strategic merge, target from the patch itself unless given
            target = p.get("target") or {"kind": body["kind"], "name": body["metadata"]["name"]}
            hits = [i for i, r in enumerate(resources) if _matches(r, target)]
            if body.get("$patch") == "delete":  # the whole object goes
                resources[:] = [r for i, r in enumerate(resources) if i not in hits]
            else:
                for i in hits:
                    resources[i] = strategic_merge(resources[i], body)
        if not hits:
            raise ValueError(f"{directory}: patch {p.get('path', target)} matches no resource")


def render(directory, expect_kind="Kustomization"):
    """The resources `kustomize build directory` outputs, for the features used in deploy/
    (resources, components, patches: strategic merge and JSON 6902, images). Anything else in a
    kustomization is an error rather than silently ignored."""
    kfile = kustomization_file(directory)
    with open(kfile) as f:
        k = yaml.safe_load(f)
    kind = k.get("kind", "Kustomization")
    if kind != expect_kind:
        raise ValueError(f"{kfile}: kind {kind}, expected {expect_kind}")
    unknown = set(k) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(f"{kfile}: fields not supported by this renderer: {sorted(unknown)}")
    resources = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(p):
            resources += render(p)
        elif os.path.isfile(p):
            resources += load_docs(p)
        else:
            raise FileNotFoundError(f"{kfile}: resource {r} does not exist")
    for c in k.get("components", []):
        p = os.path.normpath(os.path.join(directory, c))
        resources += render_component(p, resources)
    _apply_patches(resources, k.get("patches", []), directory)
    _set_images(resources, k.get("images", []))
    return resources


def render_component(directory, accumulated):
    """A Component adds its resources to the kustomization that includes it and applies its
    patches and images to everything accumulated so far (in place). Returns the new ones."""
    kfile = kustomization_file(directory)
    with open(kfile) as f:
        k = yaml.safe_load(f)
    if k.get("kind") != "Component":
        raise ValueError(f"{kfile}: not a Component")
    unknown = set(k) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(f"{kfile}: fields not supported by this renderer: {sorted(unknown)}")
    added = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        added += render(p) if os.path.isdir(p) else load_docs(p)
    everything = accumulated + added
    _apply_patches(everything, k.get("patches", []), directory)
    _set_images(everything, k.get("images", []))
    accumulated[:] = everything[:len(accumulated)]
    return everything[len(accumulated):]


def index(resources):
    return {(r["kind"], r["metadata"]["name"]): r for r in resources}


# ---- PromQL ---------------------------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset", "inf", "nan", "atan2"}

GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h",
                     "datasource": "prometheus"}


def substitute_grafana(expr, all_value=".*"):
    """Grafana template variables -> values Prometheus accepts ($job etc. -> '.*')."""
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return GRAFANA_VARIABLES.get(name, all_value)
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", repl, expr)


def metric_names(expr):
    """Metric names an expression selects: identifiers that are neither functions (followed by
    '('), nor keywords, nor inside label matchers, grouping clauses or strings."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if word.lower() in PROMQL_KEYWORDS:
            continue
        if re.fullmatch(r"\d+(\.\d+)?(e\d+)?", word) or re.fullmatch(r"[0-9.]+[smhdwy]", word):
            continue
        if s[m.start() - 1:m.start()].isdigit():  # 1e3 and the like
            continue
        names.add(word)
    return names


def dashboard_queries(path):
    """[(panel title, expr)] of every target of every panel (rows' nested panels included),
    plus the template variables' queries as ('variable NAME', query)."""
    with open(path) as f:
        d = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", ""), t["expr"]))
            walk(p.get("panels", []))
    walk(d.get("panels", []))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", q or "")
        if m:
            out.append((f"variable {v['name']}", m.group(1)))
        elif q:
            out.append((f"variable {v['name']}", q))
    return d, out


def alert_rules(path):
    with open(path) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def exposition_names(text):
    """Sample names (with _bucket/_sum/_count/_total as exposed) and families of a Prometheus
    text exposition."""
    samples, families = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            families[name] = kind.strip()
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return samples, families


def shell_words(text):
    return shlex.split(text)
