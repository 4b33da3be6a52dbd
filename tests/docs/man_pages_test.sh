#!/usr/bin/env bash
# The man pages say everything the programs accept:
#   - every long option of `warmpoold --help` appears in man/warmpoold.8;
#   - every subcommand of `warmpool --help`, and every long option of `warmpool --help`,
#     `warmpool SUB --help` and `warmpool fault arm|clear --help`, appears in man/warmpool.1;
#   - every section and key the configuration parser accepts (supervisor/config.cc) and every key
#     of the shipped systemd/warmpool.toml.in appears in man/warmpool.toml.5, as a `.SS [section]`
#     line and a `.B key` line;
#   - each page renders with `groff -man -ww` without a warning (and `mandoc -Tlint` finds nothing
#     above a style note, where mandoc is installed);
#   - man/CMakeLists.txt installs the three pages into man1, man5 and man8.
#
#   man_pages_test.sh SOURCE_DIR BUILD_BIN_DIR
set -euo pipefail
src=$(cd "${1:?usage: man_pages_test.sh SOURCE_DIR BUILD_BIN_DIR}" && pwd)
bin=${2:?usage: man_pages_test.sh SOURCE_DIR BUILD_BIN_DIR}
man=$src/man
failures=0
checked=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# (Read once: `plain FILE | grep -q` would fail under pipefail when grep stops reading early.)
declare -A plain_of

# Long options of a --help text (CLI11 prints "  --name TYPE  text" and "-h,--help").
long_options() { grep -oE '(^|[ ,])--[a-z][a-z0-9-]*' | sed 's/^[ ,]*//' | sort -u; }
# The roff source with its escapes undone as far as names need: \- is -, \f. and \& go.
plain() { sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\&//g' "$1"; }

for f in "$man"/warmpoold.8 "$man"/warmpool.1 "$man"/warmpool.toml.5; do plain_of[$f]=$(plain "$f"); done

check_options() {  # check_options PAGE HELP_TEXT WHAT
  local page=$1 text=$2 what=$3 option
  while IFS= read -r option; do
    [ -n "$option" ] || continue
    checked=$((checked + 1))
    # As a word of its own: --http must not be satisfied by --http-something.
    if ! grep -qE -- "(^|[^a-z0-9-])${option}([^a-z0-9-]|$)" <<<"${plain_of[$page]}"; then
      fail "$(basename "$page") does not mention $option (from $what)"
    fi
  done < <(long_options <<<"$text")
}

# warmpoold(8)
check_options "$man/warmpoold.8" "$("$bin/warmpoold" --help)" "warmpoold --help"

# warmpool(1): the top level, each subcommand, and fault's own subcommands.
top=$("$bin/warmpool" --help)
check_options "$man/warmpool.1" "$top" "warmpool --help"
subcommands=$(awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }' <<<"$top")
[ -n "$subcommands" ] || fail "no subcommands found in warmpool --help"
for sub in $subcommands; do
  checked=$((checked + 1))
  if ! grep -qE "^\.(B|BR|BI|TP)? ?\"?$sub( |\"|$)|^\.B[RI]? \"?$sub\"? " <<<"${plain_of[$man/warmpool.1]}"; then
    fail "warmpool.1 has no entry for the subcommand '$sub'"
  fi
  help=$("$bin/warmpool" "$sub" --help)
  check_options "$man/warmpool.1" "$help" "warmpool $sub --help"
  for subsub in $(awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }' <<<"$help"); do
    checked=$((checked + 1))
    grep -qE "^\.B[RI]? \"?$sub $subsub\"?" <<<"${plain_of[$man/warmpool.1]}" ||
      fail "warmpool.1 has no entry for '$sub $subsub'"
    check_options "$man/warmpool.1" "$("$bin/warmpool" "$sub" "$subsub" --help)" "warmpool $sub $subsub --help"
  done
done

# warmpool.toml(5): sections and keys from the parser, which names each as `k == "key"` inside
# `section == "name"` (or, for [[models]], inside ApplyModels), and from the shipped file.
page=${plain_of[$man/warmpool.toml.5]}
keys=$(awk '
  /section == "[a-z]+"/ { match($0, /section == "[a-z]+"/); section = substr($0, RSTART + 12, RLENGTH - 13) }
  /^Status ApplyModels/ { section = "models" }
  /^Status ApplyToml/ { section = "" }
  section != "" && /k == "[a-z_0-9]+"/ {
    line = $0
    while (match(line, /k == "[a-z_0-9]+"/)) {
      print section " " substr(line, RSTART + 6, RLENGTH - 7); line = substr(line, RSTART + RLENGTH)
    }
  }' "$src/supervisor/config.cc" | sort -u)
[ "$(wc -l <<<"$keys")" -ge 50 ] || fail "found only $(wc -l <<<"$keys") keys in supervisor/config.cc: has the parser changed shape?"
# The shipped file: "[section]" lines and "key =" or "#key =" lines under them.
shipped=$(awk '
  /^\[\[models\]\]|^# \[\[models\]\]/ { section = "models"; next }
  /^\[[a-z]+\]/ { section = substr($1, 2, length($1) - 2); next }
  section != "" && match($0, /^#? ?[a-z_0-9]+ = /) { k = $0; sub(/^#? ?/, "", k); sub(/ .*/, "", k); print section " " k }
' "$src/systemd/warmpool.toml.in" | sort -u)
while read -r section key; do
  checked=$((checked + 1))
  heading="[$section]"; [ "$section" = models ] && heading="[[models]]"
  # The key's entry must come after its section's heading and before the next heading.
  entry=$(awk -v h=".SS $heading" -v k=".B $key" '
    $0 == h { on = 1; next } on && /^\.SS / { on = 0 } on && $0 == k { found = 1 } END { print found + 0 }' <<<"$page")
  [ "$entry" = 1 ] || fail "warmpool.toml.5 has no '.B $key' under '.SS $heading'"
done < <(sort -u <<<"$keys"$'\n'"$shipped" | grep .)
for section in daemon pool cuda limits access http recovery; do
  grep -qxF ".SS [$section]" <<<"$page" || fail "warmpool.toml.5 has no section [$section]"
done
grep -qxF ".SS [[models]]" <<<"$page" || fail "warmpool.toml.5 has no section [[models]]"

# Rendering.
for f in "$man"/warmpoold.8 "$man"/warmpool.1 "$man"/warmpool.toml.5; do
  if command -v groff >/dev/null; then
    out=$(groff -man -Tutf8 -ww -z "$f" 2>&1) || fail "groff failed on $(basename "$f")"
    [ -z "$out" ] || fail "groff warns on $(basename "$f"): $out"
  fi
  if command -v mandoc >/dev/null; then
    out=$(mandoc -Tlint -Wwarning "$f" 2>&1) || true
    [ -z "$out" ] || fail "mandoc -Tlint on $(basename "$f"): $out"
  fi
done

# Installation.
for rule in "warmpool.1 DESTINATION \${CMAKE_INSTALL_MANDIR}/man1" \
            "warmpool.toml.5 DESTINATION \${CMAKE_INSTALL_MANDIR}/man5" \
            "warmpoold.8 DESTINATION \${CMAKE_INSTALL_MANDIR}/man8"; do
  grep -qF "$rule" "$man/CMakeLists.txt" || fail "man/CMakeLists.txt does not install: $rule"
done

echo "checked $checked options, subcommands and keys against the man pages: $failures missing"
[ "$failures" -eq 0 ]
