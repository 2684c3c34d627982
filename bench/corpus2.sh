#!/usr/bin/env bash
# The cost-to-target benchmark's second corpus: Python's standard library
# source as Debian packages it (libpython3.11-minimal and libpython3.11-stdlib,
# PSF license), one document per module file. Where the fortunes corpus is
# ~15k short quotes (median 99 tokens), this is ~500 long documents (median
# ~11k tokens, the longest ~750k): padding costs a pad-to-seq_len baseline
# under 1% of its rows here (fortunes: about half at seq_len 256), but that
# baseline takes each file's chunks in order, so consecutive rows and steps
# come from one file.
#   bench/corpus2.sh OUT_DIR      # writes OUT_DIR/{train,val}.{bin,idx,json}
# Installs the packages if missing (they come with python3 on Debian 12) and
# does nothing when OUT_DIR/train.idx exists. PYVER (default 3.11) picks the
# packages; TALLY_PREP the tally-prep binary (default: the checkout's
# ${BUILD_DIR:-build}/cli/tally-prep); PREP_ARGS more tally-prep flags (e.g.
# --val_tokens=65536).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
# Paths given are relative to where the script is run from; the default
# tally-prep is the checkout's.
OUT=$(realpath -m -- "$1")
if [ -n "${TALLY_PREP:-}" ]; then
  PREP=$(realpath -m -- "$TALLY_PREP")
else
  PREP=$(realpath -m -- "$(dirname "$0")/../${BUILD_DIR:-build}/cli/tally-prep")
fi
PYVER=${PYVER:-3.11}
PACKAGES=("libpython$PYVER-minimal" "libpython$PYVER-stdlib")

if [ -s "$OUT/train.idx" ]; then
  echo "corpus2: $OUT already prepared"
  exit 0
fi
[ -x "$PREP" ] || { echo "corpus2: no tally-prep at $PREP (build it, or set TALLY_PREP)" >&2; exit 1; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "corpus2: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Every non-empty module the packages install, tests left out, in path order
# (LC_ALL=C: the same order everywhere, so the same dataset bytes).
# Written beside OUT and renamed into place, so an interrupted run is never
# taken for a finished one.
list=$(mktemp)
tmp=$OUT.partial
trap 'rm -rf "$list" "$tmp"' EXIT
dpkg-query -L "${PACKAGES[@]}" | { grep -E '\.py$' || true; } |
  { grep -v -E '/(test|tests|idle_test)/' || true; } | LC_ALL=C sort -u |
  while IFS= read -r f; do
    if [ -f "$f" ] && [ -s "$f" ]; then printf '%s\n' "$f"; fi
  done >"$list"
[ -s "$list" ] || { echo "corpus2: no Python sources found in ${PACKAGES[*]}" >&2; exit 1; }
echo "corpus2: $(wc -l <"$list") files from ${PACKAGES[*]}"
rm -rf "$tmp" && mkdir -p "$tmp"
# shellcheck disable=SC2086  # PREP_ARGS: more tally-prep flags, split on spaces
xargs -d '\n' "$PREP" --out="$tmp" --split=file ${PREP_ARGS:-} <"$list"
rm -rf "$OUT" && mv "$tmp" "$OUT"
