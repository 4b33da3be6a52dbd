#!/usr/bin/env bash
# Installs the build into a scratch DESTDIR and checks what lands there: the programs, the systemd
# units, the sysusers.d and tmpfiles.d snippets, the configuration and the engines directory.
# The units must pass `systemd-analyze verify` without a single line of output (it exits 0 on
# many warnings, so its output is what counts), the sysusers.d snippet must create the users in a
# scratch root, and the tmpfiles.d snippet must create its directories there. Needs no running
# systemd, no network, and creates no user on this machine.
#
#   tests/systemd/verify_units.sh BUILD_DIR [CMAKE]
#
# Exit status 77 (a skip for ctest) when systemd's tools are not installed.
set -euo pipefail

build_dir=$(cd "${1:?usage: verify_units.sh BUILD_DIR [CMAKE]}" && pwd)
cmake_bin=${2:-cmake}

for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (Debian package systemd)"
    exit 77
  fi
done

# WARMPOOL_BINDIR, WARMPOOL_SYSTEMD_UNIT_DIR, ...: the configured install locations.
# shellcheck source=/dev/null
source "$build_dir/systemd/install-layout.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/warmpool-units.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
pass() { echo "ok: $*"; }

# ---- Install ------------------------------------------------------------------------------------
if ! DESTDIR=$root "$cmake_bin" --install "$build_dir" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log" >&2
  echo "FAIL: cmake --install into $root failed" >&2
  exit 1
fi
if grep -q "CMake Warning\|CMake Error" "$tmp/install.log"; then
  fail "cmake --install printed warnings:"; cat "$tmp/install.log" >&2
fi

check_file() {  # check_file TEST PATH
  if [ "$1" "$root$2" ]; then pass "installed $2"; else fail "missing $2"; fi
}
for program in warmpoold warmpool-worker warmpool warmpool-mkmodel; do
  check_file -x "$WARMPOOL_BINDIR/$program"
done
# The cuda backend's device owner, where this build has it.
if [ -x "$build_dir/bin/warmpool-owner" ]; then
  check_file -x "$WARMPOOL_BINDIR/warmpool-owner"
fi
# Test and measurement tools stay in the build tree.
for program in warmpool-chaos warmpool-bench warmpool-driver-check; do
  if [ -e "$root$WARMPOOL_BINDIR/$program" ]; then fail "$program must not be installed"; fi
done
unit_dir=$root$WARMPOOL_SYSTEMD_UNIT_DIR
check_file -f "$WARMPOOL_SYSTEMD_UNIT_DIR/warmpool.service"
check_file -f "$WARMPOOL_SYSTEMD_UNIT_DIR/warmpool.socket"
check_file -f "$WARMPOOL_SYSUSERS_DIR/warmpool.conf"
check_file -f "$WARMPOOL_TMPFILES_DIR/warmpool.conf"
check_file -f "$WARMPOOL_CONFIG_DIR/warmpool.toml"
check_file -f "$WARMPOOL_SHARE_DIR/warmpool.toml"
check_file -f "$WARMPOOL_INCLUDE_DIR/warmpool/engine.h"
check_file -f "$WARMPOOL_DOC_DIR/README.md"
check_file -d "$WARMPOOL_ENGINE_DIR"
if [ -d "$root$WARMPOOL_ENGINE_DIR" ] && [ -n "$(ls -A "$root$WARMPOOL_ENGINE_DIR")" ]; then
  fail "$WARMPOOL_ENGINE_DIR is shipped empty, but holds: $(ls -A "$root$WARMPOOL_ENGINE_DIR")"
fi
# Every @VARIABLE@ of the templates was filled in.
if grep -n '@[A-Z_]*@' "$unit_dir/warmpool.service" "$unit_dir/warmpool.socket" \
     "$root$WARMPOOL_CONFIG_DIR/warmpool.toml"; then
  fail "unsubstituted @VARIABLES@ above"
fi
exec_start=$(sed -n 's/^ExecStart=//p' "$unit_dir/warmpool.service")
if [ "$exec_start" = "$WARMPOOL_BINDIR/warmpoold --config $WARMPOOL_CONFIG_DIR/warmpool.toml" ]; then
  pass "ExecStart=$exec_start"
else
  fail "ExecStart=$exec_start does not start the installed warmpoold on the installed config"
fi

# An operator's edits survive a reinstall; the pristine default is refreshed beside it.
echo '# edited by the operator' >>"$root$WARMPOOL_CONFIG_DIR/warmpool.toml"
DESTDIR=$root "$cmake_bin" --install "$build_dir" >"$tmp/reinstall.log" 2>&1 || fail "reinstall failed"
if tail -n 1 "$root$WARMPOOL_CONFIG_DIR/warmpool.toml" | grep -q 'edited by the operator' &&
   grep -q "Keeping: .*warmpool.toml" "$tmp/reinstall.log"; then
  pass "reinstall kept the edited $WARMPOOL_CONFIG_DIR/warmpool.toml"
else
  fail "reinstall replaced the edited $WARMPOOL_CONFIG_DIR/warmpool.toml"
fi

# ---- systemd-analyze verify ----------------------------------------------------------------------
# verify resolves ExecStart= on this machine, where warmpoold is not installed; with --root= it
# would look for sysinit.target, /bin/kill and the modprobe@ units inside the scratch root, which
# has none of them. So verify copies of the installed units in which only the ExecStart= binary is
# redirected into the scratch root; everything else is checked as installed, against this
# machine's own units. The copies keep their names, so Requires=warmpool.socket resolves to ours.
mkdir -p "$tmp/units"
cp "$unit_dir/warmpool.socket" "$tmp/units/"
sed "s|^ExecStart=$WARMPOOL_BINDIR/|ExecStart=$root$WARMPOOL_BINDIR/|" \
  "$unit_dir/warmpool.service" >"$tmp/units/warmpool.service"
