#!/usr/bin/env bash
# ckptctl_verify.sh - `ckptctl verify ROOT/NAME` on real checkpoints: a
# private ckptd commits one of the sample trainer (one rank, 32 tensors and
# a blob) and one of two ranks with a sharded tensor (tests/tools/
# ckpt_save_sharded.c).  Both verify whole (text and JSON Lines); then, each
# on a fresh copy: a byte flipped in the middle of a shard (the file and
# the CRC piece named, the CRC recomputed here to be the one reported), a
# shard cut short, one byte longer, deleted; a manifest byte changed so a
# tensor's chunks no longer cover it (the parser's message); a byte of the
# safetensors header changed (no CRC covers it); stray entries (warnings,
# exit 0).  Hostile input: a root, a work area, a symlink loop, a manifest
# over 1 GiB, a FIFO and a symlink in a shard's place, manifests whose
# sizes and offsets overflow or name a file twice.  With the test Python
# (moto, boto3): a checkpoint ckptd saved to S3 verifies, and fails once
# boto3 has put it back with a byte flipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
ctl=$build/ckptctl
for b in ckptd ckptctl examples/trainer tests/ckpt_save_sharded; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done
py=/usr/bin/python3
if [ ! -x "$py" ]; then
	echo "needs /usr/bin/python3 for its fixtures"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptctl-verify.XXXXXX")
