#!/usr/bin/env bash
# prune_nested.sh - removing a checkpoint never removes what is nested in it
# (another checkpoint, a save in progress, a reader's lease on either), as an
# older daemon or a hand may have made one (saves refuse such roots now:
# roots.sh):
#   1. local: `ckptctl prune` of a root whose planned checkpoint holds a
#      checkpoint copied into it keeps the outer one whole, says why, and
#      exits non-zero; the nested one verifies;
#   2. S3 (moto, when the test Python has it): saves by a real ckptd, a
#      checkpoint nested in the one prune removes (copied there as a hand
#      would), read by a live reader (its lease), and a save in progress
#      rooted inside it (work area and its tagged shard): the prune removes
#      the outer checkpoint's own keys only, says what it left, and the
#      nested checkpoint, the lease and the save's keys stay byte for byte;
#      the nested checkpoint verifies and lists;
#   3. S3, crash-safety: the removal killed before each of its steps in
#      turn (tests/tools/rm_crash.c), then finished: never a nested key
#      lost, every own key gone, no tombstone left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh
# shellcheck source=tests/lib/ckptd.sh
. tests/lib/ckptd.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
for b in ckptd ckptctl tests/ckpt_save_one tests/rm_crash; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done
ctl=$build/ckptctl
save=$build/tests/ckpt_save_one
rmc=$build/tests/rm_crash
py=${CKPT_TEST_PYTHON:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-prune-nested.XXXXXX")
pids=()
holder=
cleanup() {
	for p in "${pids[@]}" $holder; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -n "$py" ] && moto_stop "$py" "$tmp/moto"
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	for l in "$tmp"/*.log; do
		[ -f "$l" ] && { echo "--- $l"; tail -n 30 "$l"; }
	done
	exit 1
}

chmod 755 "$tmp"
mkdir -p "$tmp/root" "$tmp/state"
root=$(cd "$tmp/root" && pwd -P)
cat >"$tmp/d.conf" <<CONF
socket = $tmp/d.sock
state_dir = $tmp/state
root = $root
arena_max = 64M
arena_total = 1G
o_direct = no
CONF
start d "$tmp/d.conf"

# ---- 1. local ----
for n in 1 2; do
	"$save" -s "$tmp/d.sock" -r "$root/job" -n "s$n" --step "$n" --wait committed >/dev/null \
		2>"$tmp/err" || fail "save s$n: $(cat "$tmp/err")"
done
cp -a "$root/job/s2" "$root/job/s1/inner"
digest "$root/job/s1" >"$tmp/s1.before"
rc=0
"$ctl" prune "$root/job" --keep-last 1 >"$tmp/prune.out" 2>&1 || rc=$?
[ $rc != 0 ] || fail "local prune with a nested checkpoint: exit 0: $(cat "$tmp/prune.out")"
grep -q "'inner' inside it is a checkpoint or a save of its own: kept whole" "$tmp/prune.out" ||
	fail "local prune did not say why: $(cat "$tmp/prune.out")"
digest "$root/job/s1" | cmp -s - "$tmp/s1.before" || fail "s1 or what is nested in it changed"
"$ctl" verify "$root/job/s1/inner" >/dev/null 2>"$tmp/err" || fail "inner: $(cat "$tmp/err")"
echo "ok: local: a checkpoint holding a nested one is kept whole, and the prune says why"

# ---- 2. S3 ----
if [ -z "$py" ] || ! "$py" -c 'import moto, boto3' 2>/dev/null; then
	echo "SKIP: [s3] needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	exit 0
fi
moto_start "$py" "$tmp/moto" || fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
s3put() { # KEY [TEXT]: one object
	"$py" -c 'import boto3, sys; boto3.client("s3").put_object(Bucket=sys.argv[1], Key=sys.argv[2], Body=sys.argv[3].encode())' \
		"$S3_BUCKET" "$1" "${2:-x}"
}
s3copy() { # FROM TO: every key under prefix FROM/ to TO/
	"$py" - "$S3_BUCKET" "$1/" "$2/" <<'PY'
import boto3, sys
b, src, dst = sys.argv[1:4]
s3 = boto3.client("s3")
for p in s3.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=src):
    for o in p.get("Contents", []):
        s3.copy_object(Bucket=b, Key=dst + o["Key"][len(src):],
                       CopySource={"Bucket": b, "Key": o["Key"]})
PY
}
s3root="s3://$S3_BUCKET/n"
mkdir -p "$tmp/state2"
cat >"$tmp/s.conf" <<CONF
socket = $tmp/s.sock
state_dir = $tmp/state2
root = $s3root
s3_endpoint = $S3_ENDPOINT
arena_max = 64M
arena_total = 1G
CONF
start s "$tmp/s.conf"
for n in 1 2; do
	"$save" -s "$tmp/s.sock" -r "$s3root/job" -n "s$n" --step "$n" --wait committed >/dev/null \
		2>"$tmp/err" || fail "S3 save s$n: $(cat "$tmp/err")"
done
# A checkpoint nested in s1, and a save in progress rooted inside s1 (its
# work area and a shard tagged with its attempt).
s3copy n/job/s2 n/job/s1/inner
hex=0123456789abcdef0123456789abcdef
s3put "n/job/s1/.ckpt-work-$hex/attempt.json" '{}'
s3put "n/job/s1/y/rank-00000.${hex:0:16}.safetensors"
# A live reader of the nested checkpoint: its lease.
coproc HOLD { exec "$rmc" hold "$s3root/job/s1/inner"; }
holder=$HOLD_PID
read -r -t 30 line <&"${HOLD[0]}" || fail "the reader did not open s1/inner"
[ "$line" = held ] || fail "hold said: $line"
s3keys n/job/s1/ | grep -v '^n/job/s1/[^/]* ' >"$tmp/nested.before"
grep -q '^n/job/s1/inner/\.ckpt-lease-' "$tmp/nested.before" || fail "no lease: $(cat "$tmp/nested.before")"
"$ctl" prune "$s3root/job" --keep-last 1 >"$tmp/s3prune.out" 2>&1 ||
	fail "S3 prune: $(cat "$tmp/s3prune.out")"
s3keys n/job/s1/ >"$tmp/s1.after"
cmp -s "$tmp/s1.after" "$tmp/nested.before" ||
	fail "nested keys changed or own keys left: $(diff "$tmp/nested.before" "$tmp/s1.after")"
grep -q "'$s3root/job/s1' removed; left 5 keys nested in it" "$tmp/s3prune.out" ||
	fail "the S3 prune did not say what it left: $(cat "$tmp/s3prune.out")"
"$ctl" verify "$s3root/job/s1/inner" >/dev/null 2>"$tmp/err" || fail "s1/inner: $(cat "$tmp/err")"
"$ctl" list "$s3root/job" --json >"$tmp/s3list.json" || fail "ckptctl list"
grep -q '"path":"s1/inner","state":"committed"' "$tmp/s3list.json" ||
	fail "s1/inner not listed: $(cat "$tmp/s3list.json")"
exec {HOLD[1]}>&-
wait "$holder" || fail "the reader of s1/inner failed"
holder=
echo "ok: S3: a prune removed the checkpoint's own keys only; the nested checkpoint, its reader's lease and a nested save stay"

# ---- 3. S3: crash before each step of such a removal ----
fixture() { # PREFIX: victim with own keys (also in a sub-prefix) and nested ones
	"$py" - "$S3_BUCKET" "$1" "$hex" <<'PY'
import boto3, json, sys
b, pre, hx = sys.argv[1:4]
s3 = boto3.client("s3")
man = {"format": "ckpt-1", "name": "victim", "step": 9, "time": "2026-11-12T03:00:00Z",
       "job": "j", "world_size": 1, "crc_block": 1048576, "metadata": {}, "metrics": {},
       "files": [], "total_bytes": 0, "tensors": {}, "blobs": {}}
put = lambda k, body: s3.put_object(Bucket=b, Key=pre + "/victim/" + k, Body=body)
put("manifest.json", json.dumps(man).encode())
put("shard-0.bin", b"own")
put("sub/x.bin", b"own too")
put("y/other.bin", b"own: no save's shard")
put("inner/manifest.json", json.dumps(dict(man, name="inner")).encode())
put("inner/rank-00000.bin", b"nested")
put("inner/.ckpt-lease-0123", b"a reader's")
put(".ckpt-work-%s/attempt.json" % hx, b"{}")
put("y/rank-00000.%s.safetensors" % hx[:16], b"a save's shard")
PY
}
nested_keys() { # PREFIX: the keys of what is nested in victim
	s3keys "$1/victim/" | grep -E "^$1/victim/(inner/|\.ckpt-work-|y/rank-)" || true
}
k=1
while :; do
	[ $k -le 20 ] || fail "the removal did not end within 20 steps"
	pre=c$k
	fixture $pre
	nested_keys $pre >"$tmp/before"
	[ "$(wc -l <"$tmp/before")" = 5 ] || fail "fixture: $(cat "$tmp/before")"
	set +e
	out=$("$rmc" remove "s3://$S3_BUCKET/$pre" victim $k 2>&1)
	rc=$?
	set -e
	[ $rc = 0 ] || [ $rc = 86 ] || fail "step $k: rm_crash exit $rc: $out"
	nested_keys $pre | cmp -s - "$tmp/before" || fail "step $k: a nested key changed or went"
	if [ $rc = 86 ]; then
		"$rmc" remove "s3://$S3_BUCKET/$pre" victim 0 >"$tmp/finish.out" 2>&1 ||
			fail "step $k: finishing the removal: $(cat "$tmp/finish.out")"
	fi
	left=$(s3keys $pre/victim/)
	[ "$left" = "$(cat "$tmp/before")" ] || fail "step $k: left under victim: $left"
	[ $rc = 0 ] && break
	k=$((k + 1))
done
[ $k -ge 4 ] || fail "the S3 removal took only $k steps: the hook is not reached"
echo "ok: S3: a removal killed before each of its $((k - 1)) steps, then finished, kept every nested key"
