#!/usr/bin/env bash
# prune_crash.sh - removal is crash-safe: a removal of a committed checkpoint
# killed just before each of its steps in turn (tests/tools/rm_crash.c:
# _exit, as a crash) leaves either the checkpoint whole or nothing that
# looks committed (not listed, not shown, not the newest the library
# finds), never a torn one; the next real `ckptctl prune` finishes the job
# and leaves the other checkpoints byte for byte.  Then, locally: a reader's
# lease keeps a checkpoint from removal ("in use"), another uid's prune is
# refused (exit 6, nothing removed) when run as root; on S3 (moto, when the
# test Python has it): the same crash loop over tombstone, lease check,
# DeleteObjects batches and the tombstone's deletion; readers' leases (kept
# in use, manifest put back; a reader after the tombstone fails cleanly;
# dead leases ignored); pins (pin/unpin, concurrent pins, a pin racing a
# removal); and a real prune of an S3 root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
ctl=$build/ckptctl
rmc=$build/tests/rm_crash
for b in "$ctl" "$rmc"; do
	[ -x "$b" ] || { echo "FAIL: $b is not built"; exit 1; }
done
sys=/usr/bin/python3
[ -x "$sys" ] || { echo "needs /usr/bin/python3 for its fixtures"; exit 77; }
py=${CKPT_TEST_PYTHON:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-prune-crash.XXXXXX")
holder=
bg=
cleanup() {
	for p in $holder $bg; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -n "$py" ] && moto_stop "$py" "$tmp/moto"
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	exit 1
}

# fixture ROOT: checkpoints a (step 100), b (200) and victim (step 900, the
# newest: a listing that took its trash for a checkpoint would make it the
# one to resume from), each with files in a subdirectory too; SUMS gets
# every file's digest.
fixture() {
	"$sys" - "$1" <<'PY'
import hashlib, json, os, sys
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
for name, step, day in (("a", 100, 10), ("b", 200, 11), ("victim", 900, 12)):
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "sub"))
    man = {"format": "ckpt-1", "name": name, "step": step,
           "time": "2026-11-%02dT03:00:00Z" % day, "job": "j", "world_size": 1,
           "crc_block": 1048576, "metadata": {}, "metrics": {}, "files": [],
           "total_bytes": 0, "tensors": {}, "blobs": {}}
    json.dump(man, open(os.path.join(d, "manifest.json"), "w"))
    for i in range(3):
        open(os.path.join(d, "shard-%d.bin" % i), "wb").write(os.urandom(4096 + i))
    open(os.path.join(d, "sub", "index.json"), "w").write("{}")
PY
}
sums() { # ROOT: a digest of every file of a and b
	(cd "$1" && find a b -type f -print0 | sort -z | xargs -0 sha256sum)
}

# check_after_crash ROOT: victim whole, or not committed anywhere.
check_after_crash() {
	local root=$1 k=$2
	if [ -d "$root/victim" ]; then
		# (a crash after the removal marker was written leaves it: the
		# checkpoint itself is whole)
		[ -f "$root/victim/manifest.json" ] &&
			[ "$(find "$root/victim" -type f ! -name .ckpt-removing | wc -l)" = 5 ] ||
			fail "step $k: victim is still there but torn: $(find "$root/victim")"
		return
	fi
	"$ctl" list "$root" --json >"$tmp/list.json" || fail "step $k: list failed"
	"$sys" - "$tmp/list.json" "$k" <<'PY' || fail "step $k: something still looks committed"
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    p = o.get("path", o.get("name", ""))
    if "victim" in p or "trash" in p:
        print("listed after crash at step %s: %s" % (sys.argv[2], line.strip()))
        sys.exit(1)
PY
	if "$ctl" show "$root/victim" >/dev/null 2>&1; then
		fail "step $k: show still finds victim"
	fi
}

