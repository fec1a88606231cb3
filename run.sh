#!/usr/bin/env bash
# The main job: set up, get the data, build, train shakespeare-char on the CPU (char-level,
# last 10% of tinyshakespeare held out for validation), then print a sample. `kiln train` prints
# the memory summary by category at the end of training.
set -euo pipefail
cd "$(dirname "$0")"

scripts/setup.sh
scripts/get_data.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

# TODO(core): settle the final train/sample flags (steps, batch, seq, lr, eval interval) once
# `kiln train` lands; the preset carries the tuned defaults, so the line below should stay short.
./build/apps/kiln train --preset shakespeare-char --data data/text/tinyshakespeare.txt \
  --tokenizer char --device cpu --out runs/shakespeare-char
./build/apps/kiln sample --ckpt runs/shakespeare-char/final.h5 --prompt "ROMEO:" \
  --temperature 0.8 --top-k 40 --seed 1
