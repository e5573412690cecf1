#!/usr/bin/env bash
# s3.sh - checkpoints to a real S3 server on 127.0.0.1: moto with signature
# checking on (tests/tools/s3_fixture.py), so a signing bug fails here.
#   1. check_multi's S3 cases: 2 and 8 ranks on one daemon, 4 ranks on two
#      daemons that share only the bucket; read back with boto3 + our reader
#      + safetensors; no work area or open upload left.
#   1b. check_load's S3 cases: N ranks save, M load other shardings with
#      ranged GETs, for (N, M) = (2, 3), (4, 1), (1, 4), (8, 3); a small box
#      of a 16 MiB tensor downloads its CRC pieces only; latest picks the
#      greatest step past a shard without a manifest, a work area and an
#      unreadable manifest (boto3 puts them); a byte flipped, an object cut
#      short and one deleted by boto3 fail the load, naming the object.
#   2. the sample trainer (one rank) under a prefix with every printable
#      character a prefix may hold, then a 1 GiB checkpoint: every object
#      fetched with boto3 and with Debian's awscli and compared byte for
#      byte, every chunk's CRC32C checked against the manifest.
#   2b. ckptctl on the S3 root: list and show (text and --json) name the
#      committed checkpoints and no save in progress; a prefix with a work
#      area, an incomplete checkpoint and over a page (1000) of keys lists
#      as a directory would; no credentials, a missing bucket, a wrong
#      secret (403) and a missing checkpoint fail with clear messages; a
#      checkpoint that boto3 uploaded in our format (its own multipart
#      layout) reads back through s3:// with ckpt_reader, tensor for tensor
#      equal to the local copy; `ckptctl status` shows the daemon's S3
#      uploads (and a save's uploaded bytes when one is caught in flight).
#   3. a root outside the allowed ones, and a daemon with an S3 root but no
#      credentials, are refused with clear messages.
# Needs the test Python (moto, boto3); awscli is used when installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
py=${CKPT_TEST_PYTHON:-}
if [ -z "$py" ] || ! "$py" -c 'import moto, boto3' 2>/dev/null; then
	echo "needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	exit 77
fi
for b in ckptd ckptctl examples/trainer tests/check_multi tests/check_load tests/ckpt_compare; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-s3.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	moto_stop "$py" "$tmp/moto"
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

# The trainer's reader reads S3 with the AWS variables moto_start sets.
moto_start "$py" "$tmp/moto" ||
	fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
# Every printable character a prefix may hold, except what the config file
# syntax reserves (a '#' after a space starts a comment) and a space at an
# end (trimmed).
odd='odd/a b+c=d&e;f~g!h$i'"'"'j(k)l*m,n@o:p%41q[r]s{t}u^v|w`x"y<z>?\_.-'
export CKPT_TEST_S3_ROOT="s3://$S3_BUCKET/multi"

# ---- 1. multi-rank and multi-daemon saves ----
out=$(CK_RUN_CASE=s3 "$build/tests/check_multi" 2>&1) || { echo "$out"; fail "check_multi's S3 cases"; }
echo "$out" | grep -q "SKIP" && { echo "$out"; fail "check_multi's S3 cases skipped"; }
echo "$out" | grep -E "^[0-9]+%: Checks" || true

# ---- 1b. loads from S3 ----
# Under a prefix of their own, with characters a key must have encoded.
out=$(CK_RUN_CASE=s3 CKPT_TEST_S3_ROOT="s3://$S3_BUCKET/load/a b+c=d&e" \
	"$build/tests/check_load" 2>&1) || { echo "$out"; fail "check_load's S3 cases"; }
echo "$out" | grep -q "SKIP" && { echo "$out"; fail "check_load's S3 cases skipped"; }
# 4 reshard pairs, ranged, resident, latest, corrupt, spill: all of them ran, none failed.
echo "$out" | grep -Eq "^100%: Checks: 12, Failures: 0, Errors: 0$" ||
	{ echo "$out"; fail "check_load's S3 cases: not 12 checks passed"; }
echo "$out" | grep -E "^[0-9]+%: Checks"

