#!/usr/bin/env bash
# The whole test suite (docs/testing.md); installs what is missing first.
#   1. A normal build of everything, and every test.
#   2. A sanitizer build (AddressSanitizer + UndefinedBehaviorSanitizer, clang) of the product, the
#      unit tests and the simulator. The unit tests and the simulator run under the sanitizers; then
#      the daemon-level tests of pass 1 (integration, chaos scenarios; not the soaks) run again
#      against its programs. Any report a sanitizer writes, in any process, fails the pass.
#   3. A short bounded run of each libFuzzer target (scripts/fuzz.sh), built in pass 2's build.
# Usage:
#   scripts/test.sh            all of it (CI runs exactly this)
#   scripts/test.sh --quick    pass 1 without the tests labelled slow: the edit loop
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

stage() { printf '\n=== %s (at %d s)\n' "$1" "$SECONDS"; }

stage "packages"
./scripts/install-deps.sh --test
# The official OpenAI and Ollama JavaScript clients, from the npm registry, exactly as the lockfile
# pins them (tests/clients; test-only). Node.js and npm: Debian's when the machine has none.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get install -y -q --no-install-recommends nodejs npm
fi
npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error
export WARMPOOL_REQUIRE_CLIENTS=1  # their tests fail, rather than skip, without them

jobs=$(nproc)
# Most tests wait on sockets and child processes rather than compute: run twice as many as CPUs.
test_jobs=$((2 * jobs))

# Unity builds: each target's sources compiled 16 to a translation unit, so the heavy headers
# (protobuf, spdlog, Boost, GoogleTest) are parsed once per batch rather than once per file. On this
# project's 2-core machine it takes a quarter off the compile time of each pass (docs/testing.md).
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16)

stage "pass 1: normal build"
# Line tables only (-g1): backtraces keep their file:line, and the build takes a third less time
# than with full debug information.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWARMPOOL_BUILD_TESTS=ON "${unity[@]}" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" >/dev/null
cmake --build build -j"$jobs"
stage "pass 1: tests"
if ((quick)); then
  ctest --test-dir build --output-on-failure -j"$test_jobs" -LE slow
  stage "done (quick)"
  exit 0
fi
ctest --test-dir build --output-on-failure -j"$test_jobs"

stage "pass 2: sanitizer build"
# With clang: a second compiler reads every line (pass 1 is the distribution's gcc, as users build
# it), it compiles this code at -O0 in about half of gcc's time, and its libFuzzer lets the fuzz
# targets of pass 3 share this build (WARMPOOL_FUZZ: every library carries libFuzzer's coverage
# hooks, which outside a fuzz target cost a call per comparison and nothing else). Line tables
# only: a sanitizer's report names file:line for every frame all the same.
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWARMPOOL_SANITIZE=ON \
  -DWARMPOOL_FUZZ=ON -DWARMPOOL_BUILD_TESTS=ON "${unity[@]}" "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g1" \
  "-DCMAKE_C_FLAGS_DEBUG=-O0 -g1" >/dev/null
cmake --build build-asan -j"$jobs" --target sanitizer_pass
# A quarter of the default quarantine (64 of 256 MiB of freed memory kept poisoned): a use after
# free is still caught while the last 64 MiB freed includes it, and every process stops faulting in
# fresh pages for the rest (the simulator runs a quarter faster).
asan="detect_leaks=1:abort_on_error=1:strict_string_checks=1:quarantine_size_mb=64"
ubsan="print_stacktrace=1:halt_on_error=1"
stage "pass 2: unit tests and the simulator under the sanitizers"
# A report fails its test (and a death test's expected crash is its own business).
ASAN_OPTIONS=$asan UBSAN_OPTIONS=$ubsan ctest --test-dir build-asan --output-on-failure -j"$jobs" || failed=1
stage "pass 2: daemon-level tests against the sanitizer build's programs"
# All of them but the randomized soaks (label soak): pass 1 runs those, and under the sanitizers
# every recovery path they take is taken by a chaos scenario too (docs/testing.md).
# Here reports go to files, so that one written by a worker or an owner — whose crash the daemon
# survives by design, and the test with it — is seen too. handle_segv=0: the fault tests crash
# workers with SIGSEGV on purpose; that is not a finding.
reports=$(mktemp -d "${TMPDIR:-/tmp}/warmpool-sanitizer-reports.XXXXXX")
trap 'rm -rf "$reports"' EXIT
# log_exe_name: each report file is named after the program that wrote it (asan.warmpool-worker.PID).
ASAN_OPTIONS=$asan:handle_segv=0:log_path=$reports/asan:log_exe_name=1 \
  UBSAN_OPTIONS=$ubsan:log_path=$reports/ubsan:log_exe_name=1 \
  WARMPOOL_BIN_DIR=$PWD/build-asan/bin ctest --test-dir build --output-on-failure -j"$test_jobs" -L daemon -LE soak ||
  failed=1
# LeakSanitizer's exit-time check stops every thread with ptrace; a thread already exiting (or the
# process killed meanwhile: the chaos scenarios kill workers, owners and daemons on purpose) makes
# it warn and go on, in the report file like a finding. A file of those warnings alone is listed,
# not failed; anything else in it, or an empty file (a sanitizer opened its report and was killed
# before writing it), is a finding. A line begins ==PID==, or with the program's name before the
# PID (==warmpool-owner==PID==: log_exe_name).
lsan_warning='^==([A-Za-z0-9_.+-]+==)?[0-9]+==(Unable to get registers from thread [0-9]+|Running thread [0-9]+ was not suspended\. False leaks are possible)\.$'
for f in "$reports"/*; do
  [ -e "$f" ] || continue
  if [ -s "$f" ] && ! grep -qvE "$lsan_warning" "$f"; then
    echo "sanitizer warnings, not findings: $(basename "$f"): $(tr '\n' ' ' <"$f")"
    continue
  fi
  echo "--- sanitizer report $(basename "$f") ($(stat -c %s "$f") bytes)"
  head -60 "$f"
  failed=1
done
[ -z "${failed:-}" ] || { echo "pass 2 failed" >&2; exit 1; }

stage "pass 3: fuzz targets"
./scripts/fuzz.sh --build-dir build-asan
stage "done"
