#!/usr/bin/env bash
# ckptctl_watch.sh - `ckptctl status` progress, `status --watch` and
# `ckptctl wait`, against a real ckptd:
#   - a save of world 2 where only rank 0 ever saves stays in flight (the
#     commit deadline is 10 minutes); status shows its bar, and --watch
#     shows it in a pseudo-terminal (redrawn in place with escapes, colour,
#     the cursor hidden and shown again), through a pipe and with NO_COLOR
#     or TERM=dumb (no escape byte at all, reports separated by a blank
#     line) and as JSON Lines (one object per report, with "time");
#   - SIGINT and SIGTERM end a watch with status 0, the last report whole;
#   - wait returns a checkpoint committed while it waits (by name and by
#     step, first by name among several of one step, a manifest rewritten
#     during the wait), times out with 4, fails with 1 on a missing or
#     vanishing root and 2 on a name that is never a checkpoint; a save in
#     flight, a corrupt manifest and a symlink are never committed ones;
#   - a stand-in daemon (tests/tools/status_standin.py) for exact figures:
#     rates over the age and between two reports, ETAs, rounding down, the
#     last commit (absent, null, set), hostile strings, a terminal too
#     short for the report, and a daemon that goes away (exit 3);
#   - the real daemon stopped under a watch: exit 3; plain status: 3;
#   - wait on an S3 root (moto, objects put with boto3): by name and step,
#     a work area and a corrupt manifest never count, a missing bucket and
#     a wrong secret fail, checkpoints that appear during the wait.
# Needs the system python3 (pty, standard library only); the S3 part the
# test Python with moto and boto3 (SKIP of that part without).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
ctl=$build/ckptctl
ckptd=$build/ckptd
saver=$build/tests/ckpt_save_one
for b in "$ctl" "$ckptd" "$saver"; do
	[ -x "$b" ] || { echo "FAIL: $b is not built"; exit 1; }
done
py=/usr/bin/python3
if [ ! -x "$py" ]; then
	echo "needs /usr/bin/python3 for its pseudo-terminal and stand-in daemon"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptctl-watch.XXXXXX")
pids=()
tpy=${CKPT_TEST_PYTHON:-}
moto_up=
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	if [ -n "$moto_up" ]; then
		moto_stop "$tpy" "$tmp/moto"
	fi
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
# bg CMD...: runs CMD in the background and remembers it for the trap.
bg() {
	"$@" &
	pids+=($!)
	last=$!
}
# bg_to OUT ERR CMD...: the same with stdout to OUT and stderr to ERR.
bg_to() {
	local out=$1 err=$2
	shift 2
	"$@" >"$out" 2>"$err" &
	pids+=($!)
	last=$!
}
# reap PID: waits for PID; its exit status in $rc.
reap() {
	rc=0
	wait "$1" || rc=$?
	local keep=()
	for p in "${pids[@]}"; do
		[ "$p" = "$1" ] || keep+=("$p")
	done
	pids=("${keep[@]+"${keep[@]}"}")
}
# until_file FILE PATTERN: waits (bounded) until FILE matches PATTERN.
until_file() {
	for _ in $(seq 200); do
		grep -Eq -- "$2" "$1" 2>/dev/null && return 0
		sleep 0.05
	done
	fail "$1 never showed /$2/: $(cat "$1" 2>/dev/null)"
}
no_escape() { # FILE: not one byte 0x1b
	if LC_ALL=C grep -q $'\x1b' "$1"; then
		fail "escape bytes in $1: $(LC_ALL=C grep -c $'\x1b' "$1") line(s)"
	fi
}

# pty ROWS COLS INT_AFTER OUT -- CMD...: runs CMD on a pseudo-terminal of
# ROWS x COLS, reading what it writes into OUT (bounded: 20 s); with
# INT_AFTER a regex, sends SIGINT once the output matches it.  Exits with
# CMD's exit status (or 124 when it had to be killed).
pty_py='
import fcntl, os, pty, re, select, signal, struct, sys, termios, time
rows, cols, int_after, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
argv = sys.argv[6:]
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    os.execv(argv[0], argv)
data, sent, deadline = b"", False, time.monotonic() + 20
while time.monotonic() < deadline:
    r, _, _ = select.select([fd], [], [], 0.2)
    if fd in r:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    if int_after and not sent and re.search(int_after.encode(), data):
        os.kill(pid, signal.SIGINT)
        sent = True
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    open(out, "wb").write(data)
    sys.exit(124)