# ---- 2. one rank, odd prefix, 1 GiB ----
root="s3://$S3_BUCKET/$odd"
sock=$tmp/ckptd.sock
mkdir -p "$tmp/state"
cat >"$tmp/ckptd.conf" <<CONF
socket = $sock
state_dir = $tmp/state
root = $root
s3_endpoint = $S3_ENDPOINT
arena_max = 1G
CONF
"$build/ckptd" -c "$tmp/ckptd.conf" -v >"$tmp/ckptd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
	[ -S "$sock" ] && break
	kill -0 "${pids[0]}" 2>/dev/null || fail "ckptd exited"
	sleep 0.05
done
[ -S "$sock" ] || fail "ckptd did not listen"

"$build/examples/trainer" --socket "$sock" --root "$root" --job s3 --steps 4 --mib 64 \
	--save-every 2 --compute-ms 50 >"$tmp/trainer.log" 2>&1 || fail "trainer (64 MiB)"
grep -q "step-000004 committed" "$tmp/trainer.log" || fail "step-000004 not committed"
"$build/examples/trainer" --socket "$sock" --root "$root/big" --job s3big --steps 1 \
	--mib 1024 --save-every 1 --compute-ms 10 >"$tmp/trainer-big.log" 2>&1 ||
	fail "trainer (1 GiB)"

check_ckpt() { # ROOT NAME: fetch with boto3 and awscli, compare, CRC-check
	local r=$1 name=$2 dir=$tmp/fetch-$2 sum
	sum=$("$py" tests/tools/s3_fetch.py "$r" "$name" "$dir") || fail "s3_fetch $name"
	case $sum in
	*work_areas=0\ uploads=0) ;;
	*) fail "$name: left behind in S3: $sum" ;;
	esac
	"$py" - "$dir/$name" <<'PYEOF' || fail "$name: CRC check"
import json, os, sys
import crc32c
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
blk = m["crc_block"]
data = {f["path"]: open(os.path.join(d, f["path"]), "rb").read() for f in m["files"]}
for f in m["files"]:
    assert len(data[f["path"]]) == f["size"], f
