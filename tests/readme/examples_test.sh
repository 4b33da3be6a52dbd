#!/usr/bin/env bash
# Runs the README's examples: every "    $ " line between "<!-- readme-examples: NAME" and
# "<!-- end readme-examples -->", against a real warmpoold serving a model "tiny" (4 inputs, 3
# outputs). Each line must exit 0 (the curl lines use -f: an HTTP error fails them).
#   examples_test.sh BUILD_BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1
src=$(cd "$2" && pwd)
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/models"
"$bin/warmpool-mkmodel" "$work/models/tiny.safetensors" --layers 4,8,3 --activation relu >/dev/null
export WARMPOOL_SOCKET=$work/warmpool.sock
export VENV=$work/venv
"$bin/warmpoold" --socket "$WARMPOOL_SOCKET" --models-dir "$work/models" --instance "readme$$" \
  >"$work/warmpoold.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do "$bin/warmpool" status >/dev/null 2>&1 && break; sleep 0.05; done

# The examples of one block, as the lines a user would paste.
examples() {
  awk -v name="$1" '
    index($0, "<!-- readme-examples: " name " ") == 1 { on = 1; next }
    index($0, "<!-- end readme-examples -->") == 1 { on = 0 }
    on && /^    \$ / { sub(/^    \$ /, ""); print }' "$src/README.md"
}

# The python block builds ./python in place: a copy of what it needs, so that it never races the
# pytest suite building the same tree.
mkdir -p "$work/src/ipc"
cp -r "$src/python" "$work/src/python"
rm -rf "$work/src/python/build" "$work/src/python"/*.egg-info
cp "$src/ipc/warmpool.proto" "$work/src/ipc/"

ran=0
for block in http:"$work" python:"$work/src"; do
  name=${block%%:*}
  dir=${block#*:}
  count=0
  while IFS= read -r line; do
    echo "\$ $line"
    if ! (cd "$dir" && bash -euo pipefail -c "$line"); then
      echo "FAIL: README example ($name) exited non-zero: $line"
      echo "--- warmpoold log:"; tail -20 "$work/warmpoold.log"
      exit 1
    fi
    count=$((count + 1))
  done < <(examples "$name")
  [ "$count" -gt 0 ] || { echo "FAIL: no README examples in block $name"; exit 1; }
  ran=$((ran + count))
done
echo "ran $ran README examples"
