#!/usr/bin/env bash
# stage-runtime.sh [--dry-run] OUT [--tree DIR]... BINARY...
#
# Collects what a runtime image needs to run BINARY... (run in a build stage,
# after the build):
#   OUT/root/usr/local/bin/   the binaries, without debug sections
#   OUT/root/<same path>      every shared library they load (ldd's closure) that
#                             no distribution package provides: LibTorch and the
#                             CUDA libraries, at the absolute paths their RPATHs
#                             name; plus each --tree DIR whole (libraries loaded
#                             with dlopen, which ldd cannot see: cuDNN's engines)
#   OUT/packages.txt          the distribution packages that provide the rest
#   OUT/files.txt             every staged file with its size, and the total
# The final stage installs packages.txt and copies OUT/root to /, so nothing
# else from the build (sources, build tree, headers, the torch wheel, the
# kubectl venv) reaches the image.
#
# --dry-run writes OUT/packages.txt and OUT/files.txt (sizes as found, the
# binaries with their debug sections) and copies nothing.
#
# A library that resolves nowhere is an error, except the GPU driver's
# (libcuda, libnvidia-ml): the NVIDIA container runtime mounts those.
set -euo pipefail

dry_run=0
if [ "${1:-}" = --dry-run ]; then dry_run=1; shift; fi
if [ $# -lt 2 ]; then
  echo "usage: $0 [--dry-run] OUT [--tree DIR]... BINARY..." >&2
  exit 2
fi
OUT=$1
shift
trees=()
bins=()
while [ $# -gt 0 ]; do
  case $1 in
    --tree) trees+=("$2"); shift 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
if [ ${#bins[@]} -eq 0 ]; then
  echo "$0: no binaries given" >&2
  exit 2
fi

rm -rf "$OUT"
mkdir -p "$OUT/root/usr/local/bin"

# The spellings dpkg may have recorded PATH under: Debian 12 and Ubuntu merge
# /lib into /usr/lib, and a library's name is often a symbolic link.
spellings() {
  local p=$1 real
  real=$(realpath "$p")
  printf '%s\n' "$p" "$real" "/usr$p" "/usr$real" "${p#/usr}" "${real#/usr}"
}

declare -A packages=() libs=() owner=()
resolved=()
missing=()
for bin in "${bins[@]}"; do
  [ -x "$bin" ] || { echo "$0: $bin is not an executable" >&2; exit 1; }
  while read -r name arrow path _; do
    if [ "$arrow" != "=>" ]; then continue; fi
    if [ "$path" = "not" ]; then
      case $name in
        libcuda.so.*|libnvidia-ml.so.*) ;;
        *) missing+=("$name (needed by $bin)") ;;
      esac
      continue
    fi
    resolved+=("$path")
  done < <(ldd "$bin")
done
# One dpkg query for every spelling of every library (each query reads the
# whole package database).
mapfile -t candidates < <(for p in "${resolved[@]}"; do spellings "$p"; done | sort -u)
while IFS= read -r line; do
  case $line in diversion*) continue ;; esac
  owner[${line#*: }]=${line%%:*}
done < <(dpkg-query -S "${candidates[@]}" 2>/dev/null || true)
for path in "${resolved[@]}"; do
  case $path in
    /opt/*|/usr/local/*) libs[$path]=1; continue ;;
  esac
  pkg=""
  while IFS= read -r q; do
    if [ -n "${owner[$q]:-}" ]; then pkg=${owner[$q]}; break; fi
  done < <(spellings "$path")
  if [ -n "$pkg" ]; then packages[$pkg]=1; else libs[$path]=1; fi
done
if [ ${#missing[@]} -gt 0 ]; then
  printf '%s: unresolved library: %s\n' "$0" "${missing[@]}" >&2
  exit 1
fi
for tree in "${trees[@]}"; do
  [ -d "$tree" ] || { echo "$0: --tree $tree is not a directory" >&2; exit 1; }
done

printf '%s\n' "${!packages[@]}" | sort > "$OUT/packages.txt"
if [ "$dry_run" = 1 ]; then
  {
    for bin in "${bins[@]}"; do printf '%s\t/usr/local/bin/%s\n' "$(stat -L -c %s "$bin")" "$(basename "$bin")"; done
    for lib in "${!libs[@]}"; do printf '%s\t%s\n' "$(stat -L -c %s "$lib")" "$lib"; done
    for tree in "${trees[@]}"; do find -L "$tree" -type f -printf '%s\t%p\n'; done
  } | sort -n -r > "$OUT/files.txt"
else
  for bin in "${bins[@]}"; do
    # Symbols stay (for backtraces); the debug sections of RelWithDebInfo go.
    cp -L "$bin" "$OUT/root/usr/local/bin/"
    strip --strip-debug "$OUT/root/usr/local/bin/$(basename "$bin")"
  done
  for lib in "${!libs[@]}"; do cp -L --parents "$lib" "$OUT/root/"; done
  for tree in "${trees[@]}"; do cp -a --parents "$tree" "$OUT/root/"; done
  (cd "$OUT/root" && find . -type f -printf '%s\t/%P\n' | sort -n -r) > "$OUT/files.txt"
fi
total=$(awk -F'\t' '{ s += $1 } END { print s + 0 }' "$OUT/files.txt")
printf '%s\ttotal bytes staged\n' "$total" >> "$OUT/files.txt"
echo "staged $(($(wc -l < "$OUT/files.txt") - 1)) files, $((total / 1048576)) MiB; packages: $(tr '\n' ' ' < "$OUT/packages.txt")"