open(out, "wb").write(data)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
'
pty() {
	local rows=$1 cols=$2 after=$3 out=$4
	shift 5
	"$py" -c "$pty_py" "$rows" "$cols" "$after" "$out" -- "$@"
}

# ---- a real daemon with a save that stays in flight ----
root=$tmp/root
sock=$tmp/d.sock
mkdir -p "$root" "$tmp/state"
cat >"$tmp/ckptd.conf" <<CONF
socket = $sock
state_dir = $tmp/state
root = $root
commit_deadline = 10m
o_direct = no
arena_max = 256M
arena_total = 1G
CONF
bg "$ckptd" -c "$tmp/ckptd.conf" 2>"$tmp/ckptd.log"
dpid=$last
for _ in $(seq 200); do
	[ -S "$sock" ] && break
	kill -0 "$dpid" 2>/dev/null || fail "ckptd exited"
	sleep 0.05
done
[ -S "$sock" ] || fail "ckptd did not listen"

# Rank 0 of 2 saves, waits until its bytes are on disk, and leaves; rank 1
# never comes.
out=$("$saver" -s "$sock" -r "$root" -n held --step 5 --world 2 --rank 0 --mib 8 \
	--wait durable) || fail "saver (held): $out"
[ "$out" = "durable held" ] || fail "saver said '$out'"

"$ctl" -s "$sock" status >"$tmp/once.out" 2>&1 || fail "status: $(cat "$tmp/once.out")"
grep -q '^saves in flight: 1$' "$tmp/once.out" || fail "no save in flight: $(cat "$tmp/once.out")"
grep -Eq '^  save-one +held +(writing|waiting) ' "$tmp/once.out" || fail "held's line"
# All of rank 0's 8 MiB (and the shard's header) written: a full bar,
# and no rate or ETA for bytes that are all there.
grep -Eq '^ +\[#{20}\] 100%  8\.0 MiB/8\.0 MiB written$' "$tmp/once.out" ||
	fail "held's bar: $(cat "$tmp/once.out")"
grep -Eq '^totals: 0 committed, 0 failed, 0 refused, 8\.0 MiB written$' "$tmp/once.out" ||
	fail "totals: $(cat "$tmp/once.out")"
no_escape "$tmp/once.out"

# ---- --watch through a pipe: plain text, reports apart ----
"$ctl" -s "$sock" status --watch --count 2 --interval 0.2 >"$tmp/pipe.out" 2>"$tmp/pipe.err" ||
	fail "watch through a pipe: $(cat "$tmp/pipe.err")"
no_escape "$tmp/pipe.out"
[ "$(grep -c '^status at [0-9-]* [0-9:]*, every 0\.2s$' "$tmp/pipe.out")" = 2 ] ||
	fail "not 2 reports: $(cat "$tmp/pipe.out")"
[ "$(grep -c '^ckptd ' "$tmp/pipe.out")" = 2 ] || fail "not 2 headers"
[ "$(grep -Ec '^ +\[#{20}\] 100%' "$tmp/pipe.out")" = 2 ] || fail "not 2 bars"
# The second report follows a blank line; the output ends with a report.
awk 'NR > 1 && prev == "" && /^status at / { n++ } { prev = $0 } END { exit n != 1 }' \
	"$tmp/pipe.out" ||
	fail "reports not separated by a blank line"
tail -n 1 "$tmp/pipe.out" | grep -q '^totals: ' || fail "last report cut"

# ---- --watch on a terminal ----
pty 60 160 "" "$tmp/tty.out" -- /usr/bin/env -u NO_COLOR TERM=xterm \
	"$ctl" -s "$sock" status --watch --count 2 --interval 0.2 || fail "watch on a pty: $?"
