#!/usr/bin/env bash
# python_wheel.sh - what a user of the Python package does: `make wheel`,
# install the wheel into a fresh venv, and run the README's Python example
# against the daemon `make demo` starts (scripts/demo.sh --serve: the same
# ckptd, the same config).  The example is cut out of README.md, between
# the <!-- python-example --> markers, and run as it stands, so the README
# and this test cannot drift apart.
#
# The fresh venv (python3 -m venv of the test Python's own base interpreter)
# gets the wheel alone, from the file, with no index (it needs nothing
# else).  torch is not installed into it again (GBs, minutes): a .pth file
# puts the test Python's site-packages after the venv's own, so `import
# torch` finds the test environment's torch while `import ckptd` must find
# the wheel's copy (checked: no PYTHONPATH, no CKPTD_LIBCKPT, the example
# runs outside the checkout).
#
# Checks: the wheel's tag is py3-none-<platform>; its libckpt resolves
# jansson and ISA-L to the copies beside it and needs nothing else from the
# system but glibc and libcurl; importing ckptd does not import torch; the
# example exits 0 (it checks its own restore) and leaves committed
# checkpoints that `ckptctl verify` passes, committed by the demo's daemon.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
repo=$(pwd)
build=${CKPT_BUILD_DIR:-$repo/${BUILD:-build}}
py=${CKPT_TEST_PYTHON:-}

skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

[ -n "$py" ] || skip "no test Python environment (scripts/pyenv.sh test)"
if grep -q 'lib[at]san\|libubsan' <<<"$(ldd "$build/libckpt.so" 2>/dev/null)"; then
	skip "sanitized build: the wheel is built and tested in the plain build"
fi
"$py" -c 'import torch' 2>/dev/null || skip "the test Python has no torch"
base=$("$py" -c 'import sys; print(sys._base_executable)') || fail "cannot ask $py for its base"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || fail "no purelib"
scripts/pyenv.sh wheel >/dev/null 2>&1 ||
	skip "no Python environment to build wheels with (scripts/pyenv.sh wheel: is PyPI reachable?)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-wheel.XXXXXX")
pid=
stop_daemon() {
	[ -n "$pid" ] || return 0
	kill -TERM "$pid" 2>/dev/null || { pid=; return 0; }
	for _ in $(seq 300); do
		kill -0 "$pid" 2>/dev/null || { pid=; return 0; }
		sleep 0.1
	done
	echo "ckptd (pid $pid) did not stop within 30 s of SIGTERM: killed" >&2
	kill -KILL "$pid" 2>/dev/null
	pid=
	return 1
}
cleanup() {
	stop_daemon
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# -- the wheel, as `make wheel` makes it (this build's objects) --
unset MAKEFLAGS MFLAGS MAKELEVEL
make --no-print-directory BUILD="$build" wheel >"$tmp/make.log" 2>&1 || {
	cat "$tmp/make.log" >&2
	fail "make wheel failed"
}
wheels=("$build"/wheel/*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
	fail "make wheel left ${#wheels[@]} wheels"
fi
wheel=${wheels[0]}
plat=$("$base" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
case $(basename "$wheel") in
ckptd-*-py3-none-"$plat".whl) ;;
*) fail "$(basename "$wheel"): not tagged py3-none-$plat" ;;
esac
echo "wheel: $wheel"

# -- a fresh venv with the wheel, seeing the test env's torch --
"$base" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1 || {
	cat "$tmp/venv.log" >&2
	skip "$base -m venv failed (python3-venv missing?)"
}
vpy=$tmp/venv/bin/python
"$vpy" -m pip install --quiet --no-index --no-deps "$wheel" || fail "pip install of the wheel failed"
vsite=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$vsite/zz-ckptd-test-env.pth"

run_venv() {
	(cd "$tmp" && env -u PYTHONPATH -u CKPTD_LIBCKPT -u CKPT_BUILD_DIR -u PYTHONHOME "$@")
}

# Imports from the venv, libckpt from the wheel, torch not imported.
where=$(run_venv "$vpy" -c '
import sys, ckptd
assert "torch" not in sys.modules, "import ckptd imported torch"
print(ckptd.__file__)
print(ckptd.libckpt_path())
print(ckptd.libckpt_version())') || fail "import ckptd failed in the fresh venv"
printf '%s\n' "$where"
{
	read -r modfile
	read -r libfile
	read -r libver
} <<<"$where"
case $modfile in "$vsite"/ckptd/__init__.py) ;; *) fail "ckptd came from $modfile, not the wheel" ;; esac
case $libfile in "$vsite"/ckptd/_lib/libckpt.so.0) ;; *) fail "libckpt came from $libfile" ;; esac
want_ver=$(sed -n 's/^VERSION *:= *//p' Makefile)
[ "$libver" = "$want_ver" ] || fail "bundled libckpt is $libver, the Makefile says $want_ver"

# What the bundled copy needs from the machine: only glibc and libcurl
# (Debian's libcurl4); jansson and ISA-L are the copies beside it.
# (Whole outputs first: grep -q ending a pipe early would fail it.)
needed=$(readelf -d "$libfile" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
resolved=$(ldd "$libfile") || fail "ldd $libfile failed"
for n in $needed; do
	case $n in
	libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | ld-linux-*.so.* | libcurl.so.4) ;;
	libjansson.so.4 | libisal.so.2)
		grep -qF "$n => $vsite/ckptd/_lib/$n " <<<"$resolved" ||
			fail "$n is not resolved to the wheel's copy: $(grep -F "$n" <<<"$resolved")"
		;;
	*) fail "the bundled libckpt needs $n, which a user's machine may lack" ;;
	esac
