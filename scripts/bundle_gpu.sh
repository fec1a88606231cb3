#!/usr/bin/env bash
# Builds kiln with CUDA for sm_90 in build-gpu/ and packs what a GPU machine needs to run the tests
# and benchmarks into build-gpu/bundle/. Run it on a build machine that has the CUDA toolkit and
# the Debian -dev packages (scripts/setup.sh); carry build-gpu/bundle (and the repository) to an
# H100/H200 machine that has neither, and run scripts/gpu_check.sh there.
#
# bundle/ mirrors the build tree's layout for the executables (tests/test_*, apps/kiln, bench/*,
# examples/*), so paths compiled into the tests (KILN_BINARY_DIR) can be mapped onto it:
#   bundle/<dir>/<exe>   executables; their DT_RPATH is $ORIGIN/../lib and nothing else (set
#                        by scripts/set_rpath.py on the copies), so that LD_LIBRARY_PATH, not
#                        this machine's folders, decides which CUDA libraries load there
#   bundle/lib/          the non-system shared libraries they need (OpenBLAS, HDF5, fmt, ...)
#   bundle/lib/fallback/ libstdc++/libgcc_s, used only when the target's own are too old
#   bundle/data/         real copies of the data files (scripts/get_data.sh)
#   bundle/manifest.env  source/build paths compiled in, commit, toolkit versions
# Not bundled: glibc, and the CUDA libraries (cudart, cuBLAS(Lt), cuDNN, NCCL), which the GPU
# machine has in its toolkit or in PyTorch's nvidia-* wheels; gpu_check.sh finds them there.
#
# Environment: KILN_BUNDLE_TARGETS (default: all); KILN_BUNDLE_KEEP_GOING=1 (bundle what built
# even when some targets fail; the manifest says so); KILN_BUNDLE_MAX_MIB (tarball limit, 48);
# KILN_GPU_BUILD_DIR (default build-gpu).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
build=${KILN_GPU_BUILD_DIR:-build-gpu}
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
bundle="$build/bundle"
targets=${KILN_BUNDLE_TARGETS:-all}
max_mib=${KILN_BUNDLE_MAX_MIB:-48}

log() { echo "bundle_gpu: $*"; }

# ---- build ----------------------------------------------------------------------------------------
# DT_RPATH (not RUNPATH: --disable-new-dtags) so that the bundled libraries' own dependencies
# (libhdf5 -> libsz, libcurl, ...) are found in bundle/lib too, without LD_LIBRARY_PATH, which
# would leak into the Python subprocesses of the golden tests.
launcher=()
if command -v ccache >/dev/null; then  # the same objects as build/ compile once
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$repo")}
fi
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${launcher[@]+"${launcher[@]}"}" \
  '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags
build_ok=1
# shellcheck disable=SC2086  # targets is a space-separated list
if ! cmake --build "$build" -j"$(nproc)" --target $targets; then
  build_ok=0
  if [ "${KILN_BUNDLE_KEEP_GOING:-0}" != 1 ]; then
    log "build failed (KILN_BUNDLE_KEEP_GOING=1 bundles what did build)" >&2
    exit 1
  fi
  log "WARNING: build failed; bundling the executables that exist"
  cmake --build "$build" -j"$(nproc)" --target $targets -- -k >/dev/null 2>&1 || true
fi

# ---- executables ----------------------------------------------------------------------------------
rm -rf "$bundle"
mkdir -p "$bundle/lib/fallback"
is_elf_exe() { [ -f "$1" ] && [ -x "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
exes=()
for dir in tests apps bench examples; do
  [ -d "$build/$dir" ] || continue
  while IFS= read -r f; do
    is_elf_exe "$f" || continue
    case "$f" in *.so | *.so.*) continue ;; esac
    rel=${f#"$build"/}
    mkdir -p "$bundle/$(dirname "$rel")"
    cp "$f" "$bundle/$rel"
    strip --strip-debug "$bundle/$rel" 2>/dev/null || true
    exes+=("$rel")
  done < <(find "$build/$dir" -maxdepth 1 -type f | sort)
done
[ ${#exes[@]} -gt 0 ] || { log "no executables found under $build" >&2; exit 1; }
log "executables: ${exes[*]}"

# ---- shared libraries -----------------------------------------------------------------------------
# The sonames the GPU machine provides itself (glibc, the kernel's vdso, the CUDA stack).
system_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | \
      libresolv.so* | libutil.so*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libcudnn*.so* | libnccl.so* | \
      libnvrtc*.so* | libnvJitLink.so* | libcufft*.so* | libcurand.so* | libcusparse*.so*) return 0 ;;
  esac
  return 1
}
declare -A seen=()
for rel in "${exes[@]}"; do
  # "libfoo.so.1 => /usr/lib/.../libfoo.so.1 (0x...)"; ldd lists transitive dependencies too.
  while read -r name _ path _; do
    [ -n "${path:-}" ] && [ -f "$path" ] || continue
    [ -z "${seen[$name]:-}" ] || continue
    seen[$name]=1
    if system_lib "$name"; then continue; fi
    case "$name" in
      libstdc++.so* | libgcc_s.so*) cp -L "$path" "$bundle/lib/fallback/$name" ;;
      *) cp -L "$path" "$bundle/lib/$name" ;;
    esac
  done < <(ldd "$bundle/$rel" | grep '=> /')