"$py" - "$tmp/tty.out" <<'EOF' || fail "watch on a pty: $(cat -v "$tmp/tty.out" | head -40)"
import re, sys
d = open(sys.argv[1], "rb").read()
assert d.startswith(b"\x1b[?25l\x1b[H\x1b[2J"), d[:40]      # hidden, home, cleared
assert d.count(b"\x1b[H") == 3, d.count(b"\x1b[H")            # the first clear + 2 redraws
assert d.count(b"status at ") == 2
assert d.rstrip(b"\r\n").endswith(b"\x1b[J\x1b[?25h"), d[-40:] # cursor shown again
assert b"\x1b[K\r\n" in d                                      # lines cleared to their end
# the bar in colour: green '#' x 20, then the colour reset
assert re.search(rb"\[\x1b\[32m#{20}\x1b\[0m\] 100%", d), d
assert b"held" in d
EOF
for envset in "NO_COLOR=1 TERM=xterm" "TERM=dumb"; do
	# shellcheck disable=SC2086
	pty 60 160 "" "$tmp/plain-tty.out" -- /usr/bin/env $envset \
		"$ctl" -s "$sock" status --watch --count 2 --interval 0.2 || fail "pty $envset: $?"
	no_escape "$tmp/plain-tty.out"
	[ "$(grep -c '^status at ' "$tmp/plain-tty.out")" = 2 ] || fail "pty $envset: not 2 reports"
done

# A terminal too short for the report: cut with a note, never scrolled.
pty 12 160 "" "$tmp/short.out" -- /usr/bin/env TERM=xterm \
	"$ctl" -s "$sock" status --watch --count 1 || fail "short pty"
grep -aq 'more line(s): a taller terminal shows them' "$tmp/short.out" ||
	fail "short pty: no note: $(cat -v "$tmp/short.out")"
[ "$(tr -cd '\n' <"$tmp/short.out" | wc -c)" -le 11 ] || fail "short pty: more lines than rows"

# ---- --json: one object per report ----
"$ctl" -s "$sock" status --watch --json --count 3 --interval 0.2 >"$tmp/watch.json" ||
	fail "watch --json"
"$py" - "$tmp/watch.json" <<'EOF' || fail "watch --json: $(cat "$tmp/watch.json")"
import json, re, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[-1] == "" and len(lines) == 4, lines
for l in lines[:3]:
    r = json.loads(l)
    assert isinstance(r["saves"], list) and [s["name"] for s in r["saves"]] == ["held"], r
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"]), r["time"]
times = [json.loads(l)["time"] for l in lines[:3]]
assert times == sorted(times), times
EOF
# -o json is the same; without --watch no "time" is added.
"$ctl" -s "$sock" status -o json >"$tmp/once.json"
"$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert "time" not in r and r["saves"]' \
	"$tmp/once.json" || fail "status -o json"

# ---- stopping a watch ----
bg_to "$tmp/int.out" "$tmp/int.err" "$ctl" -s "$sock" status --watch --interval 0.2
wpid=$last
until_file "$tmp/int.out" '^totals: '
kill -INT "$wpid"
reap "$wpid"
[ "$rc" = 0 ] || fail "SIGINT: exit $rc"
tail -n 1 "$tmp/int.out" | grep -q '^totals: ' || fail "SIGINT cut a report"
bg_to "$tmp/term.json" "$tmp/term.err" "$ctl" -s "$sock" status --watch --json --interval 0.1
wpid=$last
until_file "$tmp/term.json" '"time"'
sleep 0.3
kill -TERM "$wpid"
reap "$wpid"
[ "$rc" = 0 ] || fail "SIGTERM: exit $rc"
"$py" -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$tmp/term.json" ||
	fail "SIGTERM left half a JSON line"
pty 60 160 'totals: ' "$tmp/int-tty.out" -- /usr/bin/env TERM=xterm \
	"$ctl" -s "$sock" status --watch --interval 0.2 || fail "SIGINT on a pty: exit $?"
"$py" -c 'import sys
d = open(sys.argv[1], "rb").read().rstrip(b"^C\r\n")
assert d.endswith(b"\x1b[?25h")' "$tmp/int-tty.out" || fail "SIGINT on a pty left the cursor hidden"

# ---- usage ----
expect() { # RC PATTERN -- CMD...
	local want=$1 pat=$2 out rc=0
	shift 3
	out=$("$@" 2>&1) || rc=$?
	[ "$rc" = "$want" ] || fail "'$*' exited $rc, want $want: $out"
	grep -Eq -- "$pat" <<<"$out" || fail "'$*': output lacks /$pat/: $out"
}
expect 2 "--interval '0\.05' is out of range \(0\.1\.\.3600 seconds\)" -- \
	"$ctl" -s "$sock" status --watch --interval 0.05
