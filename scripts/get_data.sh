#!/usr/bin/env bash
# Puts kiln's data files into DEST (default: data/ in the repository root; a relative DEST is taken
# from the repository root) and checks every file's sha256 against the hashes below.
#
# Where the files come from, first match wins:
#   1. $KILN_SHARED_DATA, or ../shared/data beside the repository: symlinked (KILN_DATA_COPY=1
#      copies instead, e.g. for carrying the folder to another machine);
#   2. otherwise downloaded with curl from the URLs in ../shared/data/SOURCES.md.
# Files already in DEST with the right hash are left alone. Any mismatch is an error (exit 1).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-data}
case "$dest" in /*) ;; *) dest="$repo/$dest" ;; esac
shared=${KILN_SHARED_DATA:-$repo/../shared/data}
copy=${KILN_DATA_COPY:-0}

# path | sha256 | transform after download | URLs to try in order
# Transforms: none; lf (strip CR); head:N (first N bytes).
# The two tokenizer-test hashes are the full hashes of the shared files (SOURCES.md lists prefixes
# ef7a25a2... / 4fdf5ff7...).
hf=https://huggingface.co
gh=https://raw.githubusercontent.com
files=(
  "text/tinyshakespeare.txt|86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed|none|$gh/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
  "text/tinystories_valid_head.txt|5fc1fb0113df62b567fb271806cd645ce8d75f59c58ca0b764c03d3b6ff34ca6|head:794375|$gh/yuninxia/moe-routing-bench/main/data/tinystories_val.txt $hf/datasets/roneneldan/TinyStories/resolve/main/TinyStories-valid.txt"
  "llama2c/tokenizer.bin|50a52ef822ee9e83de5ce9d0be0a025a773d019437f58b5ff9dcafb063ece361|none|$gh/karpathy/llama2.c/master/tokenizer.bin"
  "qwen/vocab.json|ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910|none|$hf/Qwen/Qwen3-8B/resolve/main/vocab.json"
  "qwen/merges.txt|8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5|lf|$hf/Qwen/Qwen3-8B/resolve/main/merges.txt"
  "qwen/Qwen3-8B/config.json|f7c4eadfbbf522470667b797a3c89be2524832d2d599797248dc304fff447c30|none|$hf/Qwen/Qwen3-8B/resolve/main/config.json"
  "qwen/Qwen3-8B/generation_config.json|2325da0f15bb848e018c5ae071b7943332e9f871d6b60e2ed22ca97d4cb993d2|none|$hf/Qwen/Qwen3-8B/resolve/main/generation_config.json"
  "qwen/Qwen3-0.6B/config.json|660db3b73d788119c04535e48cf9be5f55bc3100841a718637ae695b442f27dd|none|$hf/Qwen/Qwen3-0.6B/resolve/main/config.json"
  "qwen/Qwen3-0.6B/generation_config.json|2325da0f15bb848e018c5ae071b7943332e9f871d6b60e2ed22ca97d4cb993d2|none|$hf/Qwen/Qwen3-0.6B/resolve/main/generation_config.json"
  "tokenizer-tests/qwen2.inp|ef7a25a263fba141f64a8a842ceb1c572cdb8e1313f592d974f7a06bbd3a4934|none|$gh/ggml-org/llama.cpp/807b0c49/models/ggml-vocab-qwen2.gguf.inp $gh/ggml-org/llama.cpp/master/models/ggml-vocab-qwen2.gguf.inp"
  "tokenizer-tests/qwen2.out|4fdf5ff70fcfbb819642b522a47b8f61522fa20d938fa7470a8497bc52773cd4|none|$gh/ggml-org/llama.cpp/807b0c49/models/ggml-vocab-qwen2.gguf.out $gh/ggml-org/llama.cpp/master/models/ggml-vocab-qwen2.gguf.out"
)

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

die() {
  echo "get_data: $*" >&2
  exit 1
}

# download URL... -> $tmp with the transform applied; returns non-zero when every URL fails.
download() {
  local transform=$1 out=$2
  shift 2
  command -v curl >/dev/null || die "curl not found and no shared data at $shared"
  local url
  for url in "$@"; do
    echo "get_data:   fetching $url" >&2
    if curl -fsSL --retry 3 --connect-timeout 20 -o "$out.raw" "$url"; then
      case "$transform" in
        none) mv "$out.raw" "$out" ;;
        lf) tr -d '\r' <"$out.raw" >"$out" && rm -f "$out.raw" ;;
        head:*) head -c "${transform#head:}" "$out.raw" >"$out" && rm -f "$out.raw" ;;
        *) die "unknown transform $transform" ;;
      esac
      return 0
    fi
  done
  rm -f "$out.raw"
  return 1
}

linked=0 copied=0 fetched=0 present=0
for entry in "${files[@]}"; do
  IFS='|' read -r rel want transform urls <<<"$entry"
  target="$dest/$rel"
  mkdir -p "$(dirname "$target")"

  if [ -e "$target" ] && [ "$(sha256_of "$target")" = "$want" ]; then
    if [ "$copy" = 1 ] && [ -L "$target" ]; then
      cp --remove-destination "$(readlink -f "$target")" "$target"  # make the link a real file
      copied=$((copied + 1))
    else
      present=$((present + 1))
    fi
    continue
  fi
  rm -f "$target"

  if [ -f "$shared/$rel" ]; then
    got=$(sha256_of "$shared/$rel")
    [ "$got" = "$want" ] || die "sha256 mismatch for $shared/$rel: expected $want, got $got"
    if [ "$copy" = 1 ]; then
      cp "$shared/$rel" "$target"
      copied=$((copied + 1))
    else
      ln -s "$(cd "$shared" && pwd)/$rel" "$target"
      linked=$((linked + 1))
    fi
    continue
  fi

  # shellcheck disable=SC2086  # urls is a space-separated list
  download "$transform" "$target.part" $urls || die "could not download $rel (tried: $urls)"
  got=$(sha256_of "$target.part")
  if [ "$got" != "$want" ]; then
    rm -f "$target.part"
    die "sha256 mismatch for downloaded $rel: expected $want, got $got"
  fi
  mv "$target.part" "$target"
  fetched=$((fetched + 1))
done

echo "get_data: ${#files[@]} files verified in ${dest#"$repo"/}/" \
  "(${present} already there, ${linked} linked, ${copied} copied, ${fetched} downloaded)"
