#!/usr/bin/env bash
# retention.sh - ckptd's own retention (daemon/retention.h): a real ckptd
# with `retention = ROOT keep_last 2` prunes, in the background after each
# commit, the committing user's checkpoints of that directory: after six
# saves of the example trainer two are left (the newest two), plus the one
# pinned; the status report shows the policy and the removals; a failed
# save removes nothing; a directory without a policy is never touched;
# `retention_sweep` and SIGUSR1 prune again a directory where checkpoints
# were added behind the daemon's back; a config naming a directory outside
# the roots, or a bad rule, is refused at start with FILE:LINE.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
for b in ckptd ckptctl examples/trainer tests/ckpt_save_one; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done
sys=/usr/bin/python3
[ -x "$sys" ] || { echo "needs /usr/bin/python3"; exit 77; }
ctl=$build/ckptctl

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-retention.XXXXXX")
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
	[ -f "$tmp/ckptd.log" ] && { echo "--- ckptd.log"; tail -n 30 "$tmp/ckptd.log"; }
	exit 1
}

chmod 755 "$tmp"
root=$tmp/root
mkdir -p "$root/kept" "$root/free" "$tmp/state"
root=$(cd "$root" && pwd -P)
sock=$tmp/ckptd.sock
base="socket = $sock
state_dir = $tmp/state
root = $root
arena_max = 64M
arena_total = 1G
o_direct = no"

# Refused at start: a directory outside the roots, a bad rule.
printf '%s\nretention = %s keep_last 2\n' "$base" "$tmp" >"$tmp/bad.conf"
rc=0
"$build/ckptd" --check-config -c "$tmp/bad.conf" >"$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" = 78 ] && grep -q "bad.conf:7: retention: '$tmp' is not a root nor below one" "$tmp/bad.out" ||
	fail "a policy outside the roots: exit $rc: $(cat "$tmp/bad.out")"
printf '%s\nretention = %s keep_lots 2\n' "$base" "$root" >"$tmp/bad.conf"
rc=0
"$build/ckptd" --check-config -c "$tmp/bad.conf" >"$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" = 78 ] && grep -q "bad.conf:7: retention of '$root': " "$tmp/bad.out" ||
	fail "a bad rule: exit $rc: $(cat "$tmp/bad.out")"
echo "ok: policies outside the roots and bad rules refused at start"

printf '%s\nretention = %s/kept keep_last 2\nretention_sweep = 0\n' "$base" "$root" \
	>"$tmp/ckptd.conf"
"$build/ckptd" -c "$tmp/ckptd.conf" >"$tmp/ckptd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
	[ -S "$sock" ] && break
	kill -0 "$pid" 2>/dev/null || fail "ckptd exited"
	sleep 0.05
done
[ -S "$sock" ] || fail "ckptd did not listen"

# committed DIR: the committed checkpoints directly in DIR, sorted.
committed() {
	"$ctl" list "$1" --json | "$sys" -c '
import json, sys
names = sorted(o["path"] for o in map(json.loads, sys.stdin)
               if o.get("state") == "committed" and "/" not in o["path"])
print(" ".join(names))'
}
# wait_for DIR WANT: until the committed checkpoints are WANT (bounded).
wait_for() {
	local got=
	for _ in $(seq 200); do
		got=$(committed "$1")
		[ "$got" = "$2" ] && return 0
		sleep 0.05
	done
	fail "in $1: '$got', want '$2'"
}

# Six saves, step 3 pinned (the pin list written before it exists):
# steps 5 and 6 are the last two, 3 is pinned; 1, 2 and 4 go.
printf '# pinned by the test\nstep-000003\n' >"$root/kept/.ckpt-pins"
"$build/examples/trainer" --socket "$sock" --root "$root/kept" --job r --steps 6 --mib 1 \
	--save-every 1 >"$tmp/trainer.log" 2>&1 || fail "trainer: $(cat "$tmp/trainer.log")"
wait_for "$root/kept" "step-000003 step-000005 step-000006"
grep -q "retention: removed '$root/kept/step-000001'" "$tmp/ckptd.log" || fail "no removal logged"
ls -A "$root/kept" | grep -q "ckpt-trash" && fail "trash left in $root/kept"
"$ctl" -s "$sock" status --json >"$tmp/status.json" || fail "status"
"$sys" - "$tmp/status.json" "$root/kept" <<'PY' || fail "status: $(cat "$tmp/status.json")"
import json, sys
st = json.load(open(sys.argv[1]))
pol = st["config"]["retention"]
assert pol == [{"root": sys.argv[2], "policy": "keep_last 2"}], pol
assert st["config"]["retention_sweep_s"] == 0, st["config"]
assert st["retention"]["removed"] == 3 and st["retention"]["errors"] == 0, st["retention"]
PY
echo "ok: after each commit the policy removed what it does not keep (pins kept)"

# No policy: nothing goes.
"$build/examples/trainer" --socket "$sock" --root "$root/free" --job f --steps 4 --mib 1 \
	--save-every 1 >"$tmp/trainer.log" 2>&1 || fail "trainer (free)"
