#!/usr/bin/env bash
# Builds what a GPU machine needs to run scripts/gpu-check.sh and puts it in one folder: the
# binaries and tests of a Release build with the cuda backend, the dense engine's GPU kernels
# and the transformer's (warmpool-engines-cuda.so, beside the worker), and every shared library they need that a bare CUDA
# machine lacks (libuv, protobuf, fmt, spdlog, OpenBLAS, ...). Not bundled: libc and its loader,
# libstdc++/libgcc_s (a newer system's serve), the NVIDIA driver and the CUDA toolkit's own
# libraries (cuBLAS, the CUDA runtime). Binaries lose their symbol tables to fit under 60 MiB. The driver test double goes along under double/, used only when
# gpu-check.sh is asked to (--double), so that the check can be tried where there is no GPU.
#
#   scripts/gpu-bundle.sh [--build-dir DIR] BUNDLE
#     --build-dir DIR  take the binaries of an existing build (stripped) instead of
#                      making a Release build in build-gpu/
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: $0 [--build-dir DIR] BUNDLE" >&2; exit 2; }
build=""
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --build-dir) [[ $# -ge 2 ]] || usage; build=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ $# -eq 1 ]] || usage
bundle=$1

targets=(warmpoold warmpool-worker warmpool-owner warmpool warmpool-mkmodel warmpool-driver-check
         warmpool-chaos warmpool-bench cuda_memory_test owner_test dense_gpu_test transformer_gpu_test
         warmpool-transformer-probe warmpool_fake_cuda warmpool_engines_cuda)
if [[ -z $build ]]; then
  build=build-gpu
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWARMPOOL_CUDA=ON >/dev/null
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
fi
[[ -x $build/bin/warmpool-owner ]] || { echo "$build has no cuda backend (configure with -DWARMPOOL_CUDA=ON)" >&2; exit 1; }

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/double"
for t in "${targets[@]}"; do
  [[ $t == warmpool_fake_cuda || $t == warmpool_engines_cuda ]] && continue
  strip --strip-unneeded -o "$bundle/bin/$t" "$build/bin/$t"
done
# The engines' GPU kernels, beside the worker where it looks for them.
[[ -f $build/bin/warmpool-engines-cuda.so ]] ||
  { echo "$build has no GPU kernels (nvcc and cuBLAS are needed to build them)" >&2; exit 1; }
strip --strip-unneeded -o "$bundle/bin/warmpool-engines-cuda.so" "$build/bin/warmpool-engines-cuda.so"
cp "$build/tests/cuda_double/libcuda.so.1" "$bundle/double/"

# Shared libraries the binaries resolve here, less those every CUDA machine has.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnvidia)'
for f in "$bundle"/bin/*; do
  ldd "$f" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" "$bundle/lib/$name"
done
strip --strip-unneeded "$bundle"/lib/*.so* 2>/dev/null || true
# oneDNN alone is about 38 MiB: libraries over 8 MiB travel gzipped (oneDNN to 11 MiB), and
# gpu-check.sh unpacks them before anything runs.
find "$bundle/lib" -type f -size +8M -exec gzip -9 {} +
cp scripts/gpu-check.sh tests/gpu/compare_with_transformers.py "$bundle/"
# The demo model: its tokenizer for transformer_gpu_test's models, and a trained model to hold
# against Hugging Face.
cp -r demo/license-llama "$bundle/demo-model"
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $build"
} >"$bundle/MANIFEST"

size=$(du -sm "$bundle" | cut -f1)
echo "bundle $bundle: ${size} MiB ($(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries)"
if ((size >= 60)); then
  echo "the bundle is ${size} MiB, over the 60 MiB it must fit in" >&2
  exit 1
fi
