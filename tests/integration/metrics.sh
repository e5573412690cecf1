#!/usr/bin/env bash
# metrics.sh - ckptd's Prometheus metrics against a real daemon: the
# endpoint on 127.0.0.1 (port 0: found in the log and in the status) and the
# textfile, parsed with prometheus_client's parser, after one committed and
# one refused save: the counts, the bytes (the shard files' sizes), the
# phase histograms and the job's latest step; 404/405/400/431 answers; a
# scrape still answered while 100 KB of garbage, idle connections past the
# cap and an unfinished request are open; a non-loopback metrics_listen and
# a missing textfile directory refused at start-up; "last_commit" and
# "metrics" in the status report, and another user not seeing root's commit.
# Then a save to S3 (moto) through the spill tier: its bytes counted as
# spilled and as uploaded, and its upload timed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
py=${CKPT_TEST_PYTHON:-}
if [ -z "$py" ] || ! "$py" -c 'import prometheus_client, moto' 2>/dev/null; then
	echo "needs the test Python with prometheus_client and moto (scripts/pyenv.sh test)"
	exit 77
fi
for b in ckptd ckptctl examples/trainer; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done
probe=tests/tools/metrics_probe.py

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-metrics.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -d "$tmp/moto" ] && moto_stop "$py" "$tmp/moto"
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

# Another user reads the status too (visibility of last_commit).
chmod 755 "$tmp"
root=$tmp/root
mkdir -p "$root" "$tmp/state" "$tmp/prom" "$tmp/elsewhere"
root=$(cd "$root" && pwd -P)
sock=$tmp/ckptd.sock
textfile=$tmp/prom/ckptd.prom
base="socket = $sock
socket_mode = 0666
state_dir = $tmp/state
root = $root
arena_max = 64M
arena_total = 1G
o_direct = no"

# ---- refused at start-up: not loopback; a textfile with no directory ----
printf '%s\nmetrics_listen = 0.0.0.0:9\n' "$base" >"$tmp/bad.conf"
rc=0
timeout 20 "$build/ckptd" -c "$tmp/bad.conf" >"$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" = 78 ] || fail "metrics_listen = 0.0.0.0:9: exit $rc, want 78: $(cat "$tmp/bad.out")"
line=$(grep -c '' "$tmp/bad.conf")
grep -q "$tmp/bad.conf:$line: metrics_listen: '0.0.0.0:9': 0.0.0.0 is not a loopback address" \
	"$tmp/bad.out" || fail "non-loopback message: $(cat "$tmp/bad.out")"
[ ! -S "$sock" ] || fail "ckptd listened with a refused configuration"
rc=0
timeout 20 "$build/ckptd" -c /dev/null -r "$root" -s "$sock" -o "state_dir=$tmp/state" \
	-o "metrics_textfile=$tmp/absent/ckptd.prom" >"$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" = 78 ] || fail "textfile without a directory: exit $rc, want 78: $(cat "$tmp/bad.out")"
grep -q "metrics_textfile '$tmp/absent/ckptd.prom': directory '$tmp/absent': No such file" \
	"$tmp/bad.out" || fail "missing directory message: $(cat "$tmp/bad.out")"
for bad in 127.0.0.1 127.0.0.1:65536 '[::]:9' 10.0.0.1:9 ::1:9 localhost:-1; do
	rc=0
	out=$("$build/ckptd" --check-config -c /dev/null -r "$root" -s "$sock" \
		-o "metrics_listen=$bad" 2>&1) || rc=$?
	[ "$rc" = 78 ] || fail "metrics_listen=$bad: exit $rc: $out"
	grep -qF "metrics_listen: '$bad'" <<<"$out" || fail "metrics_listen=$bad: $out"
done
echo "ok: refused at start-up (non-loopback, bad ports, missing textfile directory)"

