#!/usr/bin/env bash
# Prints, one per line, the distribution packages that hold the shared libraries the given
# binaries load (ldd), so that the Dockerfile's runtime stage installs exactly those and
# nothing of the toolchain. Run on the machine (or build stage) that built the binaries; the
# runtime image must be the same distribution release.
#   tools/runtime_packages.sh build/server/glm-server build/client/glm-client
# The CUDA toolkit's libraries (under /usr/local/cuda*: cudart, cuBLAS) are left out, with a
# note on stderr: the CUDA runtime image the binaries run on provides them.
# Fails (exit 1) naming any other library that no installed package owns, or that ldd cannot
# find.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

owner() {  # owner PATH -> package name, trying the path as given, resolved, and /usr-merged
  local p=$1 real alt q
  real=$(readlink -f "$p")
  for q in "$p" "$real"; do
    case $q in
      /usr/*) alt=${q#/usr} ;;
      *) alt=/usr$q ;;
    esac
    for candidate in "$q" "$alt"; do
      if out=$(dpkg-query -S "$candidate" 2>/dev/null); then
        # "pkg:arch: /path" (or "pkg1, pkg2: /path" for shared paths): the first package.
        echo "${out%%: *}" | cut -d, -f1 | cut -d: -f1
        return 0
      fi
    done
  done
  return 1
}

status=0
libs=()
for bin in "$@"; do
  [ -x "$bin" ] || { echo "runtime_packages: $bin is not an executable" >&2; exit 1; }
  while read -r line; do
    case $line in
      *"=> not found"*)
        echo "runtime_packages: $bin: ${line%% *} not found by ldd" >&2
        status=1
        ;;
      *"=> /"*)
        path=${line#*=> }
        libs+=("${path%% (*}")
        ;;
      /*)  # the dynamic loader itself: "/lib64/ld-linux-x86-64.so.2 (0x...)"
        libs+=("${line%% (*}")
        ;;
    esac
  done < <(ldd "$bin")
done

packages=()
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
  case $(readlink -f "$lib") in
    /usr/local/cuda*)
      echo "runtime_packages: $lib: from the CUDA runtime image" >&2
      continue
      ;;
  esac
  if pkg=$(owner "$lib"); then
    packages+=("$pkg")
  else
    echo "runtime_packages: no installed package owns $lib" >&2
    status=1
  fi
done
[ $status -eq 0 ] || exit 1
printf '%s\n' "${packages[@]}" | sort -u
