#!/usr/bin/env bash
# s3_faults.sh - the S3 fault campaign: two ckptds save through
# tests/tools/s3_proxy.py, which injects faults on the way to moto
# (signatures checked), and check_s3_faults asserts that every save either
# commits with every byte right or fails cleanly (see its header).  Then
# the bucket is listed with boto3: one manifest per commit verified, no
# work area, no open multipart upload, nothing outside a committed
# checkpoint.  The spill tier's cases run here too (they need the proxy to
# hold parts), those of damaged answers (the proxy changes a byte of
# what a GET returns, the stored object intact), and the leftover and gc
# cases (a slow save that gc must keep, a shard deleted before the commit, a
# lost Create answer, a crash before the manifest, a cleanup during an
# outage) under s3gc/, outside the audited prefix: see check_s3_faults.c.
#
# CKPT_TEST_FAULTS (default 200) is how many faults the campaign injects;
# `make test-s3-faults` runs the longer one (1000).
# Needs the test Python (moto, boto3, crc32c).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
py=${CKPT_TEST_PYTHON:-}
if [ -z "$py" ] || ! "$py" -c 'import moto, boto3, crc32c' 2>/dev/null; then
	echo "needs the test Python with moto, boto3 and crc32c (scripts/pyenv.sh test)"
	exit 77
fi
for b in ckptd tests/check_s3_faults; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done
faults=${CKPT_TEST_FAULTS:-200}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-s3f.XXXXXX")
proxy_pid=
cleanup() {
	if [ -n "$proxy_pid" ]; then
		kill "$proxy_pid" 2>/dev/null || true
		wait "$proxy_pid" 2>/dev/null || true
	fi
	moto_stop "$py" "$tmp/moto"
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	[ -f "$tmp/proxy.err" ] && { echo "--- proxy"; tail -n 20 "$tmp/proxy.err"; }
	exit 1
}

# The test's own reader goes to moto directly (AWS_ENDPOINT_URL_S3): what
# is stored is checked, not what the proxy says.
moto_start "$py" "$tmp/moto" ||
	fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"

"$py" tests/tools/s3_proxy.py --listen-port-file "$tmp/proxy.port" --upstream "$S3_ENDPOINT" \
	--seed "${CKPT_TEST_FAULT_SEED:-9}" 2>"$tmp/proxy.err" &
proxy_pid=$!
for _ in $(seq 200); do
	[ -s "$tmp/proxy.port" ] && break
	kill -0 "$proxy_pid" 2>/dev/null || fail "the proxy exited"
	sleep 0.05
done
[ -s "$tmp/proxy.port" ] || fail "the proxy did not listen"
export CKPT_TEST_S3_PROXY="http://127.0.0.1:$(cat "$tmp/proxy.port")"
export CKPT_TEST_S3_ROOT="s3://$S3_BUCKET/faults"
export CKPT_TEST_FAULTS=$faults

out=$("$build/tests/check_s3_faults" 2>&1) || { echo "$out"; fail "check_s3_faults"; }
echo "$out" | grep -q "SKIP: \[s3_faults\]" && { echo "$out"; fail "check_s3_faults skipped"; }
# A part that needs root (another user's drop) may skip: said (as a note:
# the script's own checks all ran), not failed.
echo "$out" | sed -n 's/^SKIP: /note: check_s3_faults skipped a part: /p'
line=$(echo "$out" | grep "^campaign: faults=") || { echo "$out"; fail "no campaign summary"; }
echo "$line"
echo "$out" | grep "^budget:" || true
commits=$(echo "$line" | sed -n 's/.*commits_verified=\([0-9]*\).*/\1/p')

# What is left in the bucket under a prefix (but SKIP/ below it), listed by
# boto3.
audit() {
	"$py" - "$S3_BUCKET" "$1" "${2:-}" <<'PYEOF'
import os, sys
import boto3
bucket, base, skip = sys.argv[1], sys.argv[2] + "/", sys.argv[3]
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"],
                  region_name=os.environ.get("AWS_REGION", "us-east-1"))
keep = lambda k: not (skip and k.startswith(skip + "/"))
keys = []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
    keys += [o["Key"][len(base):] for o in page.get("Contents", [])]
keys = [k for k in keys if keep(k)]
uploads = [u for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=base).get("Uploads", [])
           if keep(u["Key"][len(base):])]
committed = {k.rsplit("/", 1)[0] for k in keys if k.endswith("/manifest.json")}
work = [k for k in keys if "/.ckpt-work-" in "/" + k]
stray = [k for k in keys if k.rsplit("/", 1)[0] not in committed and k not in work]
print(f"manifests={len([k for k in keys if k.endswith('/manifest.json')])} "
      f"work={len(work)} uploads={len(uploads)} stray={len(stray)}")
for k in (work + stray)[:10]:
    print("  left:", k, file=sys.stderr)
for u in uploads[:10]:
    print("  open upload:", u["Key"], file=sys.stderr)
PYEOF
}
got=$(audit faults) || fail "listing the bucket"
echo "bucket: $got"
# campaign's commits plus the budget case's one ("after"), the spill
# case's ("held"; spill_torn commits nothing and may leave nothing), and
# the damaged answers' three ("before" and "once" of answer_index, whose
# "always" commits nothing, and answer_manifest's "m")
want="manifests=$((commits + 2 + 3)) work=0 uploads=0 stray=0"
[ "$got" = "$want" ] || fail "the bucket holds $got, want $want"
# The durable cases' commits: out, rs, rs2, again, dead, two, and the
# review's delivered (resumed after both daemons died) and gone (its shard
# deleted before the commit: sent again).  A save
# dropped while S3 was down (durable_drop) leaves its work area: S3 could
# not be told.
got=$(audit durable drop) || fail "listing the bucket"
echo "bucket (durable): $got"
want="manifests=8 work=0 uploads=0 stray=0"
[ "$got" = "$want" ] || fail "the bucket holds $got under durable/, want $want"
echo "ok: $faults+ faults survived; every commit verified, every failure clean, nothing left"