# ---- the daemon ----
printf '%s\nmetrics_listen = 127.0.0.1:0\nmetrics_textfile = %s\n' "$base" "$textfile" \
	>"$tmp/ckptd.conf"
"$build/ckptd" -c "$tmp/ckptd.conf" >"$tmp/ckptd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
	[ -S "$sock" ] && break
	kill -0 "${pids[0]}" 2>/dev/null || fail "ckptd exited"
	sleep 0.05
done
[ -S "$sock" ] || fail "ckptd did not listen"
addr=$(sed -n 's|.*metrics: serving http://\([0-9.]*:[0-9]*\)/metrics.*|\1|p' "$tmp/ckptd.log")
[ -n "$addr" ] || fail "no 'metrics: serving' line in the log"
host=${addr%:*}
port=${addr##*:}
if [ "$host" != 127.0.0.1 ] || [ "$port" -le 0 ]; then
	fail "bound to '$addr'"
fi
url=http://$addr/metrics

# ---- one committed save, one refused ----
"$build/examples/trainer" --socket "$sock" --root "$root" --job metrics-job --steps 1 --mib 8 \
	--save-every 1 --compute-ms 10 >"$tmp/trainer.log" 2>&1 || fail "trainer"
grep -q "step-000001 committed" "$tmp/trainer.log" || fail "step-000001 not committed"
bytes=$(stat -c %s "$root"/step-000001/rank-*.safetensors | awk '{s += $1} END {print s}')
[ "$bytes" -gt $((8 << 20)) ] || fail "shard bytes $bytes"
"$build/examples/trainer" --socket "$sock" --root "$tmp/elsewhere" --job metrics-job --steps 1 \
	--mib 1 --save-every 1 >"$tmp/refused.log" 2>&1 && fail "a root outside the allowed ones was accepted"
grep -q "not inside an allowed root" "$tmp/refused.log" || fail "refusal: $(cat "$tmp/refused.log")"

# check SOURCE COMMITTED LATEST_STEP: the parsed text holds what the daemon did.
check() {
	"$py" "$probe" samples "$1" >"$tmp/samples.json" || fail "parsing $1"
	"$py" - "$tmp/samples.json" "$bytes" "$2" "$3" <<'EOF' || fail "values of $1"
import json, sys
d = json.load(open(sys.argv[1]))
bytes_, committed, step = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
S = {}
for name, labels, value in d["samples"]:
    S[(name, tuple(sorted(labels.items())))] = value
def get(name, **labels):
    key = (name, tuple(sorted(labels.items())))
    assert key in S, "no sample %s%s" % key
    return S[key]
if d["content_type"] is not None:
    assert d["content_type"].startswith("text/plain; version=0.0.4"), d["content_type"]
types = d["types"]
for fam, t in [("ckptd_saves_total", "counter"), ("ckptd_save_phase_seconds", "histogram"),
               ("ckptd_bytes_written_total", "counter"), ("ckptd_latest_committed_step", "gauge"),
               ("ckptd_prune_deletions_total", "counter"), ("ckptd_prune_errors_total", "counter"),
               ("ckptd_arena_bytes_in_use", "gauge"), ("ckptd_arena_bytes_limit", "gauge"),
               ("ckptd_clients", "gauge"), ("ckptd_uptime_seconds", "gauge"),
               ("ckptd_loop_stall_max_seconds", "gauge")]:
    assert types.get(fam) == t, (fam, types.get(fam))
assert get("ckptd_saves_total", result="committed") == committed, S
# the refused root: refused at open, and so failed
assert get("ckptd_saves_total", result="failed") >= 1
assert get("ckptd_saves_total", result="refused") >= 1
# every save wrote its one shard whole, to the local disk only
assert get("ckptd_bytes_written_total", backend="local") == committed * bytes_, \
    (get("ckptd_bytes_written_total", backend="local"), committed, bytes_)
assert get("ckptd_bytes_written_total", backend="s3") == 0
assert get("ckptd_bytes_written_total", backend="spill") == 0
# one rank per committed save: staged, written and committed once each
for phase, n in [("stage", committed), ("write", committed), ("commit", committed),
                 ("upload", 0)]:
    assert get("ckptd_save_phase_seconds_count", phase=phase) == n, (phase, n)
    assert get("ckptd_save_phase_seconds_bucket", phase=phase, le="+Inf") == n
    assert get("ckptd_save_phase_seconds_sum", phase=phase) >= 0
assert get("ckptd_save_phase_seconds_bucket", phase="stage", le="600") == committed
assert get("ckptd_latest_committed_step", job="metrics-job") == step
assert not [k for k in S if k[0] == "ckptd_latest_committed_step" and
            k[1] != (("job", "metrics-job"),)], "other jobs' steps"
assert get("ckptd_prune_deletions_total") == 0 and get("ckptd_prune_errors_total") == 0
assert get("ckptd_arena_bytes_limit") == 1 << 30
assert 0 <= get("ckptd_arena_bytes_in_use") <= 1 << 30
# The trainers are gone; the textfile may be of the moment a save ended,
# with its trainer still connected.
assert get("ckptd_clients") == 0 or (d["content_type"] is None and get("ckptd_clients") == 1)
assert get("ckptd_uptime_seconds") > 0
assert get("ckptd_loop_stall_max_seconds") >= 0
EOF
}
# wait_for SOURCE EXPR: reads SOURCE until the Python EXPR holds (bounded),
# get(NAME, LABEL=VALUE...) being a sample's value (None if it has none).
wait_for() {
	local _
	for _ in $(seq 100); do
		"$py" "$probe" samples "$1" 2>/dev/null | "$py" -c '
import json, sys
S = {(n, tuple(sorted(l.items()))): v for n, l, v in json.load(sys.stdin)["samples"]}
get = lambda name, **labels: S.get((name, tuple(sorted(labels.items()))))
sys.exit(0 if eval(sys.argv[1]) else 1)' "$2" && return 0
		sleep 0.1
	done
	return 1
}
# The trainers' connections are closed once the daemon has seen them go.
wait_for "$url" 'get("ckptd_clients") == 0' || fail "clients still counted"
check "$url" 1 1
echo "ok: /metrics after one committed and one refused save ($bytes bytes)"

# The textfile follows the saves' ends (at a tick soon after).
wait_for "$textfile" 'get("ckptd_saves_total", result="committed") == 1 and (get(
	"ckptd_saves_total", result="failed") or 0) >= 1' || fail "the textfile does not follow"
