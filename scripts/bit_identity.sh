#!/usr/bin/env bash
# Fingerprints of what kiln computes, to show a refactor changed nothing (issue 19: "bit-identical
# outputs before and after"). Prints one line per job: the sha256 of a short training run's
# losses and gradient norms (f32 and bf16; a char model and a GQA llama2.c-shaped one) and of generations sampled
# at temperature 1.5 (so that the logits decide) from seeded random Qwen3-0.6B weights (f32 and
# bf16). Run it on the old and the new commit, on the same machine and thread count, and diff.
# Compare like builds: loading the CUDA libraries alone adds ~80 M instructions to the callgrind
# count (bench/results/bit_identity_20261128.md), so build both with -DKILN_CUDA=OFF, or both with.
#
#   scripts/bit_identity.sh [BUILD_DIR] > before.txt
#   KILN_CALLGRIND=1 scripts/bit_identity.sh build   # also the instruction count of one run
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
kiln="$build/apps/kiln"
data=../shared/data
[[ -d $data ]] || data=data
work=/tmp/kiln_bit_identity
rm -rf "$work" && mkdir -p "$work"

[[ -x $kiln ]] || { echo "[bit_identity] no $kiln: build first" >&2; exit 1; }

train() {  # name, extra args...
  local name=$1
  shift
  "$kiln" train --data "$data/text/tinyshakespeare.txt" --steps 8 --batch 4 --seq 64 --threads 1 \
    --eval-interval 4 --eval-batches 2 --out "$work/$name" --overwrite "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; exit 1; }
  # Every step's loss and gradient norm (printed to 17 digits) and the validation losses: they
  # depend on every weight. (final.h5 itself differs run to run in HDF5's metadata bytes.)
  echo "train $name $(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("step"), r.get("loss"), r.get("norm"), r.get("val_loss"))' "$work/$name/log.jsonl" |
    sha256sum | cut -d' ' -f1)"
}

generate() {  # name, dtype[, config.json]
  local out
  out=$("$kiln" generate --config "${3:-$data/qwen/Qwen3-0.6B/config.json}" --random-weights \
    --weights-seed 7 --dtype "$2" --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 12 \
    --temperature 1.5 --top-k 0 --top-p 1 --seed 3 2>/dev/null | head -1)
  echo "generate $1 $(sha256sum <<<"$out" | cut -d' ' -f1)"
}

train char_f32 --dtype f32
train char_bf16 --dtype bf16
train stories260k_f32 --preset stories260K --tokenizer byte --dtype f32
train stories260k_bf16 --preset stories260K --tokenizer byte --dtype bf16
generate qwen3_0.6b_f32 f32
generate qwen3_0.6b_bf16 bf16
# A small GPT-2 (plain MLP with the tanh GELU, LayerNorm, learned positions). The activations
# themselves are pinned by the golden tests (tests/models/test_golden.cpp, against PyTorch).
cat >"$work/gpt2.json" <<EOF
{"model_type": "gpt2", "vocab_size": 512, "n_embd": 128, "n_layer": 2, "n_head": 4,
 "n_positions": 256, "activation_function": "gelu_new"}
EOF
generate gpt2_f32 f32 "$work/gpt2.json"

if [[ ${KILN_CALLGRIND:-0} == 1 ]]; then
  # Instructions of 3 f32 steps of the char model on one thread (the refactor's cost on the CPU).
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$kiln" train \
    --data "$data/text/tinyshakespeare.txt" --steps 3 --batch 2 --seq 32 --threads 1 --dtype f32 \
    --eval-interval 0 --eval-batches 1 --out "$work/cg" --overwrite >/dev/null 2>"$work/cg.log" ||
    { cat "$work/cg.log" >&2; exit 1; }
  echo "callgrind_instructions $(grep -m1 -E '^(summary|totals):' "$work/cg.out" | awk '{print $2}')"
fi
