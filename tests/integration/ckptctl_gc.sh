#!/usr/bin/env bash
# ckptctl_gc.sh - `ckptctl gc ROOT`: a dead save's work area (nothing in it
# changed for longer than the grace period) and an unfinished removal are
# removed, also in per-job directories below ROOT; a young work area, a
# committed checkpoint, shard files without a manifest (reported as
# unknown) and anything behind a symbolic link are left; --dry-run changes
# nothing; another uid's work area is skipped (as root, with setpriv).
# On S3 a work area's age is its last activity (its newest object), and
# every unfinished multipart upload found is reported (table and JSON).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh

ctl=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}/ckptctl
[ -x "$ctl" ] || { echo "FAIL: $ctl is not built"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptctl-gc.XXXXXX")
py=${CKPT_TEST_PYTHON:-}
cleanup() {
	[ -n "$py" ] && [ -d "$tmp/moto" ] && moto_stop "$py" "$tmp/moto"
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	exit 1
}
root=$tmp/root
old=0123456789abcdef0123456789abcdef
new=fedcba9876543210fedcba9876543210
mkdir -p "$root/job/.ckpt-work-$old/sub" "$root/.ckpt-work-$new" "$root/ckpt" \
	"$root/incomplete" "$root/.ckpt-trash-1234" "$tmp/outside/.ckpt-work-$old"
echo x >"$root/job/.ckpt-work-$old/rank-00000.safetensors"
echo x >"$root/job/.ckpt-work-$old/sub/f"
echo x >"$root/.ckpt-work-$new/attempt.json"
echo '{}' >"$root/ckpt/manifest.json"
echo x >"$root/incomplete/rank-00000.safetensors"
echo x >"$root/.ckpt-trash-1234/shard.bin"
# ...marked by the removal that made it (store/remove.h); one not marked
# (someone renamed a directory to look like trash) is reported and kept.
printf 'trash=.ckpt-trash-1234\nuid=%s\n' "$(id -u)" >"$root/.ckpt-trash-1234/.ckpt-removing"
mkdir "$root/.ckpt-trash-planted"
echo keep >"$root/.ckpt-trash-planted/data"
echo x >"$tmp/outside/.ckpt-work-$old/f"
ln -s "$tmp/outside" "$root/link"
# Two days old: everything in the dead work area and outside.
find "$root/job/.ckpt-work-$old" "$tmp/outside" -exec touch -h -d '2 days ago' {} +

before=$(cd "$root" && find . | sort)
out=$("$ctl" gc "$root" --dry-run) || fail "dry run: exit $?"
[ "$(cd "$root" && find . | sort)" = "$before" ] || fail "the dry run changed something"
grep -Eq "^REMOVE +job/.ckpt-work-$old" <<<"$out" || fail "dry run: $out"
grep -Eq "^KEEP +.ckpt-work-$new" <<<"$out" || fail "dry run, young: $out"
grep -Eq "^UNKNOWN +incomplete" <<<"$out" || fail "dry run, unknown: $out"

"$ctl" gc "$root" --json >"$tmp/gc.json" || fail "gc: exit $?"
grep -q '"removed":1' "$tmp/gc.json" || fail "gc summary: $(cat "$tmp/gc.json")"
[ ! -e "$root/job/.ckpt-work-$old" ] || fail "the dead work area is still there"
[ -z "$(ls -A "$root/job")" ] || fail "job/ holds: $(ls -A "$root/job")"
[ ! -e "$root/.ckpt-trash-1234" ] || fail "the unfinished removal is still there"
[ -f "$root/.ckpt-trash-planted/data" ] || fail "unmarked trash was removed"
[ -f "$root/.ckpt-work-$new/attempt.json" ] || fail "the young work area was touched"
[ -f "$root/ckpt/manifest.json" ] && [ -f "$root/incomplete/rank-00000.safetensors" ] ||
	fail "a checkpoint or an unknown directory was touched"
[ -f "$tmp/outside/.ckpt-work-$old/f" ] || fail "gc went through a symbolic link"
# A grace period of 0 takes the young one too; bad values are usage errors.
"$ctl" gc "$root" --grace 0s >/dev/null || fail "gc --grace 0s"
[ ! -e "$root/.ckpt-work-$new" ] || fail "--grace 0s left the work area"
for bad in "--grace" "--grace -1h" "--grace 5x" "--grace 99999999999999w"; do
	rc=0
	# shellcheck disable=SC2086
	"$ctl" gc "$root" $bad >/dev/null 2>&1 || rc=$?
	[ "$rc" = 2 ] || fail "gc $bad: exit $rc, want 2"
done

if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	mkdir -p "$root/.ckpt-work-$old"
	touch -d '2 days ago' "$root/.ckpt-work-$old"
	chown 4242 "$root/.ckpt-work-$old"
	chmod 777 "$root"
	chmod 755 "$tmp"
	out=$(setpriv --reuid=4343 --regid=4343 --clear-groups "$ctl" gc "$root") ||
		fail "another uid's gc: exit $?"
	grep -Eq "^SKIP +.ckpt-work-$old .*uid 4242" <<<"$out" || fail "foreign: $out"
	[ -d "$root/.ckpt-work-$old" ] || fail "another uid's gc removed it"
else
	echo "SKIP: [other-uid] needs root and setpriv"
fi
# ---- S3 (moto): a dead attempt's work area, tagged shards and unfinished
# upload go; a young one (with its upload, reported), a committed
# checkpoint and stray keys stay.  A work area's age is its newest object's
# (S3's LastModified, by S3's clock): the dead one is written first, and
# the young one once gc sees the dead one past a grace of 4 s ----
if [ -n "$py" ] && "$py" -c 'import moto, boto3' 2>/dev/null; then
	moto_start "$py" "$tmp/moto" || fail "moto did not start"
	"$py" - "$S3_BUCKET" "$old" <<'PY' || fail "S3 fixture"
import boto3, json, sys, time
b, old = sys.argv[1:3]
s3 = boto3.client("s3")
def put(k, body):
    s3.put_object(Bucket=b, Key=k, Body=body)
put("g/job/.ckpt-work-%s/attempt.json" % old,
    json.dumps({"format": "ckpt-attempt-1", "id": old, "name": "dead", "created": 0}))
put("g/job/.ckpt-work-%s/rank-00000.index.json" % old, "{}")
put("g/job/dead/rank-00000.%s.safetensors" % old[:16], "x")
put("g/job/dead/unrelated.bin", "keep")
s3.create_multipart_upload(Bucket=b, Key="g/job/dead/rank-00001.%s.safetensors" % old[:16])
put("g/ok/manifest.json", "{}")
put("g/ok/rank-00000.safetensors", "x")
# An upload of a shard whose work area is gone (a crash after it went), and
# one that is not ckptd's (reported, never aborted).
s3.create_multipart_upload(Bucket=b, Key="g/job/orphan/rank-00002.aaaaaaaaaaaaaaaa.safetensors")
s3.create_multipart_upload(Bucket=b, Key="g/job/someone-elses.bin")
# Readers' leases: under a prefix with no checkpoint, one that ended two
# days ago goes, a live one and one not ours stay; one under a
# checkpoint is prune's business.
now = int(time.time())
def lease(k, taken, expires):
    put(k, json.dumps({"ckpt_lease": {"taken": taken, "expires": expires}}))
lease("g/ghost/.ckpt-lease-dead", now - 2 * 86400 - 900, now - 2 * 86400)
lease("g/ghost/.ckpt-lease-live", now, now + 900)
put("g/ghost/.ckpt-lease-junk", "junk")
lease("g/ok/.ckpt-lease-x", now - 2 * 86400 - 900, now - 2 * 86400)
PY
	# Until the dead area is past the grace (S3's clock moves on).  The
	# grace is long enough that the young area below stays within it
	# through two gc runs on a busy machine.
	for _ in $(seq 600); do
		"$ctl" gc "s3://$S3_BUCKET/g" --grace 15s --dry-run >"$tmp/s3dry.out" 2>&1 || true
		grep -Eq "^REMOVE +job/.ckpt-work-$old" "$tmp/s3dry.out" && break
		sleep 0.25
	done
	# A live save: its work area (a minute ago, as attempt.json says, but
	# written just now) and its unfinished upload.
	"$py" - "$S3_BUCKET" "$new" <<'PY' || fail "S3 fixture (young)"
import boto3, json, sys, time
b, new = sys.argv[1:3]
s3 = boto3.client("s3")
s3.put_object(Bucket=b, Key="g/.ckpt-work-%s/attempt.json" % new,
              Body=json.dumps({"format": "ckpt-attempt-1", "id": new, "name": "young",
                               "created": int(time.time()) - 60}))
s3.create_multipart_upload(Bucket=b, Key="g/young/rank-00000.%s.safetensors" % new[:16])
PY
	"$ctl" gc "s3://$S3_BUCKET/g" --grace 15s --dry-run >"$tmp/s3dry.out" || fail "S3 dry run: $(cat "$tmp/s3dry.out")"
	grep -Eq "^REMOVE +job/.ckpt-work-$old" "$tmp/s3dry.out" || fail "S3 dry run: $(cat "$tmp/s3dry.out")"
	grep -Eq "^KEEP +.ckpt-work-$new .*last active" "$tmp/s3dry.out" ||
		fail "S3 dry run, young: $(cat "$tmp/s3dry.out")"
	# Every open upload is listed: the live save's is kept.
	grep -Eq "^KEEP +young/rank-00000.${new:0:16}.safetensors .*work area is there" "$tmp/s3dry.out" ||
		fail "S3 dry run, the live save's upload: $(cat "$tmp/s3dry.out")"
	grep -Eq "unfinished multipart uploads found" "$tmp/s3dry.out" ||
		fail "S3 dry run, no count of open uploads: $(cat "$tmp/s3dry.out")"
	# (moto gives every upload the start time 2010-11-10T20:48:33Z: all
	# are past the grace period here)
	grep -Eq "^REMOVE +job/orphan/rank-00002" "$tmp/s3dry.out" || fail "S3 dry run, orphan: $(cat "$tmp/s3dry.out")"
	grep -Eq "^UNKNOWN +job/someone-elses.bin" "$tmp/s3dry.out" || fail "S3 dry run, foreign upload: $(cat "$tmp/s3dry.out")"
	grep -Eq "^REMOVE +ghost/.ckpt-lease-dead" "$tmp/s3dry.out" &&
		grep -Eq "^KEEP +ghost/.ckpt-lease-live" "$tmp/s3dry.out" &&
		grep -Eq "^UNKNOWN +ghost/.ckpt-lease-junk" "$tmp/s3dry.out" ||
		fail "S3 dry run, leases: $(cat "$tmp/s3dry.out")"
	"$ctl" gc "s3://$S3_BUCKET/g" --grace 15s --json >"$tmp/s3gc.json" || fail "S3 gc: $(cat "$tmp/s3gc.json")"
	# Removed: the dead area, the orphan upload, the dead lease.  Kept:
	# the young area, its upload, the live lease.  Open uploads listed
	# after the dead area went: the orphan, the foreign one, the young one.
	grep -q '"removed":3' "$tmp/s3gc.json" && grep -q '"kept_young":3' "$tmp/s3gc.json" &&
		grep -q '"open_uploads":3' "$tmp/s3gc.json" ||
		fail "S3 gc summary: $(cat "$tmp/s3gc.json")"
	grep -q '"path":"job/orphan/rank-00002.aaaaaaaaaaaaaaaa.safetensors","action":"REMOVED"' \
		"$tmp/s3gc.json" || fail "S3 gc: the orphan upload: $(cat "$tmp/s3gc.json")"
	grep -q "\"path\":\"young/rank-00000.${new:0:16}.safetensors\",\"action\":\"KEEP\"" \
		"$tmp/s3gc.json" || fail "S3 gc: the live save's upload: $(cat "$tmp/s3gc.json")"
	"$py" - "$S3_BUCKET" <<'PY' || fail "S3 gc left the wrong keys"
import boto3, sys
b = sys.argv[1]
s3 = boto3.client("s3")
keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=b, Prefix="g/").get("Contents", []))
want = ["g/.ckpt-work-fedcba9876543210fedcba9876543210/attempt.json",
        "g/ghost/.ckpt-lease-junk", "g/ghost/.ckpt-lease-live",
        "g/job/dead/unrelated.bin", "g/ok/.ckpt-lease-x", "g/ok/manifest.json",
        "g/ok/rank-00000.safetensors"]
assert keys == want, keys
ups = sorted(u["Key"] for u in s3.list_multipart_uploads(Bucket=b, Prefix="g/").get("Uploads", []))
assert ups == ["g/job/someone-elses.bin", "g/young/rank-00000.fedcba9876543210.safetensors"], ups
PY
	echo "ok: S3 gc removed the dead attempt (work area, tagged shard, upload), a dead reader's lease, and nothing else; it listed every open upload"
else
	echo "SKIP: [s3] needs the test Python with moto and boto3"
fi
echo "ckptctl gc: all checks passed"