# ---- local: a crash before every step ----
k=1
while :; do
	[ $k -le 40 ] || fail "local removal did not end within 40 steps"
	root=$tmp/l$k
	fixture "$root"
	sums "$root" >"$tmp/sums.before"
	set +e
	out=$("$rmc" remove "$root" victim $k 2>&1)
	rc=$?
	set -e
	[ $rc = 0 ] || [ $rc = 86 ] || fail "step $k: rm_crash exit $rc: $out"
	check_after_crash "$root" $k
	# The next prune finishes the removal and keeps a and b.
	"$ctl" prune "$root" --keep-last 5 >"$tmp/prune.out" 2>&1 ||
		fail "step $k: prune after the crash: $(cat "$tmp/prune.out")"
	if [ -d "$root/victim" ]; then
		"$rmc" remove "$root" victim 0 >/dev/null || fail "step $k: removal after the crash"
	fi
	left=$(cd "$root" && ls -A)
	[ -z "$(ls -A "$root" | grep ckpt-trash)" ] || fail "step $k: trash left: $left"
	[ "$left" = "$(printf 'a\nb')" ] || fail "step $k: the root holds: $left"
	sums "$root" | cmp -s - "$tmp/sums.before" || fail "step $k: a or b changed"
	rm -rf "$root"
	[ $rc = 0 ] && break
	k=$((k + 1))
done
[ $k -ge 8 ] || fail "local removal took only $k steps: the hook is not reached"
echo "local: a crash before each of the $((k - 1)) steps of a removal left nothing torn"

# ---- local: a reader's lease keeps a checkpoint ----
root=$tmp/lease
fixture "$root"
coproc HOLD { exec "$rmc" hold "$root/a"; }
holder=$HOLD_PID
read -r -t 20 line <&"${HOLD[0]}" || fail "the reader did not open a"
[ "$line" = held ] || fail "hold said: $line"
"$ctl" prune "$root" --keep-last 1 --json >"$tmp/lease.json" || fail "prune with a lease held"
grep -q '"name":"a".*"action":"keep","reasons":\["in-use"\]' "$tmp/lease.json" ||
	fail "a not kept in use: $(cat "$tmp/lease.json")"
grep -q '"name":"b".*"action":"removed"' "$tmp/lease.json" || fail "b not removed: $(cat "$tmp/lease.json")"
[ -f "$root/a/manifest.json" ] || fail "a lost its manifest under a lease"
exec {HOLD[1]}>&-
wait "$holder" || fail "the reader failed"
holder=
"$ctl" prune "$root" --keep-last 1 >/dev/null || fail "prune after the lease ended"
[ ! -e "$root/a" ] || fail "a still there after its lease ended"
echo "local: a reader's lease kept its checkpoint; removed once it ended"

# ---- local: another uid's prune is refused; in a shared root, another
# user's checkpoints neither count in nor take protections from a plan ----
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	root=$tmp/owned
	fixture "$root"
	chmod 755 "$tmp"
	chown -R 4242:4242 "$root/a" "$root/b" "$root/victim"
	chmod 1777 "$root"
	as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; }
	set +e
	as 4343 "$ctl" prune "$root" --keep-last 1 >"$tmp/other.out" 2>&1
	rc=$?
	set -e
	[ $rc = 6 ] || fail "another uid's prune: exit $rc, not 6: $(cat "$tmp/other.out")"
	grep -q "belong to uid 4343: a user prunes only their own" "$tmp/other.out" ||
		fail "refusal unclear: $(cat "$tmp/other.out")"
	[ "$(cd "$root" && ls -A | tr '\n' ' ')" = "a b victim " ] || fail "a refused prune removed something"
	# uid 4343 plants a "newer" checkpoint of its own: the owner's plan
	# does not see it, so the owner's newest stays newest.
	as 4343 mkdir "$root/zz"
	as 4343 "$sys" -c 'import json, sys; json.dump({"format": "ckpt-1", "name": "zz",
	    "step": 999999999, "time": "2099-01-01T00:00:00Z", "job": "j", "world_size": 1,
	    "crc_block": 1048576, "metadata": {}, "metrics": {}, "files": [], "total_bytes": 0,
	    "tensors": {}, "blobs": {}}, open(sys.argv[1], "w"))' "$root/zz/manifest.json"
	as 4242 "$ctl" prune "$root" --keep-last 1 >"$tmp/own.out" 2>&1 ||
		fail "the owner's prune: $(cat "$tmp/own.out")"
	[ "$(cd "$root" && ls -A | tr '\n' ' ')" = "victim zz " ] ||
		fail "the owner's prune left: $(ls -A "$root"): $(cat "$tmp/own.out")"
	grep -q "1 checkpoint of other users left out" "$tmp/own.out" || fail "others not said: $(cat "$tmp/own.out")"
	# Another user renames the owner's checkpoint to look like trash: the
	# next prune reports it and removes nothing of it.
	as 4343 mv "$root/zz" "$root/.ckpt-trash-gotcha"
	"$ctl" prune "$root" --keep-last 5 >"$tmp/trash.out" 2>&1 && fail "planted trash: exit 0"
	grep -q "looks like trash but no removal marked it" "$tmp/trash.out" || fail "planted trash: $(cat "$tmp/trash.out")"
	[ -f "$root/.ckpt-trash-gotcha/manifest.json" ] || fail "planted trash was removed"
	echo "local: another uid's prune refused (exit 6); the owner's plan ignores others' checkpoints; planted trash kept"