check "$textfile" 1 1
[ "$(stat -c %a "$textfile")" = 644 ] || fail "textfile mode $(stat -c %a "$textfile")"
# Only the file stays (a write in flight has its temporary file a moment).
for _ in $(seq 50); do
	left=$(find "$tmp/prom" -mindepth 1 ! -name ckptd.prom)
	[ -z "$left" ] && break
	sleep 0.1
done
[ -z "$left" ] || fail "leftovers beside the textfile: $left"
echo "ok: the textfile says the same"

# ---- HTTP answers ----
# raw CASE STATUS: the hand-made request CASE gets the status line STATUS.
raw() {
	local out
	out=$("$py" "$probe" raw "$host" "$port" "$1") || fail "request '$1'"
	"$py" -c 'import json, sys; d = json.loads(sys.argv[1]); assert d["status"] == sys.argv[2], d' \
		"$out" "$2" || fail "request '$1': $out"
	printf '%s\n' "$out"
}
raw get "HTTP/1.1 200 OK" >/dev/null
raw query "HTTP/1.1 200 OK" >/dev/null
out=$(raw head "HTTP/1.1 200 OK")
"$py" -c 'import json, sys; d = json.loads(sys.argv[1]); h = d["headers"]
assert d["body_len"] == 0 and int(h["content-length"]) > 1000, d
assert h["content-type"].startswith("text/plain; version=0.0.4"), h' "$out" || fail "HEAD: $out"
raw notfound "HTTP/1.1 404 Not Found" >/dev/null
raw root "HTTP/1.1 404 Not Found" >/dev/null
out=$(raw post "HTTP/1.1 405 Method Not Allowed")
grep -q '"allow": "GET, HEAD"' <<<"$out" || fail "405 without Allow: $out"
raw delete "HTTP/1.1 405 Method Not Allowed" >/dev/null
for c in garbage http2 lowercase nospace version nolf; do
	raw "$c" "HTTP/1.1 400 Bad Request" >/dev/null
