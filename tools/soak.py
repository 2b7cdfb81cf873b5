#!/usr/bin/env python3
"""Soak test (run by hand, not in CI): a real glm-server under a mixed load for a given time.

    python3 tools/soak.py --duration=600            # 10 minutes, glm-4.5-mini, build/
    python3 tools/soak.py --duration=60 --model=tiny

The load (32 concurrent streams in all, every one through glm-client):
  generate, short prompts (16 tokens, 32 new)                 concurrency 12
  generate, long prompts (400 tokens, 16 new)                 concurrency  6
  generate with a 250 ms deadline (client cancels mid-stream) concurrency  4
  forward, 64 tokens, last-position logits                    concurrency  6
  forward sessions: create, 6 continuations of 64 tokens, close 4 pipelines
It samples the server's resident memory (VmRSS) and the KV cache usage from /metrics every
few seconds, then fails (exit 1) on any status code the mix does not provoke (allowed:
DEADLINE_EXCEEDED from the deadline stream, CANCELLED, NOT_FOUND for evicted sessions,
RESOURCE_EXHAUSTED when the KV cache or sessions' share is full), or when RSS grows by more
than --rss_growth_mb between the end of the warm-up (first fifth) and the end. Prints a table.
"""

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(r"^(glmserve_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
        if m and m.group(2) in (None, ""):
            values[m.group(1)] = float(m.group(3))
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=600, help="seconds of load")
    ap.add_argument("--model", default="glm-4.5-mini")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    # Small enough that sessions hit their share and Generate needs their blocks (eviction).
    ap.add_argument("--kv_capacity_tokens", type=int, default=4096)
    ap.add_argument("--rss_growth_mb", type=float, default=64.0)
    ap.add_argument("--sample_every", type=float, default=10.0)
    args = ap.parse_args()
    # Private copies: a rebuild during the run must not swap the binaries under it.
    bindir = tempfile.mkdtemp(prefix="glmserve-soak-")
    server_bin = shutil.copy(os.path.join(args.build, "server/glm-server"), bindir)
    client_bin = shutil.copy(os.path.join(args.build, "client/glm-client"), bindir)
    port, metrics_port = 50871, 9871

    server = subprocess.Popen(
        [server_bin, f"--model={args.model}", "--address=127.0.0.1", f"--port={port}",
         f"--metrics_port={metrics_port}", f"--kv_capacity_tokens={args.kv_capacity_tokens}",
         "--session_idle_timeout=60s", "--max_sessions=16"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:
        if "ready" in line:
            break
    else:
        sys.exit("glm-server did not become ready")
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    target = f"--target=127.0.0.1:{port}"
    end = time.time() + args.duration

    def bench(name, extra):
        return name, subprocess.Popen(
            [client_bin, target, "--max_attempts=1", f"--duration={args.duration}s"] + extra +
            ["bench"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    prompt = ",".join(str(1 + i * 3) for i in range(64))  # in every model's vocabulary
    benches = [
        bench("generate short", ["--rpc=generate", "--concurrency=12", "--prompt_len=16",
                                 "--max_new_tokens=32"]),
        bench("generate long", ["--rpc=generate", "--concurrency=6", "--prompt_len=400",
                                "--max_new_tokens=16"]),
        bench("generate 250ms deadline", ["--rpc=generate", "--concurrency=4",
                                          "--prompt_len=32", "--max_new_tokens=64",
                                          "--timeout=250ms"]),
        bench("forward logits", ["--rpc=forward", "--concurrency=6", "--prompt_len=64",
                                 "--forward_logits"]),
    ]
    session_codes = collections.Counter()
    lock = threading.Lock()

    def pipeline(k):
        n = 0
        while time.time() < end:
            sid = f"soak-{k}-{n}"
            n += 1
            for step in range(7):
                cmd = [client_bin, target, "--max_attempts=1", f"--prompt={prompt}",
                       f"--session={sid}", "--hidden", "--logits=false", "forward"]
                if step == 0:
                    cmd.insert(-1, "--create_session")
                r = subprocess.run(cmd, capture_output=True, text=True)
                code = "OK" if r.returncode == 0 else (
                    re.search(r"\b([A-Z_]{4,})\b", r.stdout + r.stderr) or [None, "FAILED"])[1]
                with lock:
                    session_codes[code] += 1
                if r.returncode != 0:
                    break
            # Close when the client has the command; otherwise the idle timeout frees it.
            subprocess.run([client_bin, target, f"--session={sid}", "close-session"],
                           capture_output=True)

    pipelines = [threading.Thread(target=pipeline, args=(k,), daemon=True) for k in range(4)]
    for t in pipelines:
        t.start()

    samples = []
    t0 = time.time()
    while time.time() < end:
        time.sleep(args.sample_every)
        m = scrape(metrics_port)
        samples.append((time.time() - t0, rss_mb(server.pid), m.get("glmserve_kv_cache_usage_ratio", 0.0),
                        m.get("glmserve_sessions_active", 0.0),
                        m.get("glmserve_sessions_evicted_total", 0.0)))
        print(f"  t={samples[-1][0]:6.0f}s rss={samples[-1][1]:7.1f} MiB kv={samples[-1][2]:.2f} "
              f"sessions={samples[-1][3]:.0f} evicted={samples[-1][4]:.0f}", flush=True)
    for t in pipelines:
        t.join(timeout=60)

    allowed = {"DEADLINE_EXCEEDED", "CANCELLED", "NOT_FOUND", "RESOURCE_EXHAUSTED"}
    failures = []
    print(f"\n| load | calls | errors |\n|---|---|---|")
    for name, proc in benches:
        out, _ = proc.communicate(timeout=120)
        calls = re.search(r"calls ok (\d+)", out)
        errors = dict(re.findall(r"([A-Z_]+)=(\d+)", out.split("errors:")[-1])) if "errors:" in out else {}
        print(f"| {name} | {calls.group(1) if calls else '?'} | "
              f"{', '.join(f'{k}={v}' for k, v in errors.items()) or 'none'} |")
        bad = set(errors) - allowed
        if bad or "calls ok" not in out:
            failures.append(f"{name}: unexpected codes {sorted(bad)} (exit {proc.returncode})\n{out}")
    print(f"| forward sessions (4 pipelines) | {sum(session_codes.values())} | "
          f"{', '.join(f'{k}={v}' for k, v in sorted(session_codes.items()) if k != 'OK') or 'none'} |")
    bad = set(session_codes) - allowed - {"OK"}
    if bad:
        failures.append(f"sessions: unexpected codes {sorted(bad)}")

    warm = samples[max(0, len(samples) // 5 - 1)][1] if samples else float("nan")
    last = samples[-1][1] if samples else float("nan")
    peak = max(s[1] for s in samples) if samples else float("nan")
    print(f"\nRSS after warm-up {warm:.1f} MiB, at the end {last:.1f} MiB, peak {peak:.1f} MiB; "
          f"KV usage peak {max(s[2] for s in samples):.2f}; sessions evicted "
          f"{samples[-1][4]:.0f}" if samples else "no samples")
    if last - warm > args.rss_growth_mb:
        failures.append(f"RSS grew {last - warm:.1f} MiB after warm-up (bound {args.rss_growth_mb})")
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)
    shutil.rmtree(bindir, ignore_errors=True)
    if server.returncode != 0:
        failures.append(f"glm-server exited {server.returncode} on SIGTERM")
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nsoak passed")


if __name__ == "__main__":
    main()
