#!/usr/bin/env bash
# ckptctl.sh - the operator command: list and show on a root made here
# (committed checkpoints at the root and in per-job directories below it,
# saves in progress, incomplete and corrupt checkpoints), status against a
# stand-in daemon speaking the control protocol, socket resolution, errors
# and usage.  Needs only the system python3 (standard library).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

ctl=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}/ckptctl
if [ ! -x "$ctl" ]; then
	echo "FAIL: $ctl is not built"
	exit 1
fi
py=/usr/bin/python3
if [ ! -x "$py" ]; then
	echo "needs /usr/bin/python3 for its fixtures"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptctl-test.XXXXXX")
fake_pid=
cleanup() {
	if [ -n "$fake_pid" ]; then
		kill "$fake_pid" 2>/dev/null || true
		wait "$fake_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

# expect_out WANT_RC PATTERN... -- CMD...: runs CMD, checks its exit status and
# that its stdout+stderr matches every extended regex PATTERN.
expect_out() {
	local want=$1 out rc=0
	shift
	local pats=()
	while [ "$1" != -- ]; do
		pats+=("$1")
		shift
	done
	shift
	out=$("$@" 2>&1) || rc=$?
	if [ "$rc" != "$want" ]; then
		printf '%s\n' "$out"
		fail "'$*' exited $rc, want $want"
	fi
	for p in "${pats[@]}"; do
		if ! grep -Eq -- "$p" <<<"$out"; then
			printf '%s\n' "$out"
			fail "'$*': output lacks /$p/"
		fi
	done
}

root=$tmp/root
mkdir -p "$root"

# ---- fixtures: real shard files and manifests in the ckpt-1 format ----
"$py" - "$root" <<'EOF'
import json, os, struct, sys, time

root = sys.argv[1]
BLOCK = 1 << 20

def crc32c(data, crc=0):
    poly = 0x82F63B78
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF

def pieces(data, begin):
    """CRC32C of [begin, begin+len) cut at the 1 MiB grid of the file."""
    out, off = [], begin
    end = begin + len(data)
    while off < end:
        nxt = min(end, (off // BLOCK + 1) * BLOCK)
        out.append(crc32c(data[off - begin:nxt - begin]))
        off = nxt
    return out

def shard(path, items):
    """items: [(name, dtype, shape, bytes)] -> absolute (begin, end) per item."""
    hdr, off = {}, 0
    for name, dtype, shape, data in items:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    text = json.dumps(hdr).encode()
    start = (8 + len(text) + 4095) // 4096 * 4096
    text += b" " * (start - 8 - len(text))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for *_, data in items:
            f.write(data)
    return [(start + hdr[n]["data_offsets"][0], start + hdr[n]["data_offsets"][1])
            for n, *_ in items], start + off

def checkpoint(rel, step, world, ranks, blobs_on, meta, metrics):
    """ranks: per rank a list of (tensor, dtype, gshape, offsets, shape, bytes)."""
    d = os.path.join(root, rel)
    name = os.path.basename(rel)
    os.makedirs(d)
    files, tensors, blobs = [], {}, {}
    for r, items in enumerate(ranks):
        fname = "rank-%05d.safetensors" % r
        st_items = [(t, dt, shp, data) for t, dt, _, _, shp, data in items]
        extra = [(k, "U8", [len(v)], v) for k, v in blobs_on.get(r, {}).items()]
        ranges, size = shard(os.path.join(d, fname), st_items + extra)
        files.append({"rank": r, "path": fname, "size": size})
        for (t, dt, gshape, offs, shp, data), (b, e) in zip(items, ranges):
            tensors.setdefault(t, {"dtype": dt, "shape": gshape, "chunks": []})
            tensors[t]["chunks"].append({"file": r, "offsets": offs, "shape": shp,
                                         "begin": b, "end": e, "crc32c": pieces(data, b)})
        for (k, _, _, v), (b, e) in zip(extra, ranges[len(items):]):
            blobs[k] = {"size": len(v), "file": r, "begin": b, "end": e,
                        "crc32c": pieces(v, b)}
    man = {"format": "ckpt-1", "name": name, "step": step, "time": "2026-11-23T03:09:36Z",
           "job": "llm-7b", "world_size": world, "crc_block": BLOCK, "metadata": meta,
           "metrics": metrics, "files": files, "total_bytes": sum(f["size"] for f in files),
           "tensors": tensors, "blobs": blobs}
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)

f32 = lambda n, v: struct.pack("<%df" % n, *([v] * n))
# step 100: world 2, "layer.0.weight" [4, 3] sharded by rows across the ranks
checkpoint("step-000100", 100, 2,
           [[("layer.0.weight", "F32", [4, 3], [0, 0], [2, 3], f32(6, 1.0)),
             ("bias", "BF16", [3], [0], [3], b"\x80\x3f" * 3)],
            [("layer.0.weight", "F32", [4, 3], [2, 0], [2, 3], f32(6, 2.0))]],
           {0: {"dataloader": b"state" * 10}},
           {"git": "abc123", "note": "nightly"}, {"loss": 1.25})
# step 20: world 1, bigger than one CRC block
checkpoint("step-000020", 20, 1,
           [[("emb", "F16", [1024, 1024], [0, 0], [1024, 1024], b"\x00" * (2 << 20))]],
           {}, {}, {})
os.makedirs(os.path.join(root, ".partial-step-000300-7f3a"))
# shards but no manifest: an incomplete checkpoint
os.makedirs(os.path.join(root, "half-done"))
open(os.path.join(root, "half-done", "rank-00000.safetensors"), "wb").write(b"\0" * 64)
os.makedirs(os.path.join(root, "broken"))
with open(os.path.join(root, "broken", "manifest.json"), "w") as f:
    f.write('{"format": "ckpt-1", "name": ')
os.makedirs(os.path.join(root, "wrong-total"))
man = json.load(open(os.path.join(root, "step-000100", "manifest.json")))
man["total_bytes"] += 1
json.dump(man, open(os.path.join(root, "wrong-total", "manifest.json"), "w"))
# a manifest of a later format: listed as such, never as corrupt
os.makedirs(os.path.join(root, "from-future"))
man["total_bytes"] -= 1
man["format"] = "ckpt-2"
json.dump(man, open(os.path.join(root, "from-future", "manifest.json"), "w"))
os.makedirs(os.path.join(root, ".hidden", "step-000001"))
open(os.path.join(root, ".hidden", "step-000001", "manifest.json"), "w").write("{}")
open(os.path.join(root, "README"), "w").write("not a checkpoint\n")
# a directory inside a checkpoint is never searched
os.makedirs(os.path.join(root, "step-000020", "inner"))
open(os.path.join(root, "step-000020", "inner", "manifest.json"), "w").write("{}")
# containers: an empty one (not shown) and a job's directory as the daemon
# makes them, with a checkpoint and a save in progress
os.makedirs(os.path.join(root, "empty-job"))
checkpoint("llm-7b/step-000050", 50, 1,
           [[("w", "F32", [2], [0], [2], f32(2, 3.0))]], {}, {}, {})
work = os.path.join(root, "llm-7b", ".ckpt-work-" + "0123456789abcdef" * 2)
os.makedirs(work)
json.dump({"job": "llm-7b", "name": "step-000060", "step": 60, "run": "r1", "attempt": 1,
           "world": 2, "created": int(time.time()) - 2 * 3600 - 5 * 60},
          open(os.path.join(work, "attempt.json"), "w"))
# a work directory whose attempt.json is unreadable: still in progress
bad = os.path.join(root, ".ckpt-work-" + "f" * 32)
os.makedirs(bad)
open(os.path.join(bad, "attempt.json"), "w").write("not json")
# not work directories (wrong length, not hex): hidden, not shown
os.makedirs(os.path.join(root, ".ckpt-work-1234"))
os.makedirs(os.path.join(root, ".ckpt-work-" + "g" * 32))
# 8 levels below the root are searched, 9 are not
deep = os.path.join(*["d%d" % i for i in range(1, 8)])
checkpoint(os.path.join(deep, "ck8"), 8, 1,
           [[("w", "F32", [1], [0], [1], f32(1, 0.0))]], {}, {}, {})
checkpoint(os.path.join(deep, "d8", "ck9"), 9, 1,
           [[("w", "F32", [1], [0], [1], f32(1, 0.0))]], {}, {}, {})
# symlinks are neither shown nor followed
os.symlink("step-000100", os.path.join(root, "latest"))
os.symlink(".", os.path.join(root, "loop"))
EOF

# ---- list ----
# Changed on purpose with the layout decision of issue 7: list searches
# below the root and prints paths relative to it, calls work directories
# "in progress" (was "partial"), shows plain directories as containers (only
# what they hold) and "incomplete" only for a directory with shards but no
# manifest; --json prints one object per line with "path" (was an array
# with "name").
"$ctl" list "$root" >"$tmp/list.out" 2>"$tmp/list.err"
out=$(cat "$tmp/list.out")
echo "$out"
# by directory; in one, committed by step (20 before 100), then the rest by name
order=$(awk 'NR > 1 { print $1 }' <<<"$out" | tr '\n' ' ')
want="step-000020 step-000100 .ckpt-work-ffffffffffffffffffffffffffffffff"
want="$want .partial-step-000300-7f3a broken from-future half-done wrong-total d1/d2/d3/d4/d5/d6/d7/ck8"
want="$want llm-7b/step-000050 llm-7b/.ckpt-work-0123456789abcdef0123456789abcdef "
[ "$order" = "$want" ] || fail "list order: '$order'"
grep -Eq '^step-000100 +100 +[0-9.]+ KiB +2026-11-23T03:09:36Z +2 +committed$' <<<"$out" ||
	fail "step-000100 line"
grep -Eq '^step-000020 +20 +2\.0 MiB ' <<<"$out" || fail "step-000020 size"
grep -Eq '^llm-7b/step-000050 +50 +.* +1 +committed$' <<<"$out" || fail "checkpoint in a job dir"
grep -Eq '^\.partial-step-000300-7f3a .* in progress \([0-9.]+(ms|s) old\)$' <<<"$out" ||
	fail "legacy work dir"
grep -Eq '^llm-7b/\.ckpt-work-(0123456789abcdef){2} +60 +- +- +2 +in progress \(2h 5m old\): step-000060 of job llm-7b$' <<<"$out" ||
	fail "work dir with attempt.json"
grep -Eq '^\.ckpt-work-f{32} +- +- +- +- +in progress \([0-9.]+(ms|s) old\)$' <<<"$out" ||
	fail "work dir without a readable attempt.json"
grep -Eq '^half-done .* incomplete \(shards but no manifest.json\)$' <<<"$out" || fail "incomplete"
grep -Eq '^broken .* corrupt: manifest is not valid JSON' <<<"$out" || fail "corrupt JSON"
grep -Eq '^wrong-total .* corrupt: .*total_bytes' <<<"$out" || fail "corrupt total"
grep -Eq "^from-future .* newer format: manifest format 'ckpt-2' is newer" <<<"$out" ||
	fail "newer format"
if grep -Eq 'README|hidden|inner|empty-job|latest|loop|ck9|ckpt-work-1234|ckpt-work-g' <<<"$out"; then
	fail "list shows a file, a hidden dir, a container, a symlink or what lies too deep"
fi
grep -q "note: 1 directory more than 8 levels below '$root' not searched" "$tmp/list.err" ||
	fail "no note about the depth limit: $(cat "$tmp/list.err")"

"$ctl" list "$root" --json >"$tmp/list.json"
"$py" - "$tmp/list.json" "$root" <<'EOF'
import json, os, sys
lines = open(sys.argv[1]).read().splitlines()
ents = [json.loads(l) for l in lines]   # JSON Lines: one compact object per line
assert all(l.startswith("{") and l.endswith("}") for l in lines), lines
by = {e["path"]: e for e in ents}
assert [e["path"] for e in ents][:2] == ["step-000020", "step-000100"], ents
e = by["step-000100"]
assert e["state"] == "committed" and e["step"] == 100 and e["world"] == 2, e
assert e["name"] == "step-000100", e
sizes = [os.path.getsize(os.path.join(sys.argv[2], "step-000100", f))
         for f in ("rank-00000.safetensors", "rank-00001.safetensors")]
assert e["total_bytes"] == sum(sizes), (e, sizes)
assert e["time"] == "2026-11-23T03:09:36Z" and e["job"] == "llm-7b", e
e = by["llm-7b/step-000050"]
assert e["state"] == "committed" and e["name"] == "step-000050" and e["step"] == 50, e
assert by[".partial-step-000300-7f3a"]["state"] == "in_progress"
assert by[".partial-step-000300-7f3a"]["age_s"] >= 0
w = by["llm-7b/.ckpt-work-" + "0123456789abcdef" * 2]
assert w["state"] == "in_progress" and w["name"] == "step-000060" and w["job"] == "llm-7b", w
assert w["step"] == 60 and w["world"] == 2 and w["run"] == "r1" and w["attempt"] == 1, w
assert 7500 <= w["age_s"] < 7500 + 600, w
assert w["age_s"] == round(w["age_s"], 3), w
b = by[".ckpt-work-" + "f" * 32]
assert b["state"] == "in_progress" and "name" not in b and "job" not in b, b
assert by["half-done"]["state"] == "incomplete"
assert by["broken"]["state"] == "corrupt" and "JSON" in by["broken"]["error"]
assert by["wrong-total"]["state"] == "corrupt"
assert by["from-future"]["state"] == "newer_format" and "ckpt-2" in by["from-future"]["error"]
assert by["d1/d2/d3/d4/d5/d6/d7/ck8"]["step"] == 8
assert len(ents) == 11, sorted(by)
EOF

mkdir "$tmp/empty"
expect_out 0 "no checkpoints in" -- "$ctl" list "$tmp/empty"
[ -z "$("$ctl" list "$tmp/empty" --json)" ] || fail "empty --json prints lines"
expect_out 0 "no checkpoints in '$root/step-000100' \(it is a checkpoint itself: ckptctl show" -- \
	"$ctl" list "$root/step-000100"
expect_out 1 "^ckptctl: cannot open root '$tmp/nope': No such file or directory$" -- \
	"$ctl" list "$tmp/nope"
expect_out 1 "Not a directory" -- "$ctl" list "$root/README"

# ---- show ----
expect_out 0 \
	"^checkpoint step-000100 " \
	"^  step +100$" "^  world +2$" "^  job +llm-7b$" \
	"^  git = abc123$" "^  loss = 1.25$" \
	"^  rank-00000.safetensors +rank 0 " "^  rank-00001.safetensors +rank 1 " \
	"^tensors: 2$" \
	"^  layer.0.weight +F32 +\[4, 3\] +2 +48 B$" \
	"^  bias +BF16 +\[3\] +1 +6 B$" \
	"^blobs: 1$" "^  dataloader +50 B +rank-00000.safetensors \[[0-9]+, [0-9]+\)$" \
	-- "$ctl" show "$root/step-000100"
out=$("$ctl" show "$root/step-000100")
if grep -q "chunk 0:" <<<"$out"; then fail "chunks shown without -v"; fi
expect_out 0 \
	"^      chunk 0: rank-00000.safetensors offsets \[0, 0\] shape \[2, 3\] bytes \[4096, 4120\)$" \
	"^      chunk 1: rank-00001.safetensors offsets \[2, 0\] shape \[2, 3\] bytes \[4096, 4120\)$" \
	-- "$ctl" show "$root/step-000100" -v
"$ctl" show "$root/step-000100" --json >"$tmp/show.json"
[ "$(wc -l <"$tmp/show.json")" = 1 ] || fail "show --json is not one line"
"$py" -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); assert a == b' \
	"$tmp/show.json" "$root/step-000100/manifest.json" || fail "show --json is not the manifest"
expect_out 1 "is not a committed checkpoint \(no manifest.json\)" -- "$ctl" show "$root/half-done"
expect_out 0 "^checkpoint step-000050 " -- "$ctl" show "$root/llm-7b/step-000050"
expect_out 1 "manifest.json' is corrupt: manifest is not valid JSON" -- "$ctl" show "$root/broken"
expect_out 1 "manifest.json': manifest format 'ckpt-2' is newer" -- "$ctl" show "$root/from-future"
expect_out 1 "cannot open checkpoint '$root/absent'" -- "$ctl" show "$root/absent"

# ---- usage ----
expect_out 0 "^usage: ckptctl" -- "$ctl" --help
expect_out 0 "^ckptctl [0-9]+\.[0-9]+\.[0-9]+$" -- "$ctl" --version
expect_out 2 "no command given" -- "$ctl"
expect_out 2 "unknown command 'frob'" -- "$ctl" frob
expect_out 2 "list: ROOT is missing" -- "$ctl" list
expect_out 2 "unknown option '--jsn'" -- "$ctl" list "$root" --jsn
expect_out 2 "unexpected argument" -- "$ctl" show a b

# ---- status: no daemon ----
# Exit 3 (was 1) since issue 11: "no daemon" is told from other failures.
expect_out 3 "^ckptctl: no ckptd listening on '$tmp/none.sock' \(is the service running\?\)$" -- \
	"$ctl" -s "$tmp/none.sock" status
expect_out 3 "no ckptd listening on '$tmp/after.sock'" -- "$ctl" status -s "$tmp/after.sock"
CKPTD_SOCKET=$tmp/env.sock expect_out 3 "no ckptd listening on '$tmp/env.sock'" -- "$ctl" status
printf 'socket = %s/conf.sock\nroot = /tmp\n' "$tmp" >"$tmp/ckptd.conf"
env -u CKPTD_SOCKET "$ctl" -c "$tmp/ckptd.conf" status >"$tmp/out" 2>&1 || true
grep -q "no ckptd listening on '$tmp/conf.sock'" "$tmp/out" || fail "socket from -c: $(cat "$tmp/out")"
printf 'bogus = 1\n' >"$tmp/bad.conf"
env -u CKPTD_SOCKET "$ctl" -c "$tmp/bad.conf" status >"$tmp/out" 2>&1 && fail "bad -c accepted"
grep -q "$tmp/bad.conf:1: unknown key 'bogus'" "$tmp/out" || fail "bad -c message: $(cat "$tmp/out")"
env -u CKPTD_SOCKET "$ctl" -c "$tmp/missing.conf" status >"$tmp/out" 2>&1 && fail "missing -c accepted"
grep -q "$tmp/missing.conf: No such file" "$tmp/out" || fail "missing -c message: $(cat "$tmp/out")"

# ---- status: a stand-in daemon speaking the control protocol ----
# It answers one connection per entry of its script, then exits.
cat >"$tmp/fake.py" <<'EOF'
import json, os, socket, struct, sys

path, mode = sys.argv[1], sys.argv[2]
MAGIC, VERSION = 0x54504B43, 6
HELLO, HELLO_OK, ERROR, STATUS_REQ, STATUS_REPLY = 1, 2, 3, 10, 11
HDR = struct.Struct("<IHHII")
HELLO_SIZE = (HDR.size + 16 + 8 + 8 + 129 + 129 + 7) // 8 * 8   # struct proto_hello

def msg(t, body):
    return HDR.pack(MAGIC, VERSION, t, HDR.size + len(body), 0) + body

report = {
    "version": "0.1.0", "pid": 4242, "uptime_s": 3725.5,
    "config": {"socket": path, "roots": ["/data", "/scratch"], "arena_max": 4 << 30,
               "arena_total": 16 << 30, "uring_depth": 16, "commit_deadline_ms": 600000},
    "arena_bytes_total": 3 << 30,
    "clients": [{"id": 1, "pid": 456, "uid": 1000, "job": "llm-7b", "rank": 0, "world": 8,
                 "arena_bytes": 2 << 30, "slot_bytes": 64 << 20, "slots": 32,
                 "slots_in_use": 3},
                {"id": 2, "pid": 457, "uid": 1000, "job": "llm-7b", "rank": 1, "world": 8,
                 "arena_bytes": 1 << 30, "slot_bytes": 64 << 20, "slots": 16,
                 "slots_in_use": 0}],
    "saves": [{"job": "llm-7b", "name": "step-000400", "root": "/data", "world": 8,
               "state": "writing",
               "ranks": [{"rank": 0, "client": 1, "bytes": 1 << 30, "staged": 1 << 30,
                          "written": 1 << 29, "durable": False}],
               "bytes": 4 << 30, "staged": 3 << 30, "written": 1 << 30,
               "age_s": 1.25, "write_gibps": 1.9}],
    "totals": {"saves_committed": 3, "saves_failed": 1, "bytes_written": 12 << 30},
}

if mode == "new":
    # Fields of newer daemons, and an uptime as jansson prints a double.
    report["uptime_s"] = 43.101
    report["max_loop_stall_ms"] = 3.4
    report["totals"]["saves_refused"] = 2
    report["resident_bytes"] = 3 << 30
    report["resident"] = [{"job": "llm-7b", "uid": 1000, "rank": 3, "root": "/data",
                           "name": "step-000300", "step": 300, "attempt": "ab" * 16,
                           "bytes": 1536 << 20, "age_s": 75.0, "loads": 2}]

srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
srv.bind(path)
srv.listen(4)
print("ready", flush=True)
conn, _ = srv.accept()
hello = conn.recv(1024)
magic, ver, t, size, _ = HDR.unpack_from(hello)
role, rank, world, _, flags, _, arena = struct.unpack_from("<IIIIIIQ", hello, HDR.size)
job = hello[HDR.size + 32:].split(b"\0")[0]
assert (magic, ver, t, size, len(hello)) == (MAGIC, VERSION, HELLO, HELLO_SIZE, HELLO_SIZE), \
    (magic, ver, t, size, len(hello))
assert (role, rank, world, flags, arena, job) == (2, 0, 1, 0, 0, b"ckptctl"), \
    (role, rank, world, flags, arena, job)
if mode == "refuse":
    text = b"too many clients".ljust(512, b"\0")
    conn.send(msg(ERROR, struct.pack("<iI", -16, 0) + text))
    sys.exit(0)
conn.send(msg(HELLO_OK, struct.pack("<QQII512s", 0, 0, 7, 0, b"")))
req = conn.recv(1024)
assert HDR.unpack_from(req)[2] == STATUS_REQ and len(req) == HDR.size, req
data = json.dumps(report).replace('"uptime_s": 43.101,',
                                  '"uptime_s": 43.100999999999999,').encode()
fd = os.memfd_create("status")
os.write(fd, data + b"trailing bytes past len are not read")
socket.send_fds(conn, [msg(STATUS_REPLY, struct.pack("<Q", len(data)))], [fd])
conn.recv(1024)  # wait for ckptctl to hang up
EOF

start_fake() {
	# The last stand-in's "ready" must not be read for this one's: its
	# output file goes first (the redirection below is made by the child,
	# maybe after the loop has looked).
	rm -f "$tmp/d.sock" "$tmp/fake.out"
	"$py" "$tmp/fake.py" "$tmp/d.sock" "$1" >"$tmp/fake.out" 2>&1 &
	fake_pid=$!
	for _ in $(seq 100); do
		grep -q ready "$tmp/fake.out" 2>/dev/null && return 0
		sleep 0.05
	done
	cat "$tmp/fake.out"
	fail "stand-in daemon did not start"
}
stop_fake() {
	local rc=0
	wait "$fake_pid" || rc=$?
	fake_pid=
	[ "$rc" = 0 ] || {
		cat "$tmp/fake.out"
		fail "stand-in daemon saw a bad request"
	}
}

start_fake ok
expect_out 0 \
	"^ckptd 0\.1\.0, pid 4242, up 1h 2m$" \
	"^  roots +/data /scratch$" \
	"^  arenas +3\.0 GiB in use of 16\.0 GiB \(at most 4\.0 GiB per client\)$" \
	"commit deadline 10m$" \
	"^clients: 2$" \
	"^ +1 +456 +llm-7b +0/8 +2\.0 GiB +3/32$" \
	"^ +2 +457 +llm-7b +1/8 +1\.0 GiB +0/16$" \
	"^saves in flight: 1$" \
	"^  llm-7b +step-000400 +writing +3\.0 GiB +75% +1\.0 GiB +25% +1\.2s +1\.90 GiB/s$" \
	"of 4\.0 GiB, 8 rank\(s\), root /data" \
	"^totals: 3 committed, 1 failed, 12\.0 GiB written$" \
	-- "$ctl" -s "$tmp/d.sock" status
stop_fake

# A report without the newer fields prints without them.
start_fake ok
"$ctl" -s "$tmp/d.sock" status >"$tmp/out" 2>&1 || fail "status: $(cat "$tmp/out")"
stop_fake
if grep -Eq 'refused|stall|resident' "$tmp/out"; then fail "status invents fields: $(cat "$tmp/out")"; fi

start_fake new
expect_out 0 \
	"^ckptd 0\.1\.0, pid 4242, up 43\.1s$" \
	"^  loop +longest stall 3\.4 ms " \
	"^totals: 3 committed, 1 failed, 2 refused, 12\.0 GiB written$" \
	"^resident in memory: 1, 3\.0 GiB$" \
	"^  llm-7b +rank 3 +step 300 +1\.5 GiB  /data/step-000300 \(1m 15s old, 2 load\(s\)\)$" \
	-- "$ctl" -s "$tmp/d.sock" status
stop_fake

start_fake new
"$ctl" -s "$tmp/d.sock" status --json >"$tmp/status-new.json"
stop_fake
[ "$(wc -l <"$tmp/status-new.json")" = 1 ] || fail "status --json is not one line"
grep -q '"uptime_s":43.101,' "$tmp/status-new.json" ||
	fail "status --json uptime: $(cat "$tmp/status-new.json")"

start_fake ok
CKPTD_SOCKET=$tmp/d.sock "$ctl" status --json >"$tmp/status.json"
stop_fake
"$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["pid"] == 4242 and len(r["clients"]) == 2' \
	"$tmp/status.json" || fail "status --json"
if grep -q "trailing bytes" "$tmp/status.json"; then fail "read past len"; fi

start_fake refuse
expect_out 1 "^ckptctl: ckptd refused: too many clients \(Device or resource busy\)$" -- \
	"$ctl" -s "$tmp/d.sock" status
stop_fake

echo "ckptctl: all checks passed"