done
raw bighead "HTTP/1.1 431 Request Header Fields Too Large" >/dev/null
echo "ok: 404, 405 (Allow), 400 for garbage, 431 for a head over 8 KiB, HEAD"

# ---- hostile clients do not stop a scrape, nor the daemon ----
out=$("$py" "$probe" hostile "$host" "$port") || fail "hostile clients: $out"
"$py" -c 'import json, sys; d = json.loads(sys.argv[1])
assert d["status"] == "HTTP/1.1 200 OK" and d["saves"] and d["held"] == 22, d' "$out" ||
	fail "scrape beside hostile clients: $out"
kill -0 "${pids[0]}" 2>/dev/null || fail "ckptd died"
# A second save goes through as before, and the metrics follow it.
"$build/examples/trainer" --socket "$sock" --root "$root" --job metrics-job --steps 2 --mib 8 \
	--save-every 2 --compute-ms 10 >"$tmp/trainer2.log" 2>&1 || fail "second trainer"
grep -q "step-000002 committed" "$tmp/trainer2.log" || fail "step-000002 not committed"
[ "$(stat -c %s "$root"/step-000002/rank-*.safetensors | awk '{s += $1} END {print s}')" = "$bytes" ] ||
	fail "the second save's shard differs in size"
wait_for "$url" 'get("ckptd_clients") == 0' || fail "clients still counted"
check "$url" 2 2
echo "ok: a scrape answered beside 100 KB of garbage and 21 idle connections; saves go on"

# ---- the status report ----
# The last commit, to a directory whose name is not UTF-8 (JSON must be):
# the report still comes, the odd byte shown as '?'.
"$build/examples/trainer" --socket "$sock" --root "$root/odd-"$'\xff' --job odd-job --steps 3 \
	--mib 8 --save-every 3 --compute-ms 10 >"$tmp/trainer3.log" 2>&1 || fail "third trainer"
grep -q "step-000003 committed" "$tmp/trainer3.log" || fail "step-000003 not committed"
"$build/ckptctl" -s "$sock" status --json >"$tmp/status.json" 2>"$tmp/status.err" ||
	fail "status: $(cat "$tmp/status.err")"
"$py" - "$tmp/status.json" "$root/odd-?" "$bytes" "$addr" "$textfile" <<'EOF' || fail "status JSON"
import json, sys
st = json.loads(open(sys.argv[1]).read().splitlines()[0])
root, bytes_, addr, textfile = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
lc = st["last_commit"]
assert lc is not None, st
assert lc["root"] == root and lc["name"] == "step-000003" and lc["job"] == "odd-job", lc
assert lc["step"] == 3 and lc["bytes"] == bytes_, lc
assert isinstance(lc["age_s"], (int, float)) and 0 <= lc["age_s"] < 600, lc
assert set(lc) == {"root", "name", "job", "step", "bytes", "age_s"}, lc
assert st["metrics"] == {"listen": addr, "textfile": textfile}, st["metrics"]
EOF
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
	setpriv --reuid=65534 --regid=65534 --clear-groups "$build/ckptctl" -s "$sock" status \
		--json >"$tmp/status-other.json" 2>"$tmp/status.err" ||
		fail "status as another user: $(cat "$tmp/status.err")"
	"$py" -c 'import json, sys