done
log "libraries: $(find "$bundle/lib" -maxdepth 1 -type f -printf '%f ' | sort)"

# The build RPATH also names the folders the libraries were linked from (/usr/local/cuda/lib64,
# the OpenBLAS folder); DT_RPATH outranks LD_LIBRARY_PATH, so on the GPU machine those folders
# would decide which copies load. The bundle's copies keep $ORIGIN/../lib alone. (The libraries
# were collected above through the full RPATH, so the right OpenBLAS build was copied.)
for rel in "${exes[@]}"; do
  python3 "$repo/scripts/set_rpath.py" '$ORIGIN/../lib' "$bundle/$rel" ||
    { log "could not set the RPATH of $rel" >&2; exit 1; }
  rpath=$(readelf -d "$bundle/$rel" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\2/p')
  [ "$rpath" = '$ORIGIN/../lib' ] || { log "$rel: RPATH is '$rpath'" >&2; exit 1; }
done
log "RPATH of every executable: \$ORIGIN/../lib"

# ---- data and manifest ----------------------------------------------------------------------------
KILN_DATA_COPY=1 "$repo/scripts/get_data.sh" "$bundle/data" >/dev/null

commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
cuda_version=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")$/\1/p' \
  "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)
{
  echo "KILN_BUNDLE_SOURCE_DIR='$repo'"
  echo "KILN_BUNDLE_BINARY_DIR='$build'"
  echo "KILN_BUNDLE_COMMIT='$commit'"
  echo "KILN_BUNDLE_DIRTY_FILES='$dirty'"
  echo "KILN_BUNDLE_DATE='$(date -u +%Y-%m-%dT%H:%M:%SZ)'"
  echo "KILN_BUNDLE_BUILD_OK='$build_ok'"
  echo "KILN_BUNDLE_NVCC='nvcc ${cuda_version:-unknown}'"
  echo "KILN_BUNDLE_CUDA_ARCH='90'"
  echo "KILN_BUNDLE_EXES='${exes[*]}'"
} >"$bundle/manifest.env"

# The folder is ~50 MiB (OpenBLAS alone is 36 MiB) plus ~12 MiB per executable that links the
# CUDA kernels (each carries the same fatbin). xz with a 64 MiB window (-9e) folds the repeated
# fatbins, so bundle.tar.xz is the one to carry (docs/gpu_window.md); gzip only where there is
# no xz. gpu_check.sh unpacks either when the folder is absent.
rm -f "$build/bundle.tar.gz" "$build/bundle.tar.xz"
if command -v xz >/dev/null; then
  tarball="$build/bundle.tar.xz"
  tar -C "$build" -cf - bundle | xz -9e -T1 >"$tarball"
else
  tarball="$build/bundle.tar.gz"
  tar -C "$build" -czf "$tarball" bundle
fi
tar_kib=$(du -sk "$tarball" | cut -f1)
dir_kib=$(du -sk "$bundle" | cut -f1)
log "bundle: $bundle ($((dir_kib / 1024)) MiB), $tarball ($((tar_kib / 1024)) MiB)," \
  "commit ${commit:0:12}, build_ok=$build_ok"
log "carry ${tarball#"$repo"/} (or the folder) and run: scripts/gpu_check.sh OUTDIR"
if [ "$tar_kib" -gt $((max_mib * 1024)) ]; then
  log "$(basename "$tarball") is larger than ${max_mib} MiB: too big to carry (KILN_BUNDLE_TARGETS" \
    "can leave executables out)" >&2
  exit 1
fi
