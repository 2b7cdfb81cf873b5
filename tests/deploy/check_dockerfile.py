#!/usr/bin/env python3
"""Static checks of the Dockerfile and .dockerignore (no Docker engine runs in CI).

- stages: a build stage on an NVIDIA CUDA devel image and one on Debian 12 (CPU variant),
  chosen by the VARIANT build argument; runtime stages on the matching CUDA runtime image and
  Debian 12 slim; the final stage is the runtime built FROM runtime-${VARIANT};
- the build stage runs CI's own scripts: tools/install_deps.sh and tools/build.sh, which
  .ci/run reaches through tools/test.sh; the CUDA variant passes -DGLMSERVE_CUDA=ON and the CPU
  one -DGLMSERVE_CUDA=OFF; the runtime stage installs the packages tools/runtime_packages.sh
  listed and copies glm-server and glm-client from the build stage;
- the final stage: a numeric non-root USER, EXPOSE equal to glm-server's default --port and
  --metrics_port (server/main.cc), ENTRYPOINT exec form running glm-server with
  --address=0.0.0.0, every flag it passes a real glm-server flag;
- every file the Dockerfile COPYs from the context is in the repository and not excluded by
  .dockerignore, while build trees and .git are excluded.
"""
import argparse
import fnmatch
import os
import re
import sys

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402


