#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (AddressSanitizer + UndefinedBehaviorSanitizer)
# into build-fuzz and runs each for SECONDS (default 20) on a copy of its seed corpus, so that new
# inputs never land in the repository. Fails if any target finds a crash, a leak, a timeout, an
# out-of-memory or a sanitizer report; the input that did it is copied to fuzz/crashes/<target>/.
#   scripts/fuzz.sh [SECONDS]            every target
#   FUZZ_TARGETS="fuzz_config" scripts/fuzz.sh 300
#   FUZZ_SEED=0 scripts/fuzz.sh 600     a random seed (default 1: the test command's runs follow one
#                                       sequence of mutations, so a failure there can be replayed)
#   scripts/fuzz.sh --build-dir DIR 20   the targets of an existing clang build configured with
#                                       -DWARMPOOL_FUZZ=ON (the test command's sanitizer build)
# Targets run side by side, as many at a time as there are CPUs. See fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=""
if [ "${1:-}" = "--build-dir" ]; then
  build_dir=${2:?usage: $0 [--build-dir DIR] [SECONDS]}
  shift 2
fi
seconds=${1:-20}
case "$seconds" in '' | *[!0-9]*) echo "usage: $0 [--build-dir DIR] [SECONDS]" >&2; exit 2 ;; esac
read -r -a targets <<< "${FUZZ_TARGETS:-fuzz_frame_decoder fuzz_envelope fuzz_safetensors fuzz_config fuzz_http_request fuzz_tokenizer fuzz_chat_template fuzz_tool_calls fuzz_model_files}"

if ! command -v clang >/dev/null || ! command -v clang++ >/dev/null; then
  echo "error: clang is missing; run scripts/install-deps.sh --test (clang, libclang-rt-14-dev)" >&2
  exit 1
fi

jobs=$(nproc)
if [ -z "$build_dir" ]; then
  build_dir=build-fuzz
  # A unity build, as the test command's passes (186 -> 122 s here).
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWARMPOOL_FUZZ=ON -DWARMPOOL_BUILD_TESTS=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >/dev/null
elif ! grep -q '^WARMPOOL_FUZZ:BOOL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  echo "error: $build_dir is not a build configured with -DWARMPOOL_FUZZ=ON (clang)" >&2
  exit 2
fi
cmake --build "$build_dir" -j"$jobs" --target "${targets[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/warmpool-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Set here, not inherited: libFuzzer saves the input of whatever the sanitizers report.
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

max_len() {
  case "$1" in
    fuzz_safetensors) echo 16384 ;;
    fuzz_envelope | fuzz_config | fuzz_model_files) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

run_one() {
  local target=$1 dir=$work/$1
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -R "fuzz/corpus/$target/." "$dir/corpus/"
  local args=(-max_total_time="$seconds" -seed="${FUZZ_SEED:-1}" -rss_limit_mb=2048 -timeout=10 -max_len="$(max_len "$target")"
              -artifact_prefix="$dir/artifacts/" -print_final_stats=1)
  [ -f "fuzz/$target.dict" ] && args+=(-dict="fuzz/$target.dict")
  # New inputs go to the first directory (the copy); the seed directory is only read.
  local rc=0
  "$build_dir/bin/$target" "${args[@]}" "$dir/corpus" "fuzz/corpus/$target" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}

echo "fuzzing ${targets[*]} for ${seconds}s each, $jobs at a time"
running=0
for target in "${targets[@]}"; do
  [ -d "fuzz/corpus/$target" ] || { echo "error: no seed corpus fuzz/corpus/$target" >&2; exit 1; }
  run_one "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=0
for target in "${targets[@]}"; do
  dir=$work/$target
  rc=$(cat "$dir/rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1 || true)
  # A sanitizer report that did not stop the run is a failure too.
  if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY: ' "$dir/log"; then
    failed=1
    mkdir -p "fuzz/crashes/$target"
    found=$(find "$dir/artifacts" -type f | head -20)
    for f in $found; do cp "$f" "fuzz/crashes/$target/"; done
    cp "$dir/log" "fuzz/crashes/$target/last.log"
    echo "FAIL $target (exit $rc):"
    grep -E 'ERROR:|runtime error:|invariant failed|SUMMARY:|Test unit written' "$dir/log" | head -10 | sed 's/^/  /'
    if [ -n "$found" ]; then
      for f in $found; do
        echo "  input saved: fuzz/crashes/$target/$(basename "$f")  (replay: $build_dir/bin/$target fuzz/crashes/$target/$(basename "$f"))"
      done
    fi
    echo "  log: fuzz/crashes/$target/last.log"
  else
    echo "ok   $target: ${execs:-?} runs, ${cov:-cov: ?}"
  fi
done
[ "$failed" -eq 0 ] || { echo "fuzzing found problems; see fuzz/README.md for turning one into a regression test" >&2; exit 1; }