n = 0
for kind in ("tensors", "blobs"):
    for name, t in m.get(kind, {}).items():
        for c in t.get("chunks", [t] if "file" in t else []):
            buf = data[m["files"][c["file"]]["path"]]
            pos, i = c["begin"], 0
            while pos < c["end"]:
                nxt = min((pos // blk + 1) * blk, c["end"])
                assert crc32c.crc32c(buf[pos:nxt]) == c["crc32c"][i], (name, pos)
                pos, i = nxt, i + 1
            n += 1
print(f"{n} chunks verified")
PYEOF
	if [ -x /usr/bin/aws ]; then
		local bucket=${r#s3://}
		bucket=${bucket%%/*}
		mkdir -p "$tmp/aws-$name"
		# The key as the listing gives it: awscli takes its own URL
		# syntax for the prefix.
		/usr/bin/aws --endpoint-url "$S3_ENDPOINT" s3 cp --recursive --only-show-errors \
			"${r%/}/$name/" "$tmp/aws-$name/" >"$tmp/aws.log" 2>&1 ||
			fail "awscli could not fetch $name"
		diff -r "$dir/$name" "$tmp/aws-$name" >/dev/null || fail "awscli and boto3 disagree on $name"
		echo "ok: $name read by boto3 and awscli, identical"
	fi
}
check_ckpt "$root" step-000002
check_ckpt "$root" step-000004
check_ckpt "$root/big" step-000001
size=$(stat -c %s "$tmp"/fetch-step-000001/step-000001/rank-00000.*.safetensors)
[ "$size" -ge $((1024 * 1024 * 1024)) ] || fail "the big shard has $size bytes"

# ---- 2b. ckptctl on S3; a checkpoint boto3 wrote, read by us ----
ctl=$build/ckptctl
# expect_fail PATTERN -- CMD...: CMD exits 1 and says PATTERN (extended
# regex), and no secret is in what it says.
expect_fail() {
	local pat=$1 out rc=0
	shift 2
	out=$("$@" 2>&1) || rc=$?
	[ "$rc" = 1 ] || fail "'$*' exited $rc, want 1: $out"
	grep -Eq -- "$pat" <<<"$out" || fail "'$*': output lacks /$pat/: $out"
	if grep -qF -- "$AWS_SECRET_ACCESS_KEY" <<<"$out"; then
		fail "'$*' printed the secret key"
	fi
}

out=$("$ctl" list "$root" 2>&1) || fail "ckptctl list $root: $out"
for n in 2 4; do
	grep -Eq "^step-00000$n +$n +64\.0 MiB +[0-9T:-]+Z +1  committed$" <<<"$out" ||
		fail "ckptctl list lacks step-00000$n, committed: $out"
done
grep -Eq "^big/step-000001 +1 +1\.0 GiB .* committed$" <<<"$out" ||
	fail "ckptctl list lacks big/step-000001 (in the prefix 'big'): $out"
[ "$(grep -c committed <<<"$out")" = 3 ] || fail "ckptctl list: not 3 checkpoints: $out"
grep -Eq "in progress|incomplete|corrupt" <<<"$out" && fail "ckptctl list: more than the commits: $out"
"$ctl" list "$root" --json >"$tmp/list.json" || fail "ckptctl list --json"
"$py" - "$tmp/list.json" <<'PYEOF' || fail "ckptctl list --json: $(cat "$tmp/list.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
got = {r["path"]: r for r in rows}
assert sorted(got) == ["big/step-000001", "step-000002", "step-000004"], sorted(got)
for path, step in (("step-000002", 2), ("step-000004", 4), ("big/step-000001", 1)):
    r = got[path]
    assert r["state"] == "committed" and r["step"] == step and r["world"] == 1, r
    assert r["name"] == path.split("/")[-1] and r["total_bytes"] > 0, r
PYEOF
out=$("$ctl" show "$root/step-000002" 2>&1) || fail "ckptctl show: $out"
grep -qxF "checkpoint step-000002  ($root/step-000002)" <<<"$out" || fail "ckptctl show: $out"
grep -Eq "^  step +2$" <<<"$out" || fail "ckptctl show: no step 2: $out"
grep -Eq "^  rank-00000\.[0-9a-f]{16}\.safetensors +rank 0 " <<<"$out" || fail "ckptctl show: no shard: $out"
grep -Eq "^tensors: [1-9]" <<<"$out" || fail "ckptctl show: no tensors: $out"
"$ctl" show "$root/step-000002" --json >"$tmp/show.json" || fail "ckptctl show --json"
"$py" - "$tmp/show.json" "$tmp/fetch-step-000002/step-000002/manifest.json" <<'PYEOF' ||
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "not one line"
assert json.loads(lines[0]) == json.load(open(sys.argv[2])), "not the manifest boto3 fetched"
PYEOF
	fail "ckptctl show --json is not the manifest"
expect_fail "is not a committed checkpoint \(no manifest\.json; nothing is stored under it\)" -- \
	"$ctl" show "$root/step-999999"
expect_fail "bucket 'no-such-bucket-ckpt' does not exist .*NoSuchBucket" -- \
	"$ctl" list "s3://no-such-bucket-ckpt/x"
expect_fail "bucket 'no-such-bucket-ckpt' does not exist" -- "$ctl" show "s3://no-such-bucket-ckpt/x/y"
expect_fail "access denied: check the credentials.* 403 " -- \
	env AWS_SECRET_ACCESS_KEY=wrong-secret-ckpt "$ctl" list "$root"
expect_fail "access denied: check the credentials.* 403 " -- \
	env AWS_SECRET_ACCESS_KEY=wrong-secret-ckpt "$ctl" show "$root/step-000002"
expect_fail "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" -- \
	env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$tmp" "$ctl" list "$root"
echo "ok: ckptctl list and show on $root"

# boto3 writes a checkpoint in our format under byboto/: the bytes of the
# local copy of step-000002, the shard as boto3's own multipart upload
# (8 MiB parts, no checksums of ours), the manifest last (the commit).
# Beside it: a save in progress (a work area with its attempt.json), a
# name with a shard and no manifest, and 1000 hidden keys before them all,
# so that the listing needs its second page.
"$py" - "$S3_BUCKET" "$tmp/fetch-step-000002/step-000002" <<'PYEOF' || fail "boto3 upload"
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
import boto3
bucket, src = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"],
                  region_name=os.environ.get("AWS_REGION", "us-east-1"))
with ThreadPoolExecutor(8) as ex:
    list(ex.map(lambda i: s3.put_object(Bucket=bucket, Key="byboto/.pad-%04d" % i, Body=b"x"),
                range(1000)))
files = sorted(os.listdir(src))
assert "manifest.json" in files and len(files) > 1, files
for f in [f for f in files if f != "manifest.json"] + ["manifest.json"]:
    s3.upload_file(os.path.join(src, f), bucket, "byboto/step-000002/" + f)
s3.put_object(Bucket=bucket, Key="byboto/.ckpt-work-" + "5a" * 16 + "/attempt.json",
              Body=json.dumps({"format": "ckpt-attempt-1", "job": "boto", "run": "r9",
                               "name": "step-000003", "step": 3, "attempt": 0, "world": 2,
                               "created": int(time.time()) - 90}))
s3.put_object(Bucket=bucket, Key="byboto/step-000009/rank-00000.0123456789abcdef.safetensors",
              Body=b"\0" * 64)
page = s3.list_objects_v2(Bucket=bucket, Prefix="byboto/", Delimiter="/")
assert page["IsTruncated"], "the listing fits one page: the fixture proves nothing"
PYEOF
"$build/tests/ckpt_compare" "s3://$S3_BUCKET/byboto/step-000002" \
	"$tmp/fetch-step-000002/step-000002" >"$tmp/compare.log" 2>&1 ||
	fail "boto3's checkpoint read through s3:// differs: $(cat "$tmp/compare.log")"
grep -Eq "^identical: [1-9][0-9]* tensors, 1 blobs, [0-9]+ bytes$" "$tmp/compare.log" ||
	fail "ckpt_compare: $(cat "$tmp/compare.log")"
out=$("$ctl" list "s3://$S3_BUCKET/byboto" 2>&1) || fail "ckptctl list byboto: $out"
grep -Eq "^step-000002 +2 +64\.0 MiB .* committed$" <<<"$out" || fail "ckptctl list byboto: $out"
grep -Eq "^\.ckpt-work-(5a){16} +3 .* +2  in progress \([0-9]+m( [0-9]+s)? old\): step-000003 of job boto$" \
	<<<"$out" || fail "ckptctl list byboto: no save in progress: $out"
grep -Eq "^step-000009 .* incomplete \(shards but no manifest\.json\)$" <<<"$out" ||
	fail "ckptctl list byboto: no incomplete step-000009: $out"
[ "$(wc -l <<<"$out")" = 4 ] || fail "ckptctl list byboto: a hidden key shown: $out"
"$ctl" list "s3://$S3_BUCKET/byboto" --json >"$tmp/list2.json" || fail "ckptctl list --json byboto"
"$py" - "$tmp/list2.json" <<'PYEOF' || fail "ckptctl list --json byboto: $(cat "$tmp/list2.json")"
import json, sys
got = {r["path"]: r for r in map(json.loads, open(sys.argv[1]))}
w = got.pop(".ckpt-work-" + "5a" * 16)
assert w["state"] == "in_progress" and w["name"] == "step-000003" and w["run"] == "r9", w
assert w["step"] == 3 and w["world"] == 2 and w["attempt"] == 0 and 80 < w["age_s"] < 600, w
assert got.pop("step-000009") == {"path": "step-000009", "state": "incomplete"}
assert got.pop("step-000002")["state"] == "committed" and not got, got
PYEOF
out=$("$ctl" show "s3://$S3_BUCKET/byboto/step-000002" 2>&1) || fail "ckptctl show byboto: $out"
grep -q "^checkpoint step-000002 " <<<"$out" || fail "ckptctl show byboto: $out"
echo "ok: a checkpoint boto3 wrote read back through s3:// ($(cat "$tmp/compare.log")); listed over two pages"

# ckptctl status: the daemon's S3 client, and a save's upload while one
# runs (caught if a status falls inside it: noted, not failed, if not).
"$build/examples/trainer" --socket "$sock" --root "$root/live" --job s3live --steps 1 \
	--mib 512 --save-every 1 --compute-ms 10 >"$tmp/trainer-live.log" 2>&1 &
live=$!
pids+=("$live")
caught=
while kill -0 "$live" 2>/dev/null; do
	"$ctl" -s "$sock" status --json >"$tmp/status.json" 2>&1 || fail "status --json: $(cat "$tmp/status.json")"
	if "$py" - "$tmp/status.json" 2>/dev/null <<'PYEOF'; then
import json, sys
st = json.load(open(sys.argv[1]))
s = [s for s in st["saves"] if s["job"] == "s3live" and s.get("s3_uploaded", 0) > 0]
assert s and s[0]["s3_uploaded"] <= s[0]["bytes"] and st["s3"]["up_bytes_per_s"] > 0, s
PYEOF
		caught=1
		"$ctl" -s "$sock" status >"$tmp/status-live.txt" 2>&1 || fail "status: $(cat "$tmp/status-live.txt")"
		break
	fi
	sleep 0.1
done
wait "$live" || fail "trainer (512 MiB, status polled): $(tail -n 5 "$tmp/trainer-live.log")"
if [ -n "$caught" ]; then
	grep -F "root $root/live, " "$tmp/status-live.txt" | grep -Eq ", [0-9.]+ ([KMG]iB|B) uploaded$" ||
		fail "ckptctl status: no uploaded bytes of the save: $(cat "$tmp/status-live.txt")"
else
	echo "note: no status fell inside the 512 MiB save: its s3_uploaded was not seen"
fi
"$ctl" -s "$sock" status >"$tmp/status.txt" 2>&1 || fail "ckptctl status: $(cat "$tmp/status.txt")"
grep -Eq "^  s3       $S3_ENDPOINT, region $AWS_REGION: [0-9]+ part\(s\) in flight \(at most 16\), [0-9]+ queued$" \
	"$tmp/status.txt" || fail "ckptctl status: no s3 line: $(cat "$tmp/status.txt")"
grep -Eq "^ +1\.[0-9] GiB uploaded, now [0-9.]+ [KMG]?i?B/s \(last [0-9.]+s\), [0-9.]+ [KMG]?i?B downloaded$" \
	"$tmp/status.txt" || fail "ckptctl status: no upload figures: $(cat "$tmp/status.txt")"
grep -Eq "^ +[1-9][0-9]* request\(s\), [0-9]+ retried, [0-9]+ failed, [1-9][0-9]* part\(s\) done$" \
	"$tmp/status.txt" || fail "ckptctl status: no request counts: $(cat "$tmp/status.txt")"
"$ctl" -s "$sock" status --json >"$tmp/status.json" || fail "ckptctl status --json"
"$py" - "$tmp/status.json" <<'PYEOF' || fail "status --json's s3: $(cat "$tmp/status.json")"
import json, os, sys
s3 = json.load(open(sys.argv[1]))["s3"]
assert s3["endpoint"] == os.environ["S3_ENDPOINT"], s3
# 64 MiB twice, 1 GiB, 512 MiB: whole shards, and the small objects
assert s3["bytes_up"] >= (2 * 64 + 1024 + 512) << 20, s3
for k in ("requests", "retries", "failures", "bytes_down", "parts_done", "in_flight", "queued",
          "up_bytes_per_s", "parts_in_flight_max"):
    assert isinstance(s3[k], int) and s3[k] >= 0, k
assert s3["parts_done"] >= (1024 + 512) // 8 and s3["requests"] > s3["parts_done"], s3
assert 0 <= s3["rate_window_s"] <= 11.5, s3
PYEOF
grep -qF -- "$AWS_SECRET_ACCESS_KEY" "$tmp/status.txt" "$tmp/status.json" &&
	fail "ckptctl status printed the secret key"
echo "ok: ckptctl status shows the S3 uploads${caught:+, and a save in flight}"

# ---- 3. refusals ----
"$build/examples/trainer" --socket "$sock" --root "s3://$S3_BUCKET/elsewhere" --job s3 \
	--steps 1 --mib 1 --save-every 1 >"$tmp/refused.log" 2>&1 && fail "a root outside the allowed ones was accepted"
grep -q "not inside an allowed root" "$tmp/refused.log" || fail "refusal message: $(cat "$tmp/refused.log")"
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$tmp" "$build/ckptd" -s "$tmp/x.sock" -r "$root" \
	-o state_dir="$tmp/state2" -o s3_endpoint="$S3_ENDPOINT" >"$tmp/nocreds.log" 2>&1 && fail "ckptd ran without credentials"
grep -q "no S3 credentials" "$tmp/nocreds.log" || fail "no-credentials message: $(cat "$tmp/nocreds.log")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$tmp"/*.log && fail "a secret key appears in a log"

echo "ok: S3 saves of 2, 8 and 4 ranks (two daemons), loads resharded from S3, one rank under an odd prefix, 1 GiB"
