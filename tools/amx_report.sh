#!/usr/bin/env bash
# The tables of an AMX check's logs (tools/amx_bundle_run.sh): the host, every step's outcome,
# glmserve's cpu_bench rows with the same-run peaks, llama.cpp's rows, the greedy check.
#
#   tools/amx_report.sh LOG_DIR
set -uo pipefail
dir="${1:?usage: tools/amx_report.sh LOG_DIR}"
section() { printf '\n== %s\n' "$1"; }

section host
grep -E '^(Model name|Socket|Core|Thread|CPU\(s\)|L[23]|NUMA node\(s\))' "$dir/host.txt"
grep -m 1 'GNU libc\|GLIBC' "$dir/host.txt"
section steps
cat "$dir/summary.txt"
section "glmserve cpu_bench"
grep -E '^(machine|model|\||  )' "$dir/cpu_bench.log" 2>/dev/null
for f in linear_bench attention_bench int8_kernel_bench; do
  [ -s "$dir/$f.log" ] && { section "$f"; grep -E '^(machine|\|)' "$dir/$f.log"; }
done
section "llama.cpp (llama-bench: t/s; llama-batched-bench: S_TG t/s is decode)"
for f in "$dir"/llama_*.log; do
  [ -s "$f" ] || continue
  echo "-- $(basename "$f" .log)"
  grep -E '^\|' "$f" | grep -v -e '^| *- *|' -e '^|--' || tail -n 3 "$f"
  grep -m 2 -i -E 'AMX|repack' "$f"
done
section "greedy (conversion check)"
cat "$dir/greedy_llama.log" 2>/dev/null | tail -n 1
grep '^greedy' "$dir/greedy_glmserve.log" 2>/dev/null