if ! grep -q "^ExecStart=$root" "$tmp/units/warmpool.service"; then
  fail "could not redirect ExecStart= into $root"
fi

verify() {  # verify UNIT...: prints every line systemd-analyze printed; fails on any
  local out rc=0
  out=$(cd "$tmp/units" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify "$@" 2>&1) || rc=$?
  # No line is filtered out: every message of verify about these units is a defect.
  if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    printf '%s\n' "$out"
    return 1
  fi
}
if out=$(verify "$tmp/units/warmpool.socket" "$tmp/units/warmpool.service"); then
  pass "systemd-analyze verify: no output"
else
  fail "systemd-analyze verify:"; printf '%s\n' "$out" >&2
fi

# The check above must be able to fail: a misspelt key is only a warning (exit 0) for verify.
sed 's/^KillMode=/KilMode=/' "$tmp/units/warmpool.service" >"$tmp/units/typo.service"
if out=$(verify "$tmp/units/typo.service"); then
  fail "systemd-analyze verify accepted a unit with a misspelt key (KilMode=)"
elif grep -q "KilMode" <<<"$out"; then
  pass "systemd-analyze verify reports a misspelt key"
else
  fail "systemd-analyze verify failed on the misspelt key for another reason:"; printf '%s\n' "$out" >&2
fi
rm -f "$tmp/units/typo.service"

# Hardening does not regress: systemd's own exposure score (0 best .. 100 worst, printed as
# 0.0 .. 10.0) stays at or under 2.0 ("OK"). GPU access, Unix sockets and CUDA's JIT cost the rest.
if out=$(cd "$tmp/units" && systemd-analyze security --offline=true --threshold=20 --no-pager \
           "$tmp/units/warmpool.service" 2>&1); then
  pass "systemd-analyze security: $(grep -o 'Overall exposure level.*' <<<"$out")"
else
  fail "systemd-analyze security: exposure above 2.0:"; printf '%s\n' "$out" | grep -v '^✓' >&2
fi

# ---- sysusers.d ---------------------------------------------------------------------------------
# Into the scratch root's /etc/passwd and /etc/group, never this machine's.
if out=$(systemd-sysusers --root="$root" "$root$WARMPOOL_SYSUSERS_DIR/warmpool.conf" 2>&1); then
  # Its only messages are the "Creating group/user" lines, one per entry.
  if unexpected=$(grep -v "^Creating group '\(warmpool\|warmpool-admin\)' with GID [0-9]*\.$" <<<"$out" |
                  grep -v "^Creating user 'warmpool' (.*) with UID [0-9]* and GID [0-9]*\.$"); then
    fail "systemd-sysusers printed:"; printf '%s\n' "$unexpected" >&2
  fi
else
  fail "systemd-sysusers --root failed:"; printf '%s\n' "$out" >&2
fi
passwd_line=$(grep '^warmpool:' "$root/etc/passwd" || true)
if [ "$(cut -d: -f6 <<<"$passwd_line")" = /var/lib/warmpool ]; then
  pass "sysusers: user warmpool, home /var/lib/warmpool"
else
  fail "sysusers: no user warmpool with home /var/lib/warmpool: '$passwd_line'"
fi
uid=$(cut -d: -f3 <<<"$passwd_line")
gid=$(grep '^warmpool:' "$root/etc/group" | cut -d: -f3 || true)
admin_line=$(grep '^warmpool-admin:' "$root/etc/group" || true)
admin_gid=$(cut -d: -f3 <<<"$admin_line")
if [ -n "$admin_gid" ] && [ "$(cut -d: -f4 <<<"$admin_line")" = warmpool ]; then
  pass "sysusers: group warmpool-admin, with the daemon's user in it"
else
  fail "sysusers: no group warmpool-admin with member warmpool: '$admin_line'"
fi

# ---- tmpfiles.d ---------------------------------------------------------------------------------
# It chowns to the scratch root's warmpool user, which only root may do.
if [ "$(id -u)" -ne 0 ]; then
  echo "note: not root, tmpfiles.d snippet not applied"
elif out=$(systemd-tmpfiles --root="$root" --create "$root$WARMPOOL_TMPFILES_DIR/warmpool.conf" 2>&1) &&
     [ -z "$out" ]; then
  check_dir() {  # check_dir PATH MODE UID GID
    local got
    got=$(stat -c '%a %u %g' "$root$1" 2>/dev/null || echo missing)
    if [ "$got" = "$2 $3 $4" ]; then pass "tmpfiles: $1 $got"; else fail "tmpfiles: $1 is '$got', want '$2 $3 $4'"; fi
  }
  check_dir /run/warmpool 755 0 0
  check_dir /var/lib/warmpool 750 "$uid" "$gid"
  check_dir /var/lib/warmpool/models 2770 "$uid" "$admin_gid"
else
  fail "systemd-tmpfiles --root --create:"; printf '%s\n' "$out" >&2
fi
# The service's StateDirectoryMode= must equal the tmpfiles mode, or each start would chmod it.
if grep -q '^StateDirectoryMode=0750$' "$unit_dir/warmpool.service" &&
   grep -q '^d /var/lib/warmpool 0750 warmpool warmpool ' "$root$WARMPOOL_TMPFILES_DIR/warmpool.conf"; then
  pass "StateDirectoryMode= matches tmpfiles.d"
else
  fail "StateDirectoryMode= of warmpool.service and /var/lib/warmpool in tmpfiles.d disagree"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all checks passed"
