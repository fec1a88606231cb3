#!/usr/bin/env bash
# Installs what kiln needs on Debian 12 (bookworm) with apt. Idempotent: packages already
# installed are left alone, and when all are present this is a quick no-op (one dpkg-query).
# Runs as root, or through sudo when not root. Never asks questions.
#
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not installed here: CMake turns the CUDA
# backend on when it finds nvcc (/usr/local/cuda/bin/nvcc), and builds CPU-only otherwise.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libgtest-dev libbenchmark-dev
  libhdf5-dev libopenblas-dev libopenblas-openmp-dev libpcre2-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  # kiln serve: the HTTP server (serve/)
  libcpp-httplib-dev
  # oneDNN: bf16 (AMX / AVX512-BF16) GEMMs on the CPU; OpenMPI: multi-process training (distributed/)
  libdnnl-dev libopenmpi-dev openmpi-bin
  python3 python3-torch python3-numpy python3-h5py
  # scripts/sanitize.sh and scripts/fuzz.sh (one build, scripts/asan_build.sh): clang with libFuzzer
  # and the sanitizer runtimes, and clang's OpenMP runtime
  clang-14 libclang-rt-14-dev libomp-14-dev
)

# dpkg-query prints "install ok installed" for each installed package; anything else is missing.
missing=()
status=$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)
for p in "${packages[@]}"; do
  if ! grep -q "^${p} install ok installed$" <<<"$status"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if ! command -v apt-get >/dev/null; then
  echo "setup: apt-get not found; install these by hand: ${missing[*]}" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo -n)  # -n: fail instead of prompting when a password would be needed
else
  echo "setup: not root and no sudo; install these by hand: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