pids=()
moto=
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -z "$moto" ] || moto_stop "$moto" "$tmp/moto"
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	for l in "$tmp"/*.log; do
		[ -f "$l" ] && { echo "--- $l"; tail -n 20 "$l"; }
	done
	exit 1
}

# expect WANT_RC PATTERN... -- CMD...: runs CMD, checks its exit status and
# that its stdout+stderr matches every extended regex PATTERN; the output
# is left in $out.
expect() {
	local want=$1 rc=0
	shift
	local pats=()
	while [ "$1" != -- ]; do
		pats+=("$1")
		shift
	done
	shift
	out=$("$@" 2>&1) || rc=$?
	[ "$rc" = "$want" ] || fail "'$*' exited $rc, want $want: $out"
	for p in "${pats[@]}"; do
		grep -Eq -- "$p" <<<"$out" || fail "'$*': output lacks /$p/: $out"
	done
}

# start_ckptd CONF LOG: starts ckptd and waits for its socket (from CONF).
start_ckptd() {
	local sock
	sock=$(sed -n 's/^socket = //p' "$1")
	"$build/ckptd" -c "$1" >"$2" 2>&1 &
	pids+=($!)
	for _ in $(seq 200); do
		[ -S "$sock" ] && return 0
		kill -0 "${pids[-1]}" 2>/dev/null || fail "ckptd exited"
		sleep 0.05
	done
	fail "ckptd did not listen on $sock"
}

stop_ckptd() {
	local p=${pids[-1]}
	kill "$p"
	wait "$p" || true
	unset 'pids[-1]'
}

# ---- real checkpoints ----
root=$tmp/root
mkdir -p "$root" "$tmp/state"
cat >"$tmp/ckptd.conf" <<CONF
socket = $tmp/ckptd.sock
state_dir = $tmp/state
root = $root
CONF
start_ckptd "$tmp/ckptd.conf" "$tmp/ckptd.log"
"$build/examples/trainer" --socket "$tmp/ckptd.sock" --root "$root" --job verify --steps 2 \
	--mib 16 --save-every 2 --compute-ms 10 >"$tmp/trainer.log" 2>&1 || fail "trainer"
"$build/tests/ckpt_save_sharded" "$tmp/ckptd.sock" "$root" sharded >"$tmp/sharded.log" 2>&1 ||
	fail "ckpt_save_sharded"
stop_ckptd
one=$root/step-000002
two=$root/sharded
for f in "$one/manifest.json" "$two/manifest.json"; do
	[ -f "$f" ] || fail "no $f: not committed"
done

# facts DIR: "FILES BYTES PIECES" of a checkpoint, from its manifest.
facts() {
	"$py" - "$1" <<'PY'
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
pieces = sum(len(c["crc32c"]) for t in m["tensors"].values() for c in t["chunks"])
pieces += sum(len(b["crc32c"]) for b in m["blobs"].values())
sizes = [os.path.getsize(os.path.join(sys.argv[1], f["path"])) for f in m["files"]]
assert sizes == [f["size"] for f in m["files"]], "the manifest's sizes are not the files'"
print(len(sizes), sum(sizes), pieces)
PY
}

# check_json FILE WANT_OK PY-EXPR...: FILE is JSON Lines, the last line a
# summary with ok = WANT_OK and problems/warnings the count of the objects
# before it; each PY-EXPR holds with `s` the summary and `p` the list of
# problem objects.
check_json() {
	local f=$1 ok=$2
	shift 2
	"$py" - "$f" "$ok" "$@" <<'PY' || fail "JSON of verify: $(cat "$f")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
objs = [json.loads(l) for l in lines]
assert all(l.startswith("{") and l.endswith("}") for l in lines), lines
s, p = objs[-1]["summary"], objs[:-1]
assert all("problem" in o and o["severity"] in ("error", "warning") and "message" in o
           and "file" in o for o in p), p
assert s["ok"] == (sys.argv[2] == "true"), s
assert s["problems"] == sum(o["severity"] == "error" for o in p), (s, p)
assert s["warnings"] == sum(o["severity"] == "warning" for o in p), (s, p)
for e in sys.argv[3:]:
    assert eval(e), (e, s, p)
PY
}

# ---- whole checkpoints ----
for ck in "$one" "$two"; do
	read -r nf nb np < <(facts "$ck")
	files="$nf file"
	[ "$nf" = 1 ] || files="${files}s"
	expect 0 "^$ck: OK, $files, $nb bytes, $np CRC pieces checked$" -- "$ctl" verify "$ck"
	[ "$(wc -l <<<"$out")" = 1 ] || fail "verify of a whole checkpoint says more: $out"
	"$ctl" verify "$ck" --json >"$tmp/ok.json" || fail "verify --json $ck"
	check_json "$tmp/ok.json" true "len(p) == 0" "s['files'] == $nf" "s['bytes'] == $nb" \
		"s['pieces'] == $np" "s['path'] == '$ck'"
done
expect 0 '"ok":true' -- "$ctl" verify "$two" -o json
read -r _ _ np1 < <(facts "$one")
[ "$np1" -ge 40 ] || fail "the trainer's checkpoint has only $np1 CRC pieces"
echo "ok: whole checkpoints verify ($np1 CRC pieces in one)"

# fresh NAME SRC: a copy of checkpoint SRC at $tmp/t/NAME, path in $ck.
mkdir "$tmp/t"
fresh() {
	ck=$tmp/t/$1
	cp -a "$2" "$ck"
}

# flip CK FILE: flips the byte in the middle of FILE; prints what the
# damage must look like: "BEGIN END ITEM CHUNK PIECE EXPECTED ACTUAL", the
# piece that holds the byte, its CRC32C before and after (computed here).
flip() {
	"$py" - "$1" "$2" <<'PY'
import json, os, sys
d, name = sys.argv[1:]
path = os.path.join(d, name)
off = os.path.getsize(path) // 2
with open(path, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    f.seek(off)
    f.write(bytes([b[0] ^ 0x5A]))
m = json.load(open(os.path.join(d, "manifest.json")))
fi = [f["path"] for f in m["files"]].index(name)
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
def crc32c(data):
    c = 0xFFFFFFFF
    for x in data:
        c = table[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
B = 1 << 20
items = [(n, k, c) for n, t in m["tensors"].items() for k, c in enumerate(t["chunks"])]
items += [(n, 0, b) for n, b in m["blobs"].items()]
for n, k, c in items:
    if c["file"] != fi or not c["begin"] <= off < c["end"]:
        continue
    at, i = c["begin"], 0
    while True:
        end = min(c["end"], (at // B + 1) * B)
        if at <= off < end:
            break
        at, i = end, i + 1
    with open(path, "rb") as f:
        f.seek(at)
        actual = crc32c(f.read(end - at))
    print(at, end, n, k, i, c["crc32c"][i], actual)
    break
else:
    sys.exit("the middle of %s is in no chunk" % name)
PY
}

# ---- a flipped byte ----
for case in "one rank-00000.safetensors" "two rank-00001.safetensors"; do
	read -r which file <<<"$case"
	src=$one
	[ "$which" = one ] || src=$two
	fresh "flip-$which" "$src"
	read -r b e item chunk piece want got < <(flip "$ck" "$file") || fail "flip"
	[ "$want" != "$got" ] || fail "the flip did not change the piece's CRC"
	hex=$(printf '0x%08x' "$got")
	whex=$(printf '0x%08x' "$want")
	expect 1 \
		"^error: $file: bytes \[$b, $e\) \(tensor '$item' chunk $chunk, CRC piece $piece\): CRC32C $hex, the manifest says $whex$" \
		"^$ck: DAMAGED: 1 problem$" -- "$ctl" verify "$ck"
	[ "$(wc -l <<<"$out")" = 2 ] || fail "more than the one CRC piece reported: $out"
	"$ctl" verify "$ck" --json >"$tmp/flip.json" && fail "verify --json of a damaged one exited 0"
	check_json "$tmp/flip.json" false "len(p) == 1" "p[0]['problem'] == 'crc'" \
		"p[0]['file'] == '$file'" "p[0]['begin'] == $b and p[0]['end'] == $e" \
		"p[0]['item'] == '$item' and p[0]['chunk'] == $chunk and p[0]['piece'] == $piece" \
		"p[0]['expected'] == $want and p[0]['actual'] == $got" \
		"s['pieces'] == $(facts "$src" | cut -d' ' -f3)"
done
echo "ok: a flipped byte is found in its CRC piece, named, with the CRC recomputed here"

# ---- sizes ----
shard=rank-00000.safetensors
size=$(stat -c %s "$one/$shard")
fresh short "$one"
truncate -s $((size - 5000)) "$ck/$shard"
expect 1 "^error: $shard: $((size - 5000)) bytes stored, the manifest says $size \(5000 bytes short; [1-9][0-9]* CRC pieces? past its end not checked\)$" \
	"DAMAGED: 1 problem$" -- "$ctl" verify "$ck"
fresh long "$one"
printf 'x' >>"$ck/$shard"
expect 1 "^error: $shard: $((size + 1)) bytes stored, the manifest says $size \(1 byte too many\)$" \
	"DAMAGED: 1 problem$" -- "$ctl" verify "$ck"
"$ctl" verify "$ck" --json >"$tmp/long.json" || true
check_json "$tmp/long.json" false "p[0]['problem'] == 'size'" \
	"p[0]['expected_size'] == $size and p[0]['actual_size'] == $((size + 1))" \
	"s['pieces'] == $np1"
fresh gone "$two"
rm "$ck/rank-00001.safetensors"
expect 1 "^error: rank-00001.safetensors: missing \(the manifest lists it with [0-9]+ bytes\)$" \
	"DAMAGED: 1 problem$" -- "$ctl" verify "$ck"
"$ctl" verify "$ck" --json >"$tmp/gone.json" || true
# rank 0's pieces are still checked
check_json "$tmp/gone.json" false "p[0]['problem'] == 'missing'" "s['pieces'] > 0"
echo "ok: a shard cut short, one byte longer and deleted"

# ---- the manifest ----
# One byte: the first tensor's global shape 128 rows -> 129.
fresh cover "$one"
sed -i '0,/"shape":\[128,1024\],"chunks"/s//"shape":[129,1024],"chunks"/' "$ck/manifest.json"
cmp -s "$one/manifest.json" "$ck/manifest.json" && fail "the manifest edit changed nothing"
expect 1 "^error: manifest.json: tensor '[^']+': chunks cover 131072 of 132096 elements$" \
	"DAMAGED: 1 problem$" -- "$ctl" verify "$ck"
# One byte: rank 1's chunk of "w" starts at row 284, not 384: it overlaps.
fresh overlap "$two"
sed -i 's/"offsets":\[384,0\]/"offsets":[284,0]/' "$ck/manifest.json"
cmp -s "$two/manifest.json" "$ck/manifest.json" && fail "the manifest edit changed nothing"
expect 1 "^error: manifest.json: tensor 'w': chunks 0 and 1 overlap \(at \[0,0\] and \[284,0\]\)$" \
	-- "$ctl" verify "$ck"
"$ctl" verify "$ck" --json >"$tmp/overlap.json" || true
check_json "$tmp/overlap.json" false "p[0]['problem'] == 'manifest'" "s['files'] == 0"
# The safetensors header, which no CRC covers: a tensor renamed there.
fresh header "$one"
"$py" - "$ck/$shard" <<'PY'
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = f.read(n)
    i = h.index(b'"model.layers.3.weight"')
    f.seek(8 + i + 1)
    f.write(b"M")
PY
expect 1 "^error: $shard: safetensors header has no entry for tensor 'model.layers.3.weight'$" \
	"^error: $shard: safetensors header has 1 entry that the manifest does not place in this file$" \
	"DAMAGED: 2 problems$" -- "$ctl" verify "$ck"
# A header length far past the file (and any allocation).
fresh hlen "$one"
printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="$ck/$shard" conv=notrunc status=none
expect 1 "^error: $shard: safetensors header length 18446744073709551615: more than the file holds$" \
	"DAMAGED: 1 problem$" -- "$ctl" verify "$ck"
echo "ok: a manifest that no longer covers a tensor, and a changed shard header"

# ---- entries the manifest does not name: warnings ----
fresh stray "$two"
echo note >"$ck/notes.txt"
mkdir "$ck/extra"
expect 0 "^warning: notes.txt: a file that the manifest does not name$" \
	"^warning: extra: a directory that the manifest does not name$" \
	"^$ck: OK, 2 files, [0-9]+ bytes, [0-9]+ CRC pieces checked \(2 warnings\)$" -- \
	"$ctl" verify "$ck"
"$ctl" verify "$ck" --json >"$tmp/stray.json" || fail "verify --json with warnings exited non-zero"
check_json "$tmp/stray.json" true "len(p) == 2" "s['warnings'] == 2 and s['problems'] == 0" \
	"sorted(o['file'] for o in p) == ['extra', 'notes.txt']" \
	"all(o['problem'] == 'unlisted' and o['severity'] == 'warning' for o in p)"
# What the local backend leaves beside the manifest is no stray.
for f in attempt.json coordinator.json rank-00000.index.json rank-00001.index.json; do
	[ -f "$two/$f" ] || fail "a committed checkpoint lacks $f: the layout changed"
done
# Past 100 findings they are counted, not shown.
fresh strays "$two"
for i in $(seq 150); do : >"$ck/stray-$i"; done
expect 0 "^warning: 50 more findings not shown$" \
	"^$ck: OK, 2 files, [0-9]+ bytes, [0-9]+ CRC pieces checked \(150 warnings\)$" -- \
	"$ctl" verify "$ck"
[ "$(grep -c '^warning: stray-' <<<"$out")" = 100 ] || fail "not 100 strays shown: $out"
echo "ok: stray entries are warnings"

# ---- not a checkpoint, hostile input ----
expect 1 "^ckptctl: verify: '$root' is not a committed checkpoint \(no manifest.json" -- \
	"$ctl" verify "$root"
"$ctl" verify "$root" --json >"$tmp/root.json" 2>/dev/null && fail "verify of a root exited 0"
check_json "$tmp/root.json" false "p[0]['problem'] == 'not_checkpoint'" "s['files'] == 0"
mkdir -p "$tmp/t/.ckpt-work-0123456789abcdef0123456789abcdef"
echo '{}' >"$tmp/t/.ckpt-work-0123456789abcdef0123456789abcdef/attempt.json"
expect 1 "is the work area of a save in progress or of a failed one \(no manifest.json\)" -- \
	"$ctl" verify "$tmp/t/.ckpt-work-0123456789abcdef0123456789abcdef"
ln -s loop-b "$tmp/t/loop-a"
ln -s loop-a "$tmp/t/loop-b"
expect 1 "^ckptctl: verify: cannot open checkpoint '$tmp/t/loop-a': a loop of symbolic links" -- \
	"$ctl" verify "$tmp/t/loop-a"
expect 1 "cannot open checkpoint '$tmp/t/absent': No such file or directory" -- \
	"$ctl" verify "$tmp/t/absent"
fresh huge "$two"
truncate -s $((1024 * 1024 * 1024 + 1)) "$ck/manifest.json"
expect 1 "^ckptctl: verify: cannot read '$ck/manifest.json': larger than 1024 MiB" -- \
	"$ctl" verify "$ck"
fresh fifo "$two"
rm "$ck/rank-00001.safetensors"
mkfifo "$ck/rank-00001.safetensors"
expect 1 "^error: rank-00001.safetensors: cannot open: not a regular file$" -- \
	timeout 20 "$ctl" verify "$ck"
fresh link "$two"
mv "$ck/rank-00001.safetensors" "$ck/r1"
ln -s r1 "$ck/rank-00001.safetensors"
expect 1 "^error: rank-00001.safetensors: cannot open: a symbolic link, not a file$" \
	"^warning: r1: a file that the manifest does not name$" -- "$ctl" verify "$ck"

# Hostile manifests: sizes and offsets near 2^63, sizes whose sum
# overflows, a range outside its file, a file named twice.
"$py" - "$two" "$tmp/t" <<'PY'
import copy, json, os, shutil, sys
src, out = sys.argv[1:]
base = json.load(open(os.path.join(src, "manifest.json")))
def write(name, m):
    d = os.path.join(out, name)
    shutil.copytree(src, d)
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
big = 2**63 - 1
m = copy.deepcopy(base)
far = big - m["files"][0]["size"]   # the total is then the largest JSON integer
m["files"][1]["size"] = far
m["total_bytes"] = big
m["blobs"]["far"] = {"size": 16, "file": 1, "begin": far - 16, "end": far, "crc32c": [7]}
write("far", m)
m = copy.deepcopy(base)
for f in m["files"]:
    f["size"] = big
m["files"].append({"rank": 0, "path": "third", "size": big})
m["total_bytes"] = 0
write("overflow", m)
m = copy.deepcopy(base)
m["blobs"]["loader.1"]["end"] = m["files"][1]["size"] + 1
write("outside", m)
m = copy.deepcopy(base)
m["files"][1]["path"] = m["files"][0]["path"]
m["files"][1]["size"] = m["files"][0]["size"]
m["total_bytes"] = 2 * m["files"][0]["size"]
m["tensors"]["w"]["chunks"][1]["file"] = 1
write("twice", m)
PY
expect 1 "^error: rank-00001.safetensors: [0-9]+ bytes stored, the manifest says 92233720368[0-9]{8} \([0-9]+ bytes short; 1 CRC piece past its end not checked\)$" \
	"^error: rank-00001.safetensors: safetensors header has no entry for blob 'far'$" \
	"DAMAGED: 2 problems$" -- "$ctl" verify "$tmp/t/far"
expect 1 "^error: manifest.json: manifest file sizes overflow$" -- "$ctl" verify "$tmp/t/overflow"
expect 1 "^error: manifest.json: blob 'loader.1' chunk 0: \[begin, end\) is not a range inside rank-00001.safetensors" \
	-- "$ctl" verify "$tmp/t/outside"
expect 1 "^error: manifest.json: manifest lists the file 'rank-00000.safetensors' more than once$" -- \
	"$ctl" verify "$tmp/t/twice"
echo "ok: roots, work areas, symlink loops, a huge manifest, FIFOs, symlinks, overflowing manifests"

expect 2 "verify: ROOT/NAME is missing" -- "$ctl" verify
expect 2 "unexpected argument" -- "$ctl" verify "$one" "$two"

# ---- S3 ----
tpy=${CKPT_TEST_PYTHON:-}
if [ -z "$tpy" ] || ! "$tpy" -c 'import moto, boto3' 2>/dev/null; then
	echo "SKIP: [s3] needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	echo "ckptctl_verify: local checks passed"
	exit 0
fi
moto=$tpy
moto_start "$tpy" "$tmp/moto" || fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
s3root="s3://$S3_BUCKET/verify"
mkdir -p "$tmp/state3"
cat >"$tmp/ckptd3.conf" <<CONF
socket = $tmp/ckptd3.sock
state_dir = $tmp/state3
root = $s3root
s3_endpoint = $S3_ENDPOINT
arena_max = 256M
CONF
start_ckptd "$tmp/ckptd3.conf" "$tmp/ckptd3.log"
"$build/examples/trainer" --socket "$tmp/ckptd3.sock" --root "$s3root" --job verify3 --steps 2 \
	--mib 16 --save-every 2 --compute-ms 10 >"$tmp/trainer3.log" 2>&1 || fail "trainer (S3)"
stop_ckptd
s3ck=$s3root/step-000002
expect 0 "^$s3ck: OK, 1 file, [0-9]+ bytes, $np1 CRC pieces checked$" -- "$ctl" verify "$s3ck"
# boto3 puts the shard back with its middle byte flipped, and a stray object.
"$tpy" - "$S3_BUCKET" verify/step-000002 >"$tmp/s3flip.out" <<'PY' || fail "boto3 flip"
import json, os, sys
import boto3
bucket, pre = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"],
                  region_name=os.environ.get("AWS_REGION", "us-east-1"))
m = json.loads(s3.get_object(Bucket=bucket, Key=pre + "/manifest.json")["Body"].read())
name = m["files"][0]["path"]
body = bytearray(s3.get_object(Bucket=bucket, Key=pre + "/" + name)["Body"].read())
assert len(body) == m["files"][0]["size"]
body[len(body) // 2] ^= 0x5A
s3.put_object(Bucket=bucket, Key=pre + "/" + name, Body=bytes(body))
s3.put_object(Bucket=bucket, Key=pre + "/stray.bin", Body=b"x")
print(name)
PY
s3shard=$(cat "$tmp/s3flip.out")
expect 1 "^error: $s3shard: bytes \[[0-9]+, [0-9]+\) \(tensor 'model\.layers\.[0-9]+\.weight' chunk 0, CRC piece [0-9]+\): CRC32C 0x[0-9a-f]{8}, the manifest says 0x[0-9a-f]{8}$" \
	"^warning: stray.bin: a file that the manifest does not name$" \
	"^$s3ck: DAMAGED: 1 problem \(1 warning\)$" -- "$ctl" verify "$s3ck"
"$ctl" verify "$s3ck" --json >"$tmp/s3.json" || true
check_json "$tmp/s3.json" false "[o['problem'] for o in p] == ['crc', 'unlisted']" \
	"p[0]['file'] == '$s3shard'" "s['pieces'] == $np1"
expect 1 "'$s3root/step-999999' is not a committed checkpoint \(no manifest.json; nothing is stored under it\)" \
	-- "$ctl" verify "$s3root/step-999999"
grep -qF -- "$AWS_SECRET_ACCESS_KEY" "$tmp/s3.json" && fail "verify printed the secret key"
echo "ok: an S3 checkpoint verifies, and a byte flipped by boto3 is found"
echo "ckptctl_verify: all checks passed"