done
! grep -q 'not found' <<<"$resolved" || fail "unresolved: $(grep 'not found' <<<"$resolved")"
echo "libckpt needs: $(tr '\n' ' ' <<<"$needed")"

# -- the demo's daemon --
out=$(CKPT_DEMO_DIR="$tmp/demo" BUILD="$build" scripts/demo.sh --serve 2>"$tmp/demo.err") || {
	cat "$tmp/demo.err" >&2
	fail "scripts/demo.sh --serve failed"
}
eval "$out"
pid=${CKPTD_PID:-}
if [ -z "$pid" ] || [ ! -S "${CKPTD_SOCKET:-}" ] || [ ! -d "${CKPT_ROOT:-}" ]; then
	fail "scripts/demo.sh --serve printed no usable socket, root and pid: $out"
fi

# -- the README's example, as written --
awk '/^<!-- python-example -->$/ { n++; on = 1; next }
     /^<!-- \/python-example -->$/ { on = 0; next }
     on { print }
     END { if (n != 1) exit 1 }' README.md >"$tmp/block.md" ||
	fail "README.md must hold exactly one <!-- python-example --> block"
if [ "$(head -n 1 "$tmp/block.md")" != '```python' ] || [ "$(tail -n 1 "$tmp/block.md")" != '```' ]; then
	fail "the README's python-example block is not one fenced python block"
fi
sed '1d;$d' "$tmp/block.md" >"$tmp/example.py"
echo "running the README's example ($(wc -l <"$tmp/example.py") lines) against ckptd pid $pid"
run_venv CKPTD_SOCKET="$CKPTD_SOCKET" CKPT_ROOT="$CKPT_ROOT" timeout 300 "$vpy" example.py \
	>"$tmp/example.out" 2>&1
rc=$?
cat "$tmp/example.out"
[ "$rc" -eq 0 ] || fail "the README's example exited with $rc"

# -- what it left: committed checkpoints, whole, committed by this daemon --
list=$("$build/ckptctl" list --json "$CKPT_ROOT") || fail "ckptctl list $CKPT_ROOT failed"
mapfile -t committed < <(printf '%s\n' "$list" | "$py" -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    if e.get("state") == "committed":
        print(e["path"])')
[ "${#committed[@]}" -gt 0 ] || fail "no committed checkpoint under $CKPT_ROOT: $list"
for c in "${committed[@]}"; do
	"$build/ckptctl" verify "$CKPT_ROOT/$c" >"$tmp/verify.out" 2>&1 || {
		cat "$tmp/verify.out" >&2
		fail "ckptctl verify $c failed"
	}
	tail -n 1 "$tmp/verify.out"
done
n=$("$build/ckptctl" -s "$CKPTD_SOCKET" status --json |
	"$py" -c 'import json, sys; print(json.load(sys.stdin)["totals"]["saves_committed"])') ||
	fail "ckptctl status of the demo's daemon failed"
[ "$n" -ge "${#committed[@]}" ] ||
	fail "the demo's ckptd committed $n saves, fewer than the ${#committed[@]} checkpoints"
kill -0 "$pid" 2>/dev/null || fail "the demo's ckptd is gone"
stop_daemon || fail "the demo's ckptd did not stop on SIGTERM"
echo "OK: ${#committed[@]} checkpoints committed by the wheel in a fresh venv"
