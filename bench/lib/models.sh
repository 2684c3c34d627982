# Sourced by benches: the demo corpus and the dense model several benches
# start from, made when missing. Needs B (the build folder).

# build/demo/fortunes, as `make demo` prepares it.
ensure_fortunes() {
  if [ ! -s "$B/demo/fortunes/train.idx" ]; then
    "$B/cli/tally-prep" --out="$B/demo/fortunes" /usr/share/games/fortunes/*.u8
  fi
}

# tinyshakespeare ($SHAKESPEARE, default ../shared/data/tinyshakespeare.txt)
# cut into speeches at blank lines, as $B/bench/shakespeare: prints that
# folder, or nothing where the text is missing.
ensure_shakespeare() {
  local text=${SHAKESPEARE:-../shared/data/tinyshakespeare.txt}
  [ -s "$text" ] || return 0
  [ -s "$B/bench/shakespeare/train.idx" ] ||
    "$B/cli/tally-prep" --out="$B/bench/shakespeare" --split=blank "$text" >/dev/null
  echo "$B/bench/shakespeare"
}

# The dense model bench/upcycle/dense.yaml trains (600 steps on fortunes),
# checkpointed at $DENSE.
DENSE=$B/bench/upcycle/dense/step-00000600.ckpt
ensure_dense() {
  ensure_fortunes
  if [ ! -s "$DENSE" ]; then
    echo "== the dense model: 600 steps (bench/upcycle/dense.yaml) =="
    "$B/worker/tally-train" --spec=bench/upcycle/dense.yaml \
      --checkpoint_dir="$B/bench/upcycle/dense" --threads=1 --log_every=100 |
      grep -E "^eval|trained"
  fi
}