expect 2 "--interval takes a number of seconds, not 'nan'" -- \
	"$ctl" -s "$sock" status --watch --interval nan
expect 2 "--interval takes a number of seconds, not '-1'" -- \
	"$ctl" -s "$sock" status --watch --interval=-1
expect 2 "--count '0' is out of range" -- "$ctl" -s "$sock" status --watch --count 0
expect 2 "--count takes a whole number, not '2x'" -- "$ctl" -s "$sock" status --watch --count 2x
expect 2 "--count needs a value" -- "$ctl" -s "$sock" status --watch --count
expect 2 "--interval and --count go with --watch" -- "$ctl" -s "$sock" status --count 2
expect 2 "unknown option '--watch'" -- "$ctl" list "$root" --watch
expect 0 "4 timed out \(wait\)" -- "$ctl" --help

# ---- wait ----
expect 2 "wait: ROOT is missing" -- "$ctl" wait
expect 2 "wait: NAME \(or --step N\) is missing" -- "$ctl" wait "$root"
expect 2 "wait: give NAME or --step N, not both" -- "$ctl" wait "$root" a --step 1
expect 2 "checkpoint name '\.ckpt-work-x' starts with '\.'" -- "$ctl" wait "$root" .ckpt-work-x
expect 2 "contains '/'" -- "$ctl" wait "$root" a/b
expect 2 "--timeout takes a number of seconds, not '1e3'" -- "$ctl" wait "$root" a --timeout 1e3
expect 2 "--step takes a whole number, not '-3'" -- "$ctl" wait "$root" --step -3
expect 1 "^ckptctl: wait: root '$tmp/nope' does not exist$" -- "$ctl" wait "$tmp/nope" a
touch "$tmp/file"
expect 1 "root '$tmp/file' is not a directory" -- "$ctl" wait "$tmp/file" a --timeout 0
# A save in flight is not committed; nor is a corrupt manifest, or a
# symlink to a checkpoint.
expect 4 "timed out \(500ms\): no committed checkpoint 'held' in '$root'" -- \
	"$ctl" wait "$root" held --timeout 0.5
expect 4 "timed out \(looked once\): no committed checkpoint of step 5 " -- \
	"$ctl" wait "$root" --step 5 --timeout 0
mkdir "$root/broken"
printf '{"format": "ckpt-1", ' >"$root/broken/manifest.json"
expect 4 "'broken' is there but not committed: manifest is not valid JSON" -- \
	"$ctl" wait "$root" broken --timeout 0

# Committed while it waits.
bg_to "$tmp/wait1.out" "$tmp/wait1.err" "$ctl" wait "$root" w1 --timeout 20
w1=$last
bg_to "$tmp/wait2.out" "$tmp/wait2.err" "$ctl" wait "$root" --step 11 --timeout 20 --json
w2=$last
sleep 0.3
kill -0 "$w1" 2>/dev/null || fail "wait w1 ended before the save: $(cat "$tmp/wait1.err")"
kill -0 "$w2" 2>/dev/null || fail "wait --step 11 ended before the save: $(cat "$tmp/wait2.err")"
out=$("$saver" -s "$sock" -r "$root" -n w1 --step 11 --wait committed) || fail "saver (w1): $out"
reap "$w1"
[ "$rc" = 0 ] || fail "wait w1: exit $rc: $(cat "$tmp/wait1.err")"
[ "$(cat "$tmp/wait1.out")" = w1 ] || fail "wait w1 printed '$(cat "$tmp/wait1.out")'"
reap "$w2"
[ "$rc" = 0 ] || fail "wait --step 11: exit $rc: $(cat "$tmp/wait2.err")"
[ "$(cat "$tmp/wait2.out")" = "{\"name\":\"w1\",\"step\":11,\"path\":\"$root/w1\"}" ] ||
	fail "wait --step 11 printed '$(cat "$tmp/wait2.out")'"