st = json.loads(open(sys.argv[1]).read().splitlines()[0])
assert st["all_users"] is False and st["last_commit"] is None, st["last_commit"]' \
		"$tmp/status-other.json" || fail "another user sees root's last commit"
	echo "ok: status last_commit and metrics; another user sees no last_commit of root's"
else
	echo "ok: status last_commit and metrics (not root: other users' view not checked)"
fi

# ---- a clean stop ----
kill -TERM "${pids[0]}"
rc=0
wait "${pids[0]}" || rc=$?
pids=()
[ "$rc" = 0 ] || fail "ckptd exited $rc on SIGTERM"
echo "ok: a clean stop"

# ---- S3 through the spill tier ----
moto_start "$py" "$tmp/moto" || fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
mkdir -m 700 "$tmp/spill"
cat >"$tmp/spill.conf" <<CONF
socket = $sock
state_dir = $tmp/state
root = s3://$S3_BUCKET/metrics
s3_endpoint = $S3_ENDPOINT
s3_spill_dir = $tmp/spill
arena_max = 128M
metrics_listen = 127.0.0.1:0
CONF
"$build/ckptd" -c "$tmp/spill.conf" >"$tmp/ckptd-spill.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
	[ -S "$sock" ] && break
	kill -0 "${pids[0]}" 2>/dev/null || fail "ckptd (spill) exited"
	sleep 0.05
done
[ -S "$sock" ] || fail "ckptd (spill) did not listen"
addr=$(sed -n 's|.*metrics: serving http://\([0-9.]*:[0-9]*\)/metrics.*|\1|p' "$tmp/ckptd-spill.log")
[ -n "$addr" ] || fail "no 'metrics: serving' line in the spill daemon's log"
"$build/examples/trainer" --socket "$sock" --root "s3://$S3_BUCKET/metrics" --job spill-job \
	--steps 1 --mib 16 --save-every 1 --compute-ms 10 >"$tmp/trainer-spill.log" 2>&1 ||
	fail "trainer (spill)"
grep -q "step-000001 committed" "$tmp/trainer-spill.log" || fail "spilled step-000001 not committed"
# The node's copy stays in the spill cache: the shard's size.
sbytes=$(find "$tmp/spill" -path '*/cache/*' -name 'rank-*.safetensors' -exec stat -c %s {} + |
	awk '{s += $1} END {print s + 0}')
[ "$sbytes" -gt $((16 << 20)) ] || fail "no spilled shard in the cache ($sbytes bytes)"
"$py" "$probe" samples "http://$addr/metrics" >"$tmp/samples.json" || fail "parsing the spill scrape"
"$py" - "$tmp/samples.json" "$sbytes" <<'EOF' || fail "values of the spill scrape"
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
S = {(name, tuple(sorted(labels.items()))): v for name, labels, v in d["samples"]}
def get(name, **labels):
    return S[(name, tuple(sorted(labels.items())))]
assert get("ckptd_saves_total", result="committed") == 1
assert get("ckptd_saves_total", result="failed") == 0
assert get("ckptd_bytes_written_total", backend="spill") == n, \
    (get("ckptd_bytes_written_total", backend="spill"), n)
assert get("ckptd_bytes_written_total", backend="s3") == n
assert get("ckptd_bytes_written_total", backend="local") == 0
for phase in ("stage", "write", "upload", "commit"):
    assert get("ckptd_save_phase_seconds_count", phase=phase) == 1, phase
assert get("ckptd_latest_committed_step", job="spill-job") == 1
EOF
kill -TERM "${pids[0]}"
rc=0
wait "${pids[0]}" || rc=$?
pids=()
[ "$rc" = 0 ] || fail "ckptd (spill) exited $rc on SIGTERM"
echo "ok: a spilled S3 save counted as spilled and uploaded bytes, its upload timed"
echo "metrics: all checks passed"
