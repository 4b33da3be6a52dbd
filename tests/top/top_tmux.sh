#!/usr/bin/env bash
# `warmpool top` against a real daemon: full-screen in a detached tmux pane (what it shows, a
# nonzero request rate under load, a worker crash among the events, q and Ctrl-C ending it with
# the terminal given back), plain output to a file (two blocks, no escape bytes), the socket
# fallback for a user who may not read the segment, and the exit when the daemon goes away.
# Usage: top_tmux.sh BUILD_DIR (binaries in BUILD_DIR/bin). Exit 77 (skipped) without tmux.
set -euo pipefail
bin=$1/bin
for tool in tmux python3; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed"; exit 77; }
done

work=$(mktemp -d)
chmod 755 "$work"  # the socket-only check runs as another user
sock=$work/warmpool.sock
instance=top-test-$$
tmux_server=warmpool-top-test-$$  # our own tmux server: a user's sessions are never touched
echo "set -g remain-on-exit on" >"$work/tmux.conf"  # a dead pane stays, with its exit status
daemon="" infer_loop="" plain_top=""

cleanup() {
  for pid in $infer_loop $plain_top; do kill "$pid" 2>/dev/null || true; done
  tmux -L "$tmux_server" kill-server 2>/dev/null || true
  if [ -n "$daemon" ]; then
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  if [ -f "$work/pane.txt" ]; then echo "--- last screen:" >&2; cat "$work/pane.txt" >&2; fi
  echo "--- daemon log (tail):" >&2
  tail -n 20 "$work/daemon.log" >&2 || true
  exit 1
}

tmx() { tmux -L "$tmux_server" -f "$work/tmux.conf" "$@"; }
wp() { "$bin/warmpool" --socket "$sock" "$@"; }

# Waits (up to 8 s) until the screen of tmux session $1 matches the extended regex $3.
wait_for_screen() {
  local session=$1 what=$2 regex=$3
  for _ in $(seq 80); do
    tmx capture-pane -p -t "$session" >"$work/pane.txt"
    if grep -Eq -- "$regex" "$work/pane.txt"; then return 0; fi
    sleep 0.1
  done
  fail "top's screen never showed $what (/$regex/)"
}

# The REQ/S cell of model $2 in the last models table of file $1 (columns are 2+ spaces apart).
requests_per_second() {
  python3 - "$1" "$2" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
column, value = None, "none"
for line in lines:
    cells = re.split(r"\s{2,}", line.strip())
    if "REQ/S" in cells:
        column = cells.index("REQ/S")
    elif column is not None and cells and cells[0] == sys.argv[2] and len(cells) > column:
        value = cells[column]
print(value)
PY
}

# Runs top in a new detached tmux session $1 of 160x50 (or $2x$3), its exit status written to
# $work/$1.status: tmux's own #{pane_dead_status} is not always filled in by the time the pane is
# dead.
start_top() {
  local session=$1 columns=${2:-160} rows=${3:-50}
  local command
  command="$(printf '%q ' "$bin/warmpool" --socket "$sock" top --interval 0.5); echo \$? >$(printf '%q' "$work/$session.status")"
  tmx new-session -d -s "$session" -x "$columns" -y "$rows" "$command"
}

# Waits until top in tmux session $1 has exited with status 0 and left the alternate screen.
wait_for_exit() {
  local session=$1 what=$2 state=""
  for _ in $(seq 30); do
    state="$(tmx display-message -p -t "$session" '#{pane_dead} #{alternate_on}') $(cat "$work/$session.status" 2>/dev/null || true)"
    [ "$state" = "1 0 0" ] && return 0
    sleep 0.1
  done
  fail "after $what top did not exit 0 and give the screen back (pane dead, alternate screen, exit status: $state)"
}

mkdir "$work/models"
"$bin/warmpool-mkmodel" "$work/models/classifier.safetensors" --layers 64,256,10 >/dev/null
"$bin/warmpoold" --socket "$sock" --models-dir "$work/models" --instance "$instance" --budget 256MiB \
  2>"$work/daemon.log" &
daemon=$!
wp status --wait 10s >/dev/null || fail "warmpoold did not start"
wp load classifier >/dev/null
for _ in 1 2 3; do wp infer classifier --random 1 >/dev/null; done

# Full screen: the model, its state, the budget line, the workers.
start_top top
wait_for_screen top "the model ready" '^classifier +ready '
wait_for_screen top "the budget line" '^device 0 +\[[#.]+\] +[0-9.]+ [KMG]?i?B of 256\.0 MiB'
wait_for_screen top "worker rows" '^ +[0-9]+ +[0-9]+ +(idle|busy|starting) '
[ "$(tmx display-message -p -t top '#{alternate_on}')" = 1 ] || fail "top is not on the alternate screen"

