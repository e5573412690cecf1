#!/usr/bin/env bash
# s3.sh - checkpoints to a real S3 server on 127.0.0.1: moto with signature
# checking on (tests/tools/s3_fixture.py), so a signing bug fails here.
#   1. check_multi's S3 cases: 2 and 8 ranks on one daemon, 4 ranks on two
#      daemons that share only the bucket; read back with boto3 + our reader
#      + safetensors; no work area or open upload left.
#   2. the sample trainer (one rank) under a prefix with every printable
#      character a prefix may hold, then a 1 GiB checkpoint: every object
#      fetched with boto3 and with Debian's awscli and compared byte for
#      byte, every chunk's CRC32C checked against the manifest.
#   3. a root outside the allowed ones, and a daemon with an S3 root but no
#      credentials, are refused with clear messages.
# Needs the test Python (moto, boto3); awscli is used when installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
py=${CKPT_TEST_PYTHON:-}
if [ -z "$py" ] || ! "$py" -c 'import moto, boto3' 2>/dev/null; then
	echo "needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	exit 77
fi
for b in ckptd examples/trainer tests/check_multi; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-s3.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	"$py" tests/tools/s3_fixture.py stop --dir "$tmp/moto" >/dev/null 2>&1 || true
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

mkdir -p "$tmp/moto"
"$py" tests/tools/s3_fixture.py start --dir "$tmp/moto" >/dev/null ||
	fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
set -a
# shellcheck disable=SC1091
. "$tmp/moto/s3.env"
set +a
export AWS_EC2_METADATA_DISABLED=true
# For the trainer's reader (libckpt reads S3 with the AWS variables only).
export AWS_ENDPOINT_URL_S3=$S3_ENDPOINT
# Every printable character a prefix may hold, except what the config file
# syntax reserves (a '#' after a space starts a comment) and a space at an
# end (trimmed).
odd='odd/a b+c=d&e;f~g!h$i'"'"'j(k)l*m,n@o:p%41q[r]s{t}u^v|w`x"y<z>?\_.-'
export CKPT_TEST_S3_ROOT="s3://$S3_BUCKET/multi"

# ---- 1. multi-rank and multi-daemon saves ----
out=$(CK_RUN_CASE=s3 "$build/tests/check_multi" 2>&1) || { echo "$out"; fail "check_multi's S3 cases"; }
echo "$out" | grep -q "SKIP" && { echo "$out"; fail "check_multi's S3 cases skipped"; }
echo "$out" | grep -E "^[0-9]+%: Checks" || true

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

# ---- 3. refusals ----
"$build/examples/trainer" --socket "$sock" --root "s3://$S3_BUCKET/elsewhere" --job s3 \
	--steps 1 --mib 1 --save-every 1 >"$tmp/refused.log" 2>&1 && fail "a root outside the allowed ones was accepted"
grep -q "not inside an allowed root" "$tmp/refused.log" || fail "refusal message: $(cat "$tmp/refused.log")"
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$tmp" "$build/ckptd" -s "$tmp/x.sock" -r "$root" \
	-o state_dir="$tmp/state2" -o s3_endpoint="$S3_ENDPOINT" >"$tmp/nocreds.log" 2>&1 && fail "ckptd ran without credentials"
grep -q "no S3 credentials" "$tmp/nocreds.log" || fail "no-credentials message: $(cat "$tmp/nocreds.log")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$tmp"/*.log && fail "a secret key appears in a log"

echo "ok: S3 saves of 2, 8 and 4 ranks (two daemons), one rank under an odd prefix, 1 GiB"
