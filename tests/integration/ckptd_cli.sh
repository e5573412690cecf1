#!/usr/bin/env bash
# ckptd_cli.sh - ckptd's command line and config file compose as users
# expect: with the installed example config (whose root need not exist
# here), `ckptd -r DIR -s SOCK` serves DIR only; flags win over the file;
# bad usage exits 2 and a bad configuration 78 with FILE:LINE.  And `make
# install PREFIX=... DESTDIR=...` writes nothing outside DESTDIR/PREFIX.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

bin=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
ckptd=$bin/ckptd
ctl=$bin/ckptctl
for b in "$ckptd" "$ctl"; do
	if [ ! -x "$b" ]; then
		echo "FAIL: $b is not built"
		exit 1
	fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-cli.XXXXXX")
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

# expect RC PATTERN -- CMD...: CMD exits RC and its output matches PATTERN.
expect() {
	local want=$1 pat=$2 out rc=0
	shift 3
	out=$("$@" 2>&1) || rc=$?
	[ "$rc" = "$want" ] || fail "'$*' exited $rc, want $want: $out"
	grep -Eq -- "$pat" <<<"$out" || fail "'$*': output lacks /$pat/: $out"
}

example=systemd/ckptd.conf.example
mkdir -p "$tmp/root" "$tmp/other"

# The example's root is replaced by -r, not added to.
expect 0 '^configuration is valid$' -- "$ckptd" --check-config -c "$example" -r "$tmp/root" \
	-s "$tmp/s.sock"
if [ ! -d /var/lib/ckptd/checkpoints ]; then
	line=$(grep -n '^root = ' "$example" | cut -d: -f1)
	expect 78 "invalid configuration: $example:$line: root '/var/lib/ckptd/checkpoints': No such file" -- \
		"$ckptd" --check-config -c "$example" -s "$tmp/s.sock"
fi

# Usage errors: 2; configuration errors: 78.
expect 2 "unknown option '--frob'" -- "$ckptd" --frob
expect 2 "-o 'nokey': expected KEY=VALUE" -- "$ckptd" -o nokey -r "$tmp/root"
expect 78 "option -o: unknown key 'bogus'" -- "$ckptd" --check-config -c "$example" \
	-r "$tmp/root" -o bogus=1
expect 78 "$tmp/absent.conf: No such file" -- "$ckptd" --check-config -c "$tmp/absent.conf" \
	-r "$tmp/root"
expect 78 "option -r: root '$tmp/nope': No such file" -- "$ckptd" --check-config \
	-c "$example" -r "$tmp/nope"

# A real daemon: the roots and values it serves are the flags' ones.
printf 'socket = %s/file.sock\nroot = %s/other\nuring_depth = 8\n' "$tmp" "$tmp" \
	>"$tmp/ckptd.conf"
"$ckptd" -c "$tmp/ckptd.conf" -r "$tmp/root" -s "$tmp/d.sock" -o uring_depth=32 \
	-o "state_dir=$tmp/state" -o o_direct=no 2>"$tmp/ckptd.log" &
pid=$!
for _ in $(seq 100); do
	[ -S "$tmp/d.sock" ] && break
	kill -0 "$pid" 2>/dev/null || fail "ckptd exited: $(cat "$tmp/ckptd.log")"
	sleep 0.1
done
[ -S "$tmp/d.sock" ] || fail "ckptd did not listen on $tmp/d.sock: $(cat "$tmp/ckptd.log")"
[ ! -e "$tmp/file.sock" ] || fail "ckptd listened on the file's socket too"
"$ctl" -s "$tmp/d.sock" status --json >"$tmp/status.json" || fail "status: $(cat "$tmp/status.json")"
kill -TERM "$pid"
wait "$pid" || fail "ckptd did not stop cleanly: $(cat "$tmp/ckptd.log")"
pid=
python3 - "$tmp/status.json" "$(cd "$tmp/root" && pwd -P)" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
cfg = st["config"]
assert cfg["roots"] == [sys.argv[2]], cfg["roots"]
assert cfg["uring_depth"] == 32, cfg
EOF

# make install keeps every path under DESTDIR/PREFIX (and the config under
# PREFIX/etc unless PREFIX=/usr).  A dry run: nothing is built or written.
if command -v make >/dev/null 2>&1; then
	plan=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n -s install PREFIX=/opt/ck \
		DESTDIR=/dest BUILD="$tmp/b" 2>&1) || fail "make -n install: $plan"
	for want in /dest/opt/ck/bin/ /dest/opt/ck/etc/ckptd/ckptd.conf \
		/dest/opt/ck/lib/systemd/system/ckptd.service /dest/opt/ck/lib/tmpfiles.d/ckptd.conf \
		'-DCKPTD_CONFIG_PATH=.*/opt/ck/etc/ckptd/ckptd.conf'; do
		grep -Eq -- "$want" <<<"$plan" || fail "make install does not write $want: $plan"
	done
	if grep -Eq '(^|[ >=])/etc/' <<<"$plan"; then
		fail "make install PREFIX=/opt/ck writes to /etc: $(grep -E '(^|[ >=])/etc/' <<<"$plan")"
	fi
	plan=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n -s install PREFIX=/usr \
		DESTDIR=/dest BUILD="$tmp/b" 2>&1) || fail "make -n install: $plan"
	grep -q /dest/etc/ckptd/ckptd.conf <<<"$plan" || fail "PREFIX=/usr: config not in /etc: $plan"
fi
echo "ckptd_cli: all checks passed"