# Under load the model's request rate is not zero.
( while :; do wp infer classifier --random 1 >/dev/null 2>&1 || true; sleep 0.02; done ) &
infer_loop=$!
rate=none
for _ in $(seq 40); do
  tmx capture-pane -p -t top >"$work/pane.txt"
  rate=$(requests_per_second "$work/pane.txt" classifier)
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)" "$rate" 2>/dev/null && break
  sleep 0.2
done
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)" "$rate" 2>/dev/null ||
  fail "REQ/S of classifier is '$rate' under load (the daemon fills ModelStats.requests)"

# A worker killed from outside shows among the recent events.
victim=$(wp status --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["workers"][-1]["pid"])')
kill -KILL "$victim"
wait_for_screen top "the killed worker's event" "^[0-9:]{8}  worker [0-9]+ \\(pid $victim\\) killed by signal 9"

tmx send-keys -t top q
wait_for_exit top "q"

start_top top-ctrl-c 100 30
wait_for_screen top-ctrl-c "the first screen" '^recent events'
tmx send-keys -t top-ctrl-c C-c
wait_for_exit top-ctrl-c "Ctrl-C"

# Plain output: two blocks, a blank line between them, no escape bytes, and a rate in the second.
wp top --iterations 2 --interval 0.5 >"$work/plain.txt"
grep -q $'[\x1b\r]' "$work/plain.txt" && fail "plain output has escape or carriage-return bytes"
[ "$(grep -c '^warmpool top ' "$work/plain.txt")" = 2 ] || fail "plain output has not exactly two blocks: $(cat "$work/plain.txt")"
head -n 1 "$work/plain.txt" | grep -q '^warmpool top ' || fail "plain output does not start with a block"
[ "$(awk 'NR > 1 && previous == "" && /^warmpool top / {n++} {previous = $0} END {print n + 0}' "$work/plain.txt")" = 1 ] ||
  fail "the second block is not after a blank line: $(cat "$work/plain.txt")"
rate=$(requests_per_second "$work/plain.txt" classifier)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)" "$rate" 2>/dev/null ||
  fail "plain output's REQ/S of classifier is '$rate' under load"

# A user who may reach the socket but not read the segment (0600 to the daemon's user) gets the
# socket's view, and the header says so. As root, that user is nobody; otherwise the segment is
# closed to us for the moment.
segment=/dev/shm/warmpool.$instance
if [ "$(id -u)" = 0 ]; then
  if command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$bin/warmpool"; then
    chmod 666 "$sock"
    setpriv --reuid=65534 --regid=65534 --clear-groups "$bin/warmpool" --socket "$sock" top --once --interval 0.2 \
      >"$work/socket.txt" || fail "top as another user failed"
    chmod 600 "$sock"
  else
    echo "note: socket fallback not checked (no setpriv, or $bin not reachable by nobody)"
  fi
else
  chmod 000 "$segment"
  wp top --once --interval 0.2 >"$work/socket.txt" || { chmod 600 "$segment"; fail "top without the segment failed"; }
  chmod 600 "$segment"
fi
if [ -f "$work/socket.txt" ]; then
  grep -q "^via the socket .*$segment is not readable" "$work/socket.txt" || fail "no socket note: $(cat "$work/socket.txt")"
  grep -Eq '^classifier +ready ' "$work/socket.txt" || fail "socket view lacks the model: $(cat "$work/socket.txt")"
  grep -q 'REQ/S' "$work/socket.txt" && fail "socket view shows rates it cannot know"
fi

# The daemon goes away under plain output: top says so and exits 1.
kill "$infer_loop"
wait "$infer_loop" 2>/dev/null || true
infer_loop=""
wp top --interval 0.2 >"$work/plain-gone.txt" 2>"$work/plain-gone.err" &
plain_top=$!
for _ in $(seq 50); do grep -q '^recent events' "$work/plain-gone.txt" && break; sleep 0.05; done
daemon_pid=$daemon
kill -TERM "$daemon"
wait "$daemon" || fail "warmpoold did not stop cleanly"
daemon=""
status=0
for _ in $(seq 30); do kill -0 "$plain_top" 2>/dev/null || break; sleep 0.1; done
kill -0 "$plain_top" 2>/dev/null && fail "top kept running after the daemon went away"
wait "$plain_top" || status=$?
plain_top=""
[ "$status" = 1 ] || fail "top exited $status, not 1, when the daemon went away"
grep -q "^error: UNAVAILABLE: warmpoold (pid $daemon_pid) has exited" "$work/plain-gone.err" ||
  fail "top's message when the daemon went away: $(cat "$work/plain-gone.err")"
echo "ok: warmpool top (full screen, q, Ctrl-C, plain output, socket fallback, daemon gone)"
