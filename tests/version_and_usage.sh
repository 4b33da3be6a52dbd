#!/usr/bin/env bash
# Every program prints "NAME VERSION" for --version (the project's version, from CMake) and exits 0;
# warmpool's usage errors are one line, "warmpool[ COMMAND]: MESSAGE; see warmpool[ COMMAND] --help",
# with exit status 2 (common/command_line.h).
set -u
version=${1:?usage: version_and_usage.sh VERSION PROGRAM...}
shift
failed=0
fail() { echo "FAIL: $*"; failed=1; }

cli=
for program in "$@"; do
  name=$(basename "$program")
  [ "$name" = warmpool ] && cli=$program
  out=$("$program" --version 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "$name --version exited $rc: $out"
  [ "$out" = "$name $version" ] || fail "$name --version printed \"$out\", expected \"$name $version\""
done
[ -n "$cli" ] || { echo "FAIL: warmpool is not among the programs"; exit 1; }

# expect_usage EXPECTED_STDERR ARGS...: exit status 2 and exactly this line on stderr.
expect_usage() {
  local expected=$1; shift
  local err rc
  err=$("$cli" --socket /nonexistent "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "warmpool $* exited $rc (expected 2): $err"
  [ "$err" = "$expected" ] || fail "warmpool $*: stderr \"$err\", expected \"$expected\""
}
expect_usage 'warmpool: unknown command "frob"; see warmpool --help' frob
expect_usage 'warmpool: unknown option "--frob"; see warmpool --help' --frob
expect_usage 'warmpool ps: unknown option "--frob"; see warmpool ps --help' ps --frob
expect_usage 'warmpool fault: unknown command "frob"; see warmpool fault --help' fault frob
case $("$cli" 2>&1 >/dev/null) in
  "warmpool: a command is required ("*"); see warmpool --help") ;;
  *) fail "warmpool with no command: $("$cli" 2>&1 >/dev/null)" ;;
esac
"$cli" --help | grep -q 'Exit status: 0 done; 1 the daemon refused' || fail "warmpool --help does not document the exit status"
"$cli" --help | grep -q 'WEIGHTS (held once), WORKSPACE' || fail "warmpool --help does not name the sizes"

# status --wait gives up at its deadline: with no socket, and with a socket that accepts and never
# answers (a stopped daemon, another program), where it once waited for ever.
scratch=$(mktemp -d)
trap 'kill $listener 2>/dev/null; rm -rf "$scratch"' EXIT
"$cli" --socket "$scratch/none.sock" status --wait 300ms >/dev/null 2>&1; rc=$?
[ $rc -eq 1 ] || fail "status --wait with no socket exited $rc (expected 1)"
python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); time.sleep(60)' "$scratch/mute.sock" &
listener=$!
for _ in $(seq 100); do [ -S "$scratch/mute.sock" ] && break; sleep 0.05; done
err=$(timeout 10 "$cli" --socket "$scratch/mute.sock" status --wait 500ms 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] || fail "status --wait on a socket that never answers exited $rc (expected 1; 124: it hung): $err"
case $err in *"no daemon was ready"*) ;; *) fail "status --wait on a mute socket said: $err" ;; esac
"$cli" --socket "$scratch/none.sock" status --workers-idle >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "status --workers-idle without --wait exited $rc (expected 2, a usage error)"

[ $failed -eq 0 ] && echo "version and usage: every program agrees"
exit $failed