expect 0 '^w1$' -- "$ctl" wait "$root/" w1 --timeout 0
expect 4 "timed out" -- "$ctl" wait "$root" other --timeout 0.5
ln -s w1 "$root/alias"
expect 4 "no committed checkpoint 'alias'" -- "$ctl" wait "$root" alias --timeout 0
# Two of step 11: the first by name.
cp -r "$root/w1" "$root/a-copy"
expect 0 '^a-copy$' -- "$ctl" wait "$root" --step 11 --timeout 0
# A manifest replaced during a --step wait is read again.
bg_to "$tmp/wait3.out" "$tmp/wait3.err" "$ctl" wait "$root" --step 13 --timeout 20
w3=$last
sleep 0.5
"$py" - "$root/a-copy/manifest.json" <<'EOF'
import json, os, sys
m = json.load(open(sys.argv[1]))
m["step"] = 13
json.dump(m, open(sys.argv[1] + ".new", "w"))
os.rename(sys.argv[1] + ".new", sys.argv[1])
EOF
reap "$w3"
if [ "$rc" != 0 ] || [ "$(cat "$tmp/wait3.out")" != a-copy ]; then
	fail "wait --step 13: exit $rc: $(cat "$tmp/wait3.out" "$tmp/wait3.err")"
fi
# A root that goes away during the wait.
mkdir "$tmp/gone"
bg_to "$tmp/wait4.out" "$tmp/wait4.err" "$ctl" wait "$tmp/gone" x --timeout 20
w4=$last
sleep 0.3
rmdir "$tmp/gone"
reap "$w4"
[ "$rc" = 1 ] || fail "vanished root: exit $rc: $(cat "$tmp/wait4.err")"
grep -q "root '$tmp/gone' does not exist (any more)" "$tmp/wait4.err" ||
	fail "vanished root: $(cat "$tmp/wait4.err")"

# ---- the real daemon goes away under a watch ----
bg_to "$tmp/away.out" "$tmp/away.err" "$ctl" -s "$sock" status --watch --interval 0.2
wpid=$last
until_file "$tmp/away.out" '^totals: '
# With a save in flight a first SIGTERM waits for it (30 s); the second
# stops the daemon at once.  (While it waits, it accepts no connection.)
kill -TERM "$dpid"
until_file "$tmp/ckptd.log" 'stopping: finishing the saves'
kill -TERM "$dpid"
reap "$dpid"
[ "$rc" = 0 ] || fail "ckptd did not stop cleanly (exit $rc)"
reap "$wpid"
[ "$rc" = 3 ] || fail "watch of a daemon that went away: exit $rc: $(cat "$tmp/away.err")"
grep -q "ckptd went away after [0-9]* report(s)" "$tmp/away.err" ||
	fail "no 'went away': $(cat "$tmp/away.err")"
expect 3 "^ckptctl: no ckptd listening on '$sock' \(is the service running\?\)$" -- \
	"$ctl" -s "$sock" status
expect 3 "no ckptd listening" -- "$ctl" -s "$sock" status --watch --json --count 2

# ---- exact figures from a stand-in daemon ----
"$py" - "$tmp/reports.json" <<'EOF'
import json, sys
GiB, MiB = 1 << 30, 1 << 20
def report(age, written, uploaded, last_commit, **extra):
    r = {"version": "0.9.0", "pid": 4242, "uptime_s": 100.0,
         "config": {"socket": "/run/x.sock", "roots": ["/data"], "arena_max": 4 * GiB,
                    "arena_total": 16 * GiB, "uring_depth": 16, "commit_deadline_ms": 600000},
         "arena_bytes_total": GiB, "clients": [],
         "saves": [{"job": "llm-7b", "name": "step-000400", "root": "/data", "attempt": "a" * 32,
                    "step": 400, "world": 8, "state": "writing", "ranks": [],
                    "bytes": 4 * GiB, "staged": 4 * GiB, "written": written, "age_s": age,
                    "write_gibps": written / GiB / age},
                   {"job": "llm-7b", "name": "s3-save", "root": "s3://b/p", "attempt": "b" * 32,
                    "step": 7, "world": 1, "state": "writing", "ranks": [],
                    "bytes": GiB, "staged": GiB, "written": GiB, "s3_uploaded": uploaded,
                    "age_s": age + 1, "write_gibps": 0.5},
                   {"job": "evil\u001b[31mjob", "name": "almost", "root": "/data\u001b]0;x\u0007",
                    "attempt": "c" * 32, "step": 1, "world": 1, "state": "writing",
                    "ranks": [], "bytes": 1000, "staged": 1000, "written": 999, "age_s": 0.0}],
         "totals": {"saves_committed": 3, "saves_failed": 1, "bytes_written": 12 * GiB}}
    if last_commit != "absent":
        r["last_commit"] = last_commit
    r.update(extra)
    return r