sleep 0.5
[ "$(committed "$root/free")" = "step-000001 step-000002 step-000003 step-000004" ] ||
	fail "a directory without a policy lost checkpoints: $(committed "$root/free")"

# Checkpoints added behind the daemon's back are pruned on demand
# (SIGUSR1: the sweep).
for n in 000007 000008; do
	cp -a "$root/kept/step-000006" "$root/kept/step-$n"
	"$sys" - "$root/kept/step-$n/manifest.json" "step-$n" "${n#0000}" <<'PY'
import json, sys
p, name, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = json.load(open(p))
m["name"], m["step"] = name, step
json.dump(m, open(p, "w"))
PY
done
kill -USR1 "$pid"
wait_for "$root/kept" "step-000003 step-000007 step-000008"
grep -q "SIGUSR1: retention sweep" "$tmp/ckptd.log" || fail "SIGUSR1 not logged"
echo "ok: no policy, nothing removed; SIGUSR1 sweeps"

# A directory the daemon knows, swapped for a symbolic link to other
# checkpoints: the sweep never follows it (they all stay).
save1() { # ROOT NAME STEP [setpriv args...]
	local r=$1 n=$2 st=$3
	shift 3
	"$@" "$build/tests/ckpt_save_one" -s "$sock" -r "$r" -n "$n" --step "$st" --job j \
		--wait committed >/dev/null 2>"$tmp/save1.err" || fail "save $r/$n: $(cat "$tmp/save1.err")"
}
mkdir -p "$root/kept/run" "$root/other"
save1 "$root/kept/run" s1 1
save1 "$root/kept/run" s2 2
for n in 1 2 3; do
	cp -a "$root/kept/run/s1" "$root/other/o$n"
	"$sys" - "$root/other/o$n/manifest.json" "o$n" "$n" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["name"], m["step"] = sys.argv[2], int(sys.argv[3])
json.dump(m, open(sys.argv[1], "w"))
PY
done
mv "$root/kept/run" "$root/kept/run.old"
ln -s "$root/other" "$root/kept/run"
kill -USR1 "$pid"
for _ in $(seq 100); do
	grep -q "retention of '$root/kept/run': a symbolic link is in its path now" "$tmp/ckptd.log" && break
	sleep 0.05
done
grep -q "retention of '$root/kept/run': a symbolic link is in its path now" "$tmp/ckptd.log" ||
	fail "the sweep did not refuse the swapped directory"
[ "$(committed "$root/other")" = "o1 o2 o3" ] || fail "a sweep followed a symbolic link: $(committed "$root/other")"
echo "ok: a known directory swapped for a symbolic link is never followed"

kill "$pid"
wait "$pid" || fail "ckptd did not stop cleanly"
pid=

# ---- S3 (moto): a pass after a commit covers the committing user's
# checkpoints only (the manifest records the uid) ----
py=${CKPT_TEST_PYTHON:-}
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && [ -n "$py" ] &&
	"$py" -c 'import moto, boto3' 2>/dev/null; then
	# shellcheck source=tests/lib/moto.sh
	. tests/lib/moto.sh
	moto_start "$py" "$tmp/moto" || fail "moto did not start"
	s3root="s3://$S3_BUCKET/shared"
	printf 'socket = %s\nsocket_mode = 0666\nstate_dir = %s\nroot = %s\nroot = %s\nretention = %s keep_last 1\nretention_sweep = 0\n' \
		"$sock" "$tmp/state" "$root" "$s3root" "$s3root" >"$tmp/s3.conf"
	"$build/ckptd" -c "$tmp/s3.conf" >"$tmp/ckptd.log" 2>&1 &
	pid=$!
	for _ in $(seq 200); do
		[ -S "$sock" ] && break
		kill -0 "$pid" 2>/dev/null || fail "ckptd (S3) exited"
		sleep 0.05
	done
	save1 "$s3root/run" a1 1 setpriv --reuid=4242 --regid=4242 --clear-groups
	save1 "$s3root/run" a2 2 setpriv --reuid=4242 --regid=4242 --clear-groups
	save1 "$s3root/run" b3 3 setpriv --reuid=4343 --regid=4343 --clear-groups
	save1 "$s3root/run" b4 4 setpriv --reuid=4343 --regid=4343 --clear-groups
	sleep 1
	got=$("$ctl" list "$s3root/run" --json | "$sys" -c '
import json, sys
print(" ".join(sorted(o["path"] for o in map(json.loads, sys.stdin) if o.get("state") == "committed")))')
	[ "$got" = "a2 b4" ] || fail "S3: one user's commits removed another's: left '$got'"
	kill "$pid"
	wait "$pid" || fail "ckptd (S3) did not stop cleanly"
	pid=
	moto_stop "$py" "$tmp/moto"
	echo "ok: on S3 each user's checkpoints are pruned apart (a2 and b4 kept)"
else
	echo "SKIP: [s3] needs root, setpriv and the test Python with moto"
fi
echo "retention: all checks passed"