else
	echo "SKIP: [other-uid] needs root and setpriv to run ckptctl as two other users"
fi

# ---- S3 ----
if [ -z "$py" ] || ! "$py" -c 'import moto, boto3' 2>/dev/null; then
	echo "SKIP: [s3] needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	exit 0
fi
moto_start "$py" "$tmp/moto" || fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
s3fix() { # PREFIX: uploads the local fixture (a, b, victim) under it
	local src=$tmp/s3src
	rm -rf "$src"
	fixture "$src"
	"$py" - "$S3_BUCKET" "$1" "$src" <<'PY'
import boto3, os, sys
bucket, prefix, src = sys.argv[1:4]
s3 = boto3.client("s3")
for dp, _, files in os.walk(src):
    for f in files:
        p = os.path.join(dp, f)
        s3.upload_file(p, bucket, prefix + "/" + os.path.relpath(p, src))
PY
}
s3keys() { # PREFIX: every key under it, sorted
	"$py" - "$S3_BUCKET" "$1" <<'PY'
import boto3, sys
s3 = boto3.client("s3")
pg = s3.get_paginator("list_objects_v2")
keys = [o["Key"] for p in pg.paginate(Bucket=sys.argv[1], Prefix=sys.argv[2] + "/")
        for o in p.get("Contents", [])]
print("\n".join(sorted(keys)))
PY
}
k=1
while :; do
	[ $k -le 20 ] || fail "S3 removal did not end within 20 steps"
	pre=c$k
	s3fix $pre
	set +e
	out=$("$rmc" remove "s3://$S3_BUCKET/$pre" victim $k 2>&1)
	rc=$?
	set -e
	[ $rc = 0 ] || [ $rc = 86 ] || fail "S3 step $k: rm_crash exit $rc: $out"
	keys=$(s3keys $pre)
	if echo "$keys" | grep -q "^$pre/victim/"; then
		# Whole (crash before the tombstone), or not committed.
		if "$ctl" show "s3://$S3_BUCKET/$pre/victim" >/dev/null 2>&1; then
			[ "$(echo "$keys" | grep -c "^$pre/victim/")" = 5 ] ||
				fail "S3 step $k: victim shows as committed but is torn: $keys"
		fi
	fi
	# A reader now either opens a whole checkpoint or fails cleanly.
	set +e
	hold_out=$("$rmc" hold "s3://$S3_BUCKET/$pre/victim" </dev/null 2>&1)
	hold_rc=$?
	set -e
	if [ $hold_rc = 0 ]; then
		[ "$(s3keys $pre | grep -c "^$pre/victim/")" -ge 5 ] ||
			fail "S3 step $k: a reader opened a torn victim: $(s3keys $pre)"
	else
		grep -q "being removed\|not a committed checkpoint" <<<"$hold_out" ||
			fail "S3 step $k: the reader failed unclearly: $hold_out"
	fi
	if [ $k = 2 ]; then
		# (crashed after the tombstone: listed as a removal under way)
		"$ctl" list "s3://$S3_BUCKET/$pre" --json >"$tmp/s3list.json" || fail "S3 list"
		grep -q '"path":"victim","state":"removing"' "$tmp/s3list.json" ||
			fail "S3 step 2: victim not listed as removing: $(cat "$tmp/s3list.json")"
	fi
	"$ctl" prune "s3://$S3_BUCKET/$pre" --keep-last 5 >"$tmp/prune.out" 2>&1 ||
		fail "S3 step $k: prune after the crash: $(cat "$tmp/prune.out")"
	after=$(s3keys $pre)
	out=
	if echo "$after" | grep -q "^$pre/victim/"; then
		out=$("$rmc" remove "s3://$S3_BUCKET/$pre" victim 0 2>&1) ||
			fail "S3 step $k: removal after the crash: $out"
	fi
	keys=$(s3keys $pre)
	[ "$(echo "$keys" | grep -c "^$pre/[ab]/")" = 10 ] || fail "S3 step $k: a or b lost keys: $keys"
	echo "$keys" | grep -q "^$pre/victim/" &&
		fail "S3 step $k: victim keys left: $(echo $keys); before the removal: $(echo $after);" \
			"the removal said: $out; the prune said: $(cat "$tmp/prune.out")"
	[ $rc = 0 ] && break
	k=$((k + 1))