lc = {"root": "/data", "name": "step-000300", "job": "llm-7b", "step": 300,
      "bytes": 1536 * MiB, "age_s": 12.0}
json.dump([report(1.0, GiB, 256 * MiB, None),
           report(3.0, 2 * GiB, 512 * MiB, lc),
           report(5.0, 3 * GiB, 768 * MiB, "absent"),
           report(5.5, 3 * GiB, 768 * MiB, "absent"),
           "[1, 2]"],
          open(sys.argv[1], "w"))
json.dump([report(1.0, GiB, 0, None), report(2.0, GiB, 0, None)],
          open(sys.argv[1] + ".2", "w"))
EOF
standin() { # REPORTS
	rm -f "$tmp/s.sock"
	bg "$py" tests/tools/status_standin.py "$tmp/s.sock" "$1" >"$tmp/standin.log" 2>&1
	spid=$last
	until_file "$tmp/standin.log" '^ready$'
}
standin "$tmp/reports.json"
"$ctl" -s "$tmp/s.sock" status --watch --count 3 --interval 0.1 >"$tmp/exact.out" 2>&1 ||
	fail "watch of the stand-in: $(cat "$tmp/exact.out")"
no_escape "$tmp/exact.out"
cat >"$tmp/exact.want" <<'EOF'
[#####---------------]  25%  1.0 GiB/4.0 GiB written  1.0 GiB/s  ETA 3.0s
[#####---------------]  25%  256.0 MiB/1.0 GiB uploaded  128.0 MiB/s  ETA 6.0s
[###################-]  99%  999 B/1000 B written
last commit: none since ckptd started
[##########----------]  50%  2.0 GiB/4.0 GiB written  512.0 MiB/s  ETA 4.0s
[##########----------]  50%  512.0 MiB/1.0 GiB uploaded  128.0 MiB/s  ETA 4.0s
[###################-]  99%  999 B/1000 B written  0 B/s
last commit: step-000300 step 300, 12.0s ago (job llm-7b, 1.5 GiB, root /data)
[###############-----]  75%  3.0 GiB/4.0 GiB written  512.0 MiB/s  ETA 2.0s
[###############-----]  75%  768.0 MiB/1.0 GiB uploaded  128.0 MiB/s  ETA 2.0s
[###################-]  99%  999 B/1000 B written  0 B/s
EOF
grep -E '^ *\[[#-]{20}\]|^last commit' "$tmp/exact.out" | sed 's/^ *//' >"$tmp/exact.got"
diff "$tmp/exact.want" "$tmp/exact.got" ||
	fail "stand-in figures differ (above): $(cat "$tmp/exact.out")"
# Hostile strings are shown with '?' for control bytes.
grep -q '^  evil?\[31mjob ' "$tmp/exact.out" || fail "hostile job name: $(cat -v "$tmp/exact.out")"
grep -q 'root /data?\]0;x?$' "$tmp/exact.out" || fail "hostile root: $(cat -v "$tmp/exact.out")"
# Once, the rate is the average over the save's age (3 GiB in 5.5 s); a
# report that is no JSON object fails with 1, not 3.
"$ctl" -s "$tmp/s.sock" status >"$tmp/exact4.out" 2>&1 || fail "status 4: $(cat "$tmp/exact4.out")"
grep -q '75%  3\.0 GiB/4\.0 GiB written  558\.5 MiB/s  ETA 1\.8s$' "$tmp/exact4.out" ||
	fail "one-shot rate over the age: $(cat "$tmp/exact4.out")"
if grep -q '^last commit' "$tmp/exact4.out"; then fail "last commit invented"; fi
expect 1 "is not a JSON object: wrong type" -- "$ctl" -s "$tmp/s.sock" status
reap "$spid"
[ "$rc" = 0 ] || fail "stand-in: $(cat "$tmp/standin.log")"

# A stand-in that goes away after its reports: the watch says so, exit 3.
standin "$tmp/reports.json.2"
"$ctl" -s "$tmp/s.sock" status --watch --interval 0.1 >"$tmp/gone.out" 2>"$tmp/gone.err" &&
	fail "watch outlived the stand-in"
rc=$?
[ "$rc" = 3 ] || fail "watch of a stand-in that went away: exit $rc: $(cat "$tmp/gone.err")"
[ "$(grep -c '^status at ' "$tmp/gone.out")" = 2 ] || fail "not 2 reports: $(cat "$tmp/gone.out")"
grep -q "ckptd went away after 2 report(s)" "$tmp/gone.err" || fail "gone: $(cat "$tmp/gone.err")"
reap "$spid"
[ "$rc" = 0 ] || fail "stand-in: $(cat "$tmp/standin.log")"

# ---- wait on an S3 root (moto; no daemon needed) ----
if [ -z "$tpy" ] || ! "$tpy" -c 'import moto, boto3' 2>/dev/null; then
	echo "SKIP: [s3 wait] needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	echo "ckptctl_watch: all other checks passed"
	exit 0
fi
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh
moto_start "$tpy" "$tmp/moto" || fail "moto did not start"
moto_up=1
s3root="s3://$S3_BUCKET/waits"
put() { # KEY FILE [STEP]: FILE (a manifest) as KEY of the bucket, its step set
	"$tpy" - "$S3_BUCKET" "$1" "$2" "${3:-}" <<'EOF'
import json, os, sys
import boto3
bucket, key, path, step = sys.argv[1:5]
body = open(path, "rb").read()
if step:
    m = json.loads(body)
    m["step"] = int(step)
    body = json.dumps(m).encode()
boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"]).put_object(
    Bucket=bucket, Key=key, Body=body)
EOF
}
man=$root/w1/manifest.json
printf '{"format": ' >"$tmp/bad.json"
put waits/w1/manifest.json "$man"
put "waits/.ckpt-work-$(printf 'ab%.0s' $(seq 16))/manifest.json" "$man" 12
put waits/bad/manifest.json "$tmp/bad.json"
expect 0 '^w1$' -- "$ctl" wait "$s3root" w1 --timeout 0
expect 0 "^\{\"name\":\"w1\",\"step\":11,\"path\":\"$s3root/w1\"\}$" -- \
	"$ctl" wait "$s3root/" --step 11 --timeout 0 --json
expect 4 "timed out \(looked once\): no committed checkpoint 'other' in '$s3root'" -- \
	"$ctl" wait "$s3root" other --timeout 0
expect 4 "no committed checkpoint of step 12" -- "$ctl" wait "$s3root" --step 12 --timeout 0
expect 4 "'bad' is there but not committed: manifest is not valid JSON" -- \
	"$ctl" wait "$s3root" bad --timeout 0
expect 1 "bucket 'no-such-bucket' does not exist" -- "$ctl" wait s3://no-such-bucket/x a
expect 1 "access denied" -- env AWS_SECRET_ACCESS_KEY=wrong "$ctl" wait "$s3root" w1
bg_to "$tmp/s3w1.out" "$tmp/s3w1.err" "$ctl" wait "$s3root" late --timeout 30
s1=$last
bg_to "$tmp/s3w2.out" "$tmp/s3w2.err" "$ctl" wait "$s3root" --step 21 --timeout 30 --json
s2=$last
sleep 0.5
kill -0 "$s1" 2>/dev/null || fail "S3 wait for 'late' ended early: $(cat "$tmp/s3w1.err")"
put waits/late/manifest.json "$man"
put waits/s21/manifest.json "$man" 21
reap "$s1"
[ "$rc" = 0 ] || fail "S3 wait for 'late': exit $rc: $(cat "$tmp/s3w1.err")"
[ "$(cat "$tmp/s3w1.out")" = late ] || fail "S3 wait printed '$(cat "$tmp/s3w1.out")'"
reap "$s2"
[ "$rc" = 0 ] || fail "S3 wait --step 21: exit $rc: $(cat "$tmp/s3w2.err")"
grep -q "^{\"name\":\"s21\",\"step\":21," "$tmp/s3w2.out" ||
	fail "S3 wait --step 21 printed '$(cat "$tmp/s3w2.out")'"

echo "ckptctl_watch: all checks passed"
