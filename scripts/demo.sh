#!/usr/bin/env bash
# The main job on the embedded defaults: build the product (not the tests: scripts/test.sh does),
# start warmpoold, write two demo models, load them, run inference, generate text with the shipped
# language model (demo/license-llama), show what is loaded, stop.
# Everything but the build happens in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# A unity build (16 sources to a translation unit): a quarter less compile time (docs/testing.md).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWARMPOOL_BUILD_TESTS=OFF \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >/dev/null
cmake --build build -j"$(nproc)" --target product
bin=$PWD/build/bin
repo=$PWD

work=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
mkdir models
"$bin/warmpool-mkmodel" models/classifier.safetensors --layers 64,256,256,10 --activation relu
"$bin/warmpool-mkmodel" models/encoder.safetensors --layers 128,512,64 --activation gelu --dtype f16
# A language model is a directory: the one trained by scripts/train-demo-model.py on Debian's
# license texts, shipped in the repository.
cp -R "$repo/demo/license-llama" models/

# The defaults: host backend, ./models, a quarter of RAM. Only the socket is made private here.
export WARMPOOL_SOCKET=$work/warmpool.sock
"$bin/warmpoold" --socket "$WARMPOOL_SOCKET" --instance "demo-$$" &
daemon=$!
"$bin/warmpool" status --wait 10s >/dev/null

set -x
"$bin/warmpool" models
"$bin/warmpool" load classifier
"$bin/warmpool" load encoder
"$bin/warmpool" infer classifier --random 2
echo '[[0.5, -1, 0.25, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]]' \
  | "$bin/warmpool" infer classifier --input - --json
"$bin/warmpool" infer encoder --random 1 --json | head -c 200; echo
"$bin/warmpool" generate license-llama "This License" --max-tokens 48 --temperature 0 --verbose
"$bin/warmpool" generate license-llama "You may convey" --max-tokens 32 --temperature 0.8 --seed 7 --json | tail -n 1
"$bin/warmpool" ps
"$bin/warmpool" status
set +x

cat <<'NEXT'

The demo's daemon stops with this script. To go on yourself (README.md, Quick start):
  build/bin/warmpoold --help            the daemon's options; docs/configuration.md for its file
  build/bin/warmpool --help             every command: models, load, infer, ps, top, unload, ...
  build/bin/warmpool-mkmodel --help     make more models to serve
  ./scripts/test.sh                     build and run the whole test suite (about 28 minutes on 2 cores)
NEXT