done
[ $k -ge 3 ] || fail "S3 removal took only $k steps"
echo "s3: a crash before each of the $((k - 1)) steps of a removal left nothing torn"

# A checkpoint committed again under its name after the plan (its manifest's
# ETag changed) is kept; the one planned (same ETag) goes.
s3fix reuse
etag=$("$py" - "$S3_BUCKET" <<'PY'
import boto3, sys
s3 = boto3.client("s3")
b = sys.argv[1]
old = s3.head_object(Bucket=b, Key="reuse/victim/manifest.json")["ETag"]
body = s3.get_object(Bucket=b, Key="reuse/victim/manifest.json")["Body"].read()
s3.put_object(Bucket=b, Key="reuse/victim/manifest.json", Body=body + b" ")
print(old)
PY
)
set +e
out=$("$rmc" remove "s3://$S3_BUCKET/reuse" victim 0 "$etag" 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "not the checkpoint planned" <<<"$out" || fail "S3 name reuse: exit $rc: $out"
[ "$(s3keys reuse | grep -c '^reuse/victim/')" = 5 ] || fail "S3 name reuse: victim lost keys"
etag=$("$py" -c 'import boto3, sys; print(boto3.client("s3").head_object(Bucket=sys.argv[1], Key="reuse/victim/manifest.json")["ETag"])' "$S3_BUCKET")
"$rmc" remove "s3://$S3_BUCKET/reuse" victim 0 "$etag" >/dev/null || fail "S3 removal with the current ETag"
[ "$(s3keys reuse | grep -c '^reuse/victim/')" = 0 ] || fail "S3 removal with the current ETag left keys"
echo "s3: a checkpoint re-committed after the plan (another ETag) is kept"

# ---- S3: a reader's lease keeps a checkpoint ----
leases() { # PREFIX NAME: how many lease objects the checkpoint has
	s3keys "$1" | grep -c "^$1/$2/\.ckpt-lease-" || true
}
s3fix slease
coproc HOLD { exec "$rmc" hold "s3://$S3_BUCKET/slease/a"; }
holder=$HOLD_PID
read -r -t 20 line <&"${HOLD[0]}" || fail "the S3 reader did not open a"
[ "$line" = held ] || fail "S3 hold said: $line"
[ "$(leases slease a)" = 1 ] || fail "the S3 reader put no lease: $(s3keys slease)"
man_before=$("$py" -c 'import boto3, sys; print(boto3.client("s3").get_object(Bucket=sys.argv[1], Key="slease/a/manifest.json")["Body"].read().decode())' "$S3_BUCKET")
set +e
out=$("$rmc" remove "s3://$S3_BUCKET/slease" a 0 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "in use (a reader holds a lease" <<<"$out" ||
	fail "S3 removal under a lease: exit $rc: $out"
man_after=$("$py" -c 'import boto3, sys; print(boto3.client("s3").get_object(Bucket=sys.argv[1], Key="slease/a/manifest.json")["Body"].read().decode())' "$S3_BUCKET")
[ "$man_before" = "$man_after" ] || fail "S3 lease: a's manifest not put back: $man_after"
[ "$(s3keys slease | grep -c '^slease/a/')" = 6 ] || fail "S3 lease: a lost keys: $(s3keys slease)"
"$ctl" prune "s3://$S3_BUCKET/slease" --keep-last 1 --json >"$tmp/slease.json" ||
	fail "S3 prune with a lease held: $(cat "$tmp/slease.json")"
grep -q '"name":"a".*"action":"in_use"' "$tmp/slease.json" ||
	fail "S3: a not kept in use: $(cat "$tmp/slease.json")"
grep -q '"name":"b".*"action":"removed"' "$tmp/slease.json" ||
	fail "S3: b not removed: $(cat "$tmp/slease.json")"
"$ctl" show "s3://$S3_BUCKET/slease/a" >/dev/null || fail "S3: a not committed after the kept removal"
exec {HOLD[1]}>&-
wait "$holder" || fail "the S3 reader failed"
holder=
[ "$(leases slease a)" = 0 ] || fail "the S3 reader left its lease: $(s3keys slease)"
"$ctl" prune "s3://$S3_BUCKET/slease" --keep-last 1 >/dev/null || fail "S3 prune after the lease ended"
[ "$(s3keys slease | grep -c '^slease/a/')" = 0 ] || fail "S3: a still there after its lease ended"
echo "s3: a reader's lease kept its checkpoint (manifest put back); removed once it ended"

# A reader that comes after the tombstone fails cleanly and lets go of its
# lease; a reader that had the manifest before a crashed removal keeps the
# data until it ends.
s3fix stomb
set +e
out=$("$rmc" remove "s3://$S3_BUCKET/stomb" victim 2 2>&1)
rc=$?
set -e
[ $rc = 86 ] && grep -q "crash before leases" <<<"$out" || fail "S3 crash after the tombstone: $rc: $out"
set +e
out=$(timeout 30 "$rmc" hold "s3://$S3_BUCKET/stomb/victim" </dev/null 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "being removed" <<<"$out" || fail "S3 reader after a tombstone: exit $rc: $out"
[ "$(leases stomb victim)" = 0 ] || fail "a failed S3 reader left its lease: $(s3keys stomb)"
s3fix stomb2
coproc HOLD { exec "$rmc" hold "s3://$S3_BUCKET/stomb2/victim"; }
holder=$HOLD_PID
read -r -t 20 line <&"${HOLD[0]}" || fail "the S3 reader did not open stomb2/victim"
set +e
out=$("$rmc" remove "s3://$S3_BUCKET/stomb2" victim 2 2>&1)
rc=$?
set -e
[ $rc = 86 ] || fail "S3 crash after the tombstone (held): $rc: $out"
"$ctl" prune "s3://$S3_BUCKET/stomb2" --keep-last 5 >"$tmp/stomb2.out" 2>&1 ||
	fail "S3 prune over a leased tombstone: $(cat "$tmp/stomb2.out")"
grep -q "whose removal was cut short, is kept: in use" "$tmp/stomb2.out" ||
	fail "S3 leased tombstone not reported: $(cat "$tmp/stomb2.out")"
[ "$(s3keys stomb2 | grep -c '^stomb2/victim/')" = 6 ] ||
	fail "S3: data of a leased, tombstoned checkpoint went: $(s3keys stomb2)"
# (the manifest the tombstone carried is back: committed again)
"$ctl" show "s3://$S3_BUCKET/stomb2/victim" >/dev/null ||
	fail "S3: a leased, tombstoned checkpoint was not put back"
exec {HOLD[1]}>&-
wait "$holder" || fail "the S3 reader of stomb2/victim failed"
holder=
"$rmc" remove "s3://$S3_BUCKET/stomb2" victim 0 >/dev/null 2>&1 || fail "S3 removal after the lease"
[ "$(s3keys stomb2 | grep -c '^stomb2/victim/')" = 0 ] || fail "S3: stomb2/victim not removed: $(s3keys stomb2)"
echo "s3: a reader after the tombstone failed cleanly; a lease from before a crash kept the checkpoint"

# A crashed removal of a checkpoint pinned meanwhile: the prune that finds
# its tombstone looks at the pins again and puts the manifest back.
s3fix spinc
"$ctl" pin "s3://$S3_BUCKET/spinc" victim >/dev/null || fail "S3 pin (crash case)"
set +e
"$rmc" remove "s3://$S3_BUCKET/spinc" victim 2 >/dev/null 2>&1
set -e
"$ctl" prune "s3://$S3_BUCKET/spinc" --keep-last 10 >"$tmp/spinc.out" 2>&1 ||
	fail "S3 prune over a pinned tombstone: $(cat "$tmp/spinc.out")"
grep -q "is kept: pinned since the plan was made" "$tmp/spinc.out" ||
	fail "S3 pinned tombstone: $(cat "$tmp/spinc.out")"
"$ctl" show "s3://$S3_BUCKET/spinc/victim" >/dev/null || fail "S3: the pinned checkpoint was not put back"
[ "$(s3keys spinc | grep -c '^spinc/victim/')" = 5 ] || fail "S3: the pinned checkpoint lost keys"
# A tombstone scanned, then replaced by a manifest (put back, or committed
# again): finishing it with the scanned ETag leaves the checkpoint alone.
s3fix sre
set +e
"$rmc" remove "s3://$S3_BUCKET/sre" victim 2 >/dev/null 2>&1
set -e
tetag=$("$py" -c 'import boto3, sys; print(boto3.client("s3").head_object(Bucket=sys.argv[1], Key="sre/victim/manifest.json")["ETag"])' "$S3_BUCKET")
s3fix sre
set +e
out=$("$rmc" remove "s3://$S3_BUCKET/sre" victim 0 "$tetag" 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "not the checkpoint planned" <<<"$out" || fail "S3 finishing a replaced tombstone: $rc: $out"
[ "$(s3keys sre | grep -c '^sre/victim/')" = 5 ] || fail "S3: a re-committed checkpoint lost keys"
echo "s3: a crashed removal of a pinned checkpoint is undone; a re-committed one is left alone"

# Leases that hold nothing: ended long ago, too long, from the future,
# bounds that would overflow, not ours.  The removal goes on and takes them too.
s3fix sstale
"$py" - "$S3_BUCKET" <<'PY'
import boto3, json, sys, time
s3 = boto3.client("s3")
now = int(time.time())
bodies = {"old": {"taken": now - 5000, "expires": now - 4100},
          "long": {"taken": now - 10, "expires": now + 86400},
          "future": {"taken": now + 7200, "expires": now + 8000},
          "wrap": {"taken": -9223372036854775808, "expires": 9223372036854775807},
          "junk": None}
for name, b in bodies.items():
    body = b"not json" if b is None else json.dumps({"ckpt_lease": b}).encode()
    s3.put_object(Bucket=sys.argv[1], Key="sstale/victim/.ckpt-lease-" + name, Body=body)
PY
out=$("$rmc" remove "s3://$S3_BUCKET/sstale" victim 0 2>&1) || fail "S3 removal past dead leases: $out"
[ "$(s3keys sstale | grep -c '^sstale/victim/')" = 0 ] || fail "S3: dead leases left: $(s3keys sstale)"
echo "s3: leases that hold nothing (ended, too long, future, not ours) did not keep a checkpoint"

# Renewal rewrites the lease: one made to look ended (as a reader idle
# for long would leave) is live again after a renewal; the drop deletes it.
s3fix srenew
coproc HOLD { exec "$rmc" lease "s3://$S3_BUCKET/srenew/victim"; }
holder=$HOLD_PID
read -r -t 20 line <&"${HOLD[0]}" || fail "rm_crash lease did not start"
lkey=${line#leased }
[ "$lkey" != "$line" ] && [ "$(leases srenew victim)" = 1 ] || fail "S3 lease not taken: $line"
"$py" - "$S3_BUCKET" "$lkey" <<'PY'
import boto3, json, sys, time
s3 = boto3.client("s3")
now = int(time.time())
s3.put_object(Bucket=sys.argv[1], Key=sys.argv[2],
              Body=json.dumps({"ckpt_lease": {"taken": now - 4000, "expires": now - 3100}}).encode())
PY
echo renew >&"${HOLD[1]}"
read -r -t 20 line <&"${HOLD[0]}" && [ "$line" = renewed ] || fail "S3 lease renewal: $line"
"$py" - "$S3_BUCKET" "$lkey" <<'PY' || fail "the renewed S3 lease does not hold"
import boto3, json, sys, time
body = json.loads(boto3.client("s3").get_object(Bucket=sys.argv[1], Key=sys.argv[2])["Body"].read())
l = body["ckpt_lease"]
assert l["expires"] > time.time() + 60 and l["expires"] - l["taken"] <= 3600, l
PY
set +e
out=$("$rmc" remove "s3://$S3_BUCKET/srenew" victim 0 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "in use" <<<"$out" || fail "S3 removal under a renewed lease: $rc: $out"
exec {HOLD[1]}>&-
wait "$holder" || fail "rm_crash lease failed"
holder=
[ "$(leases srenew victim)" = 0 ] || fail "the dropped S3 lease is still there"
echo "s3: a renewal rewrites an ended lease as live; the drop deletes it"

# Two removals at once, and a reader between them: the later tombstone
# takes the earlier one over, so only the later decides.  The earlier,
# seeing the reader's lease, cannot put the manifest back (the later's
# tombstone is there); the later, if it sees the lease, puts it back from
# the copy its tombstone carries, else deletes.  Whichever happens, a
# reader that opened has a whole checkpoint, or it failed cleanly.
said() { # FILE TEXT: waits (bounded) until FILE holds TEXT
	local i
	for i in $(seq 1 300); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	fail "waited in vain for '$2' in $1: $(cat "$1" 2>/dev/null)"
}
s3fix stwo
mkfifo "$tmp/a.in" "$tmp/b.in"
RM_CRASH_PAUSE=leases "$rmc" remove "s3://$S3_BUCKET/stwo" victim 0 <"$tmp/a.in" >"$tmp/a.out" 2>&1 &
apid=$!
bg="$bg $apid"
exec {afd}>"$tmp/a.in"
said "$tmp/a.out" "paused leases"
RM_CRASH_PAUSE=leases "$rmc" remove "s3://$S3_BUCKET/stwo" victim 0 <"$tmp/b.in" >"$tmp/b.out" 2>&1 &
bpid=$!
bg="$bg $bpid"
exec {bfd}>"$tmp/b.in"
said "$tmp/b.out" "paused leases"
"$rmc" hold "s3://$S3_BUCKET/stwo/victim" </dev/null >"$tmp/r.out" 2>&1 &
rpid=$!
bg="$bg $rpid"
for i in $(seq 1 100); do
	[ "$(leases stwo victim)" = 1 ] && break
	sleep 0.1
done
[ "$(leases stwo victim)" = 1 ] || fail "the reader between two removals put no lease"
echo go >&$afd
set +e
wait $apid
arc=$?
set -e
[ $arc = 1 ] && grep -q "another removal took it over" "$tmp/a.out" ||
	fail "the first of two removals: exit $arc: $(cat "$tmp/a.out")"
echo go >&$bfd
set +e
wait $bpid
brc=$?
wait $rpid
rrc=$?
set -e
exec {afd}>&- {bfd}>&-
bg=
n=$(s3keys stwo | grep '^stwo/victim/' | grep -vc '\.ckpt-lease-' || true)
if [ $brc = 1 ]; then
	# (the later saw the lease: kept, manifest back from the copy)
	grep -q "in use (a reader holds a lease" "$tmp/b.out" || fail "the later removal: $(cat "$tmp/b.out")"
	[ "$n" = 5 ] && "$ctl" show "s3://$S3_BUCKET/stwo/victim" >/dev/null ||
		fail "kept by the later removal but not whole: $(s3keys stwo)"
else
	[ $brc = 0 ] || fail "the later removal: exit $brc: $(cat "$tmp/b.out")"
	[ "$n" = 0 ] || fail "two removals left: $(s3keys stwo)"
	[ $rrc = 1 ] && grep -q "being removed\|not a committed checkpoint" "$tmp/r.out" ||
		fail "the reader of a removed checkpoint: exit $rrc: $(cat "$tmp/r.out")"
fi
[ $rrc = 0 ] || [ $rrc = 1 ] || fail "the reader between two removals: exit $rrc: $(cat "$tmp/r.out")"
echo "s3: of two removals at once the later decided; the reader between them got a whole checkpoint or none"

# The other order: a removal that has decided (its tombstone says
# "deleting") is finished by a prune beside it, never undone: a reader
# that comes meanwhile fails at once, and nothing is put back.
s3fix stwo2
RM_CRASH_PAUSE=delete-batch "$rmc" remove "s3://$S3_BUCKET/stwo2" victim 0 <"$tmp/a.in" >"$tmp/a2.out" 2>&1 &
apid=$!
bg="$bg $apid"
exec {afd}>"$tmp/a.in"
said "$tmp/a2.out" "paused delete-batch"
set +e
out=$("$rmc" hold "s3://$S3_BUCKET/stwo2/victim" </dev/null 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "being removed" <<<"$out" || fail "a reader of a deciding removal: $rc: $out"
"$ctl" prune "s3://$S3_BUCKET/stwo2" --keep-last 5 >"$tmp/stwo2.out" 2>&1 ||
	fail "S3 prune beside a deciding removal: $(cat "$tmp/stwo2.out")"
[ "$(s3keys stwo2 | grep -c '^stwo2/victim/')" = 0 ] ||
	fail "S3: the prune beside a decided removal left: $(s3keys stwo2)"
echo go >&$afd
wait $apid || fail "the decided removal: $(cat "$tmp/a2.out")"
exec {afd}>&-
bg=
[ "$(s3keys stwo2 | grep -c '^stwo2/victim/')" = 0 ] || fail "S3: stwo2 left: $(s3keys stwo2)"
echo "s3: a decided removal is finished by a prune beside it, never undone; its reader failed at once"

# ---- S3: pins ----
s3fix spin
"$ctl" pin "s3://$S3_BUCKET/spin" a >"$tmp/pin.out" 2>&1 && grep -q "^pinned a$" "$tmp/pin.out" ||
	fail "S3 pin: $(cat "$tmp/pin.out")"
"$ctl" pin "s3://$S3_BUCKET/spin" a --json >"$tmp/pin.out" 2>&1 &&
	grep -q '"changed":false' "$tmp/pin.out" || fail "S3 pin again: $(cat "$tmp/pin.out")"
"$ctl" prune "s3://$S3_BUCKET/spin" --keep-last 1 --json >"$tmp/spin.json" ||
	fail "S3 prune with a pin: $(cat "$tmp/spin.json")"
grep -q '"name":"a".*"action":"keep","reasons":\["pinned"\]' "$tmp/spin.json" ||
	fail "S3: pinned a not kept: $(cat "$tmp/spin.json")"
set +e
out=$("$ctl" pin "s3://$S3_BUCKET/spin" b 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "not a committed checkpoint" <<<"$out" || fail "S3 pin of a removed one: $rc: $out"
"$ctl" unpin "s3://$S3_BUCKET/spin" a >/dev/null || fail "S3 unpin"
set +e
out=$("$ctl" unpin "s3://$S3_BUCKET/spin" a 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "is not in" <<<"$out" || fail "S3 unpin of what is not pinned: $rc: $out"
"$ctl" prune "s3://$S3_BUCKET/spin" --keep-last 1 >/dev/null || fail "S3 prune after unpin"
[ "$(s3keys spin | grep -c '^spin/a/')" = 0 ] || fail "S3: a kept after unpin"
# Pins at once all land (each written only over the list it read).
s3fix spin3
pids=
for n in a b victim; do
	"$ctl" pin "s3://$S3_BUCKET/spin3" $n >"$tmp/pin3.$n" 2>&1 &
	pids="$pids $!"
done
for p in $pids; do wait "$p" || fail "a concurrent S3 pin failed: $(cat "$tmp"/pin3.*)"; done
pins=$("$py" -c 'import boto3, sys; print(boto3.client("s3").get_object(Bucket=sys.argv[1], Key="spin3/.ckpt-pins")["Body"].read().decode())' "$S3_BUCKET" | grep -v '^#' | grep . | sort | tr '\n' ' ')
[ "$pins" = "a b victim " ] || fail "concurrent S3 pins lost some: '$pins'"
# A pin that lands after the plan, before the data go, keeps it.
s3fix spinrace
set +e
out=$(RM_CRASH_PIN=1 "$rmc" remove "s3://$S3_BUCKET/spinrace" victim 0 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "pinned since the plan was made: kept" <<<"$out" ||
	fail "S3 pin racing a removal: $rc: $out"
[ "$(s3keys spinrace | grep -c '^spinrace/victim/')" = 5 ] || fail "S3: late-pinned victim lost keys"
"$ctl" show "s3://$S3_BUCKET/spinrace/victim" >/dev/null || fail "S3: late-pinned victim not committed"
# A pin that comes after the tombstone is told so.
s3fix spintomb
set +e
"$rmc" remove "s3://$S3_BUCKET/spintomb" victim 2 >/dev/null 2>&1
out=$("$ctl" pin "s3://$S3_BUCKET/spintomb" victim 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "being removed" <<<"$out" || fail "S3 pin of a tombstoned one: $rc: $out"
echo "s3: pin/unpin; concurrent pins all land; a pin racing a removal keeps it; a late one is refused"

# A real prune of an S3 root: dry run first changes nothing.
s3fix real
"$ctl" prune "s3://$S3_BUCKET/real" --keep-last 1 --dry-run >/dev/null || fail "S3 dry run"
[ "$(s3keys real | wc -l)" = 15 ] || fail "S3 dry run removed something"
"$ctl" prune "s3://$S3_BUCKET/real" --keep-last 1 --json >"$tmp/s3real.json" ||
	fail "S3 prune: $(cat "$tmp/s3real.json")"
grep -q '"removed":2' "$tmp/s3real.json" || fail "S3 prune summary: $(cat "$tmp/s3real.json")"
[ "$(s3keys real | grep -c '^real/victim/')" = 5 ] && [ "$(s3keys real | wc -l)" = 5 ] ||
	fail "S3 prune left: $(s3keys real)"
echo "s3: prune --dry-run changed nothing; prune removed a and b whole"