def dockerignore_excludes(patterns, path):
    """Docker's rules, for the patterns used here: root-anchored globs, '**' for any depth,
    later '!' patterns re-include. A directory pattern excludes everything below it."""
    excluded = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat[1:] if neg else pat
        pat = pat.strip("/")
        rx = re.escape(pat).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        rx = rx.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if re.fullmatch(rx + "(?:/.*)?", path):
            excluded = not neg
    return excluded


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    root = ap.parse_args().root
    f = dl.Failures()
    global_args, stages = dl.parse_dockerfile(os.path.join(root, "Dockerfile"))
    by_name = {s.name: s for s in stages if s.name}
    flags = dl.server_flags(root)

    # ---- stages and variants
    variant = global_args.get("VARIANT")
    f.check(variant == "cuda", f"default VARIANT is {variant!r}, expected 'cuda'")
    tc_cuda, tc_cpu = by_name.get("toolchain-cuda"), by_name.get("toolchain-cpu")
    f.check(tc_cuda is not None and re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-devel-ubuntu\$\{UBUNTU_VERSION\}", tc_cuda.base),
            f"toolchain-cuda must be FROM nvidia/cuda:<version>-devel-ubuntu<version>, is {tc_cuda and tc_cuda.base}")
    f.check(tc_cpu is not None and dl.substitute(tc_cpu.base, global_args) == "debian:bookworm",
            f"toolchain-cpu must be FROM debian:bookworm (Debian 12, as CI), is {tc_cpu and tc_cpu.base}")
    rt_cuda, rt_cpu = by_name.get("runtime-cuda"), by_name.get("runtime-cpu")
    f.check(rt_cuda is not None and rt_cuda.base.replace("-runtime-", "-devel-") == (tc_cuda.base if tc_cuda else None),
            "runtime-cuda must be the CUDA runtime image of the build's CUDA and Ubuntu versions")
    f.check(rt_cpu is not None and dl.substitute(rt_cpu.base, global_args) == "debian:bookworm-slim",
            "runtime-cpu must be FROM debian:bookworm-slim (the build's release)")
    if tc_cuda:
        env = " ".join(tc_cuda.all("ENV"))
        f.check("-DGLMSERVE_CUDA=ON" in env, "the CUDA toolchain stage must set -DGLMSERVE_CUDA=ON")
    if tc_cpu:
        env = " ".join(tc_cpu.all("ENV"))
        f.check("-DGLMSERVE_CUDA=OFF" in env, "the CPU toolchain stage must set -DGLMSERVE_CUDA=OFF")
    build = by_name.get("build")
    f.check(build is not None and build.base == "toolchain-${VARIANT}", "stage 'build' must be FROM toolchain-${VARIANT}")
    final = stages[-1]
    f.check(final.base == "runtime-${VARIANT}", f"the last stage must be FROM runtime-${{VARIANT}}, is {final.base}")
    f.check(len(stages) >= 5, f"expected a multi-stage build, found {len(stages)} stage(s)")

    # ---- the build runs CI's scripts
    ci = open(os.path.join(root, ".ci/run")).read()
    test_sh = open(os.path.join(root, "tools/test.sh")).read()
    build_sh = open(os.path.join(root, "tools/build.sh")).read()
    f.check("tools/test.sh" in ci, ".ci/run must run tools/test.sh")
    f.check(re.search(r"^[^#\n]*bash tools/build\.sh", test_sh, re.M) is not None,
            "tools/test.sh must build through tools/build.sh (the Dockerfile's build)")
    f.check(re.search(r"^[^#\n]*bash tools/install_deps\.sh", build_sh, re.M) is not None,
            "tools/build.sh must install dependencies through tools/install_deps.sh")
    f.check(re.search(r"^[^#\n]*cmake -S \. -B", build_sh, re.M) is not None and
            re.search(r"^[^#\n]*cmake --build", build_sh, re.M) is not None,
            "tools/build.sh must configure and build with cmake")
    if build:
        runs = build.all("RUN")
        f.check(any(re.search(r"\bbash tools/install_deps\.sh\b", r) for r in runs),
                "the build stage must RUN tools/install_deps.sh")
        build_runs = [r for r in runs if re.search(r"\bbash tools/build\.sh\b", r)]
        f.check(len(build_runs) == 1, "the build stage must RUN tools/build.sh exactly once")
        for r in build_runs:
            f.check("${GLMSERVE_CMAKE_ARGS}" in r, "tools/build.sh must get the variant's ${GLMSERVE_CMAKE_ARGS}")
            for target in ("glm-server", "glm-client"):
                f.check(target in r, f"the build must build {target}")
        f.check(any("tools/runtime_packages.sh" in r for r in runs),
                "the build stage must list the runtime packages with tools/runtime_packages.sh")
        f.check(not any(re.search(r"\b(cmake|make|ninja)\s", r) and "tools/build.sh" not in r for r in runs),
                "the build stage must not call cmake/make itself: CI's tools/build.sh does")
        copies = build.all("COPY")
        f.check(any(c.split()[0] == "." for c in copies), "the build stage must COPY the sources")

    # ---- runtime stage
    runs = " ".join(final.all("RUN"))
    f.check("runtime-packages.txt" in runs and "apt-get install" in runs and "--no-install-recommends" in runs,
            "the runtime stage must install exactly the listed runtime packages")
    f.check("rm -rf /var/lib/apt/lists" in runs, "the runtime stage must drop apt's lists")
    copied = " ".join(c for c in final.all("COPY") if c.startswith("--from=build"))
    f.check("/out/bin" in copied, "the runtime stage must copy the binaries from the build stage")
    f.check(not any(c for c in final.all("COPY") if not c.startswith("--from=")),
            "the runtime stage must copy nothing from the build context (binaries and libraries only)")
    user = final.last("USER")
    f.check(user is not None, "the final stage needs a USER")
    if user:
        uid = user.split(":")[0]
        f.check(uid.isdigit() and int(uid) != 0,
                f"USER must be a numeric non-root uid (Kubernetes runAsNonRoot verifies it), is {user}")
        f.check(re.search(rf"useradd\b.*--uid {uid}\b", runs) is not None, f"uid {uid} must be created with useradd")
    exposed = set()
    for e in final.all("EXPOSE"):
        exposed |= {int(p.split("/")[0]) for p in e.split()}
    want = {dl.flag_default_int(flags, "port"), dl.flag_default_int(flags, "metrics_port")}
    f.check(exposed == want, f"EXPOSE {sorted(exposed)} must equal glm-server's default ports {sorted(want)}")
    ep = final.last("ENTRYPOINT")
    f.check(ep is not None and ep.lstrip().startswith("["), "ENTRYPOINT must be in exec form (signals reach glm-server)")
    if ep:
        argv = dl.exec_form(ep)
        f.check(os.path.basename(argv[0]) == "glm-server", f"ENTRYPOINT must run glm-server, runs {argv[0]}")
        f.check(argv[0] == "/usr/local/bin/glm-server" and "/out/bin/" in copied and "/usr/local/bin/" in copied,
                "ENTRYPOINT must run the copied binary /usr/local/bin/glm-server")
        ep_flags = dl.parse_flags(argv[1:])
        f.check(ep_flags.get("address") in ("0.0.0.0", "::", "[::]"),
                f"ENTRYPOINT must listen on every interface (--address=0.0.0.0), has {ep_flags.get('address')}")
        for name in ep_flags:
            f.check(name in flags, f"ENTRYPOINT passes --{name}, which glm-server does not have")
    hc = final.last("HEALTHCHECK")
    if hc:
        live, ready = dl.health_services(root)
        m = re.search(r"--service=(\w*)", hc)
        f.check(m is not None and m.group(1) in (live, ready), "HEALTHCHECK must ask a health service glm-server has")
        f.check(f"127.0.0.1:{dl.flag_default_int(flags, 'port')}" in hc, "HEALTHCHECK must probe the default gRPC port")
        # Docker must wait as long as Kubernetes' startupProbe does for a large checkpoint.
        sp = re.search(r"--start-period=(\S+)", hc)
        import yaml
        deployment = yaml.safe_load(open(os.path.join(root, "deploy/base/deployment.yaml")))
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        allowed = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        f.check(sp is not None and dl.parse_duration_seconds(sp.group(1)) >= allowed,
                f"HEALTHCHECK --start-period must be at least the startupProbe's {allowed} s "
                f"(the documented worst-case load), is {sp and sp.group(1)}")

    # ---- .dockerignore
    patterns = [line.strip() for line in open(os.path.join(root, ".dockerignore"))
                if line.strip() and not line.strip().startswith("#")]
    for path in (".git", "build", "build-deploy/x", "out", "deploy/base/deployment.yaml"):
        f.check(dockerignore_excludes(patterns, path), f".dockerignore must exclude {path}")
    needed = ["CMakeLists.txt", "core/engine/engine.cc", "server/main.cc", "client/main.cc", "proto",
              "tools/build.sh", "tools/install_deps.sh", "tools/runtime_packages.sh", "tools/CMakeLists.txt"]
    for stage in stages:
        for c in stage.all("COPY"):
            if c.startswith("--from="):
                continue
            srcs = c.split()[:-1]
            needed += [s for s in srcs if s != "."]
    for path in needed:
        f.check(os.path.exists(os.path.join(root, path)), f"the Dockerfile needs {path}, which does not exist")
        f.check(not dockerignore_excludes(patterns, path), f".dockerignore excludes {path}, which the build needs")
    # Every CMake subdirectory the build configures must be in the context.
    for line in open(os.path.join(root, "CMakeLists.txt")):
        m = re.match(r"\s*add_subdirectory\((\w+)\)", line)
        if m and m.group(1) not in ("tests", "bench"):
            f.check(not dockerignore_excludes(patterns, m.group(1)), f".dockerignore excludes {m.group(1)}/")
    return f.finish("check_dockerfile")


if __name__ == "__main__":
    sys.exit(main())
