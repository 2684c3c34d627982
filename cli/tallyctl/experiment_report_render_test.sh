#!/bin/sh
# Renders experiment_report_sample's SVGs with librsvg (rsvg-convert, Debian
# package librsvg2-bin), whose XML parser is strict: a malformed document, a
# bad character or an unparsable attribute fails it. Exits 77 (skipped) when
# rsvg-convert is not installed.
# Usage: experiment_report_render_test.sh SAMPLE_BINARY
set -eu
sample=$1
if ! command -v rsvg-convert >/dev/null 2>&1; then
  echo "rsvg-convert not installed (apt-get install librsvg2-bin): skipped"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$sample" "$dir"
count=0
for svg in "$dir"/*.svg; do
  png=${svg%.svg}.png
  if ! rsvg-convert --format=png --output="$png" "$svg"; then
    echo "FAIL: rsvg-convert could not render $(basename "$svg")"
    exit 1
  fi
  # A PNG, and not a blank one: a white 880x480 image compresses to well
  # under 4 KB; the plots, text and legend make it far larger.
  if [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" != "89504e470d0a1a0a" ] ||
     [ "$(wc -c < "$png")" -lt 4000 ]; then
    echo "FAIL: $(basename "$png") is not a non-blank PNG ($(wc -c < "$png") bytes)"
    exit 1
  fi
  count=$((count + 1))
done
[ "$count" -eq 6 ] || { echo "FAIL: expected 6 samples, rendered $count"; exit 1; }
echo "rendered $count experiment reports with $(rsvg-convert --version)"
