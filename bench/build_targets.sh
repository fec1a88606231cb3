# Sourced by the bench drivers: bench_build_targets ROOT BUILD_DIR TARGET... configures BUILD_DIR
# (a CPU-only Release build) if it does not exist yet, then builds the targets quietly, printing
# the build's output and failing only when the build fails.
bench_build_targets() {
  local root=$1 build_dir=$2
  shift 2
  if [[ ! -d "$build_dir" ]]; then
    cmake -S "$root" -B "$build_dir" -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  local log
  log="$(mktemp)"
  # nproc --all: nproc alone honours OMP_NUM_THREADS, which the drivers may have set.
  if ! cmake --build "$build_dir" --target "$@" -j"$(nproc --all)" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
