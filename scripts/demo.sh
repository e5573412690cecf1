#!/usr/bin/env bash
# demo.sh - start a private ckptd with a default local config, drive it with
# the sample trainer (examples/trainer.c), then show what ckptctl sees.
# Everything lives under $BUILD/demo and the daemon is stopped on exit.
#
# The trainer's options pass through: scripts/demo.sh --steps 80 --mib 512.
#
# scripts/demo.sh --serve starts the same daemon with the same config and
# leaves it running, for a trainer of your own (the Python example of the
# README); it prints shell assignments of its socket, root and PID:
#   eval "$(scripts/demo.sh --serve)"    # CKPTD_SOCKET, CKPT_ROOT, CKPTD_PID
#   python3 my_trainer.py                # ckptd finds the socket in $CKPTD_SOCKET
#   kill "$CKPTD_PID"
# CKPT_DEMO_DIR=DIR puts the demo's files (config, socket, log, checkpoints)
# in DIR instead of $BUILD/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
serve=0
if [ "${1:-}" = --serve ]; then
	serve=1
	shift
	if [ $# -gt 0 ]; then
		echo "demo.sh: --serve takes no other option" >&2
		exit 2
	fi
fi
DEMO=$(realpath -m "${CKPT_DEMO_DIR:-$BUILD/demo}")
SOCK="$DEMO/ckptd.sock"
ROOT="$DEMO/checkpoints"
SHOW_LINES=30

# The demo starts afresh in its directory: one named by CKPT_DEMO_DIR is
# emptied only if it is empty or an earlier demo's.
if [ -n "${CKPT_DEMO_DIR:-}" ] && [ -n "$(ls -A "$DEMO" 2>/dev/null)" ] &&
	! grep -qs '^# ckptd configuration written by scripts/demo.sh$' "$DEMO/ckptd.conf"; then
	echo "demo.sh: CKPT_DEMO_DIR=$DEMO holds files of something else: name an empty" \
		"or new directory" >&2
	exit 2
fi
rm -rf "$DEMO"
mkdir -p "$ROOT"
cat >"$DEMO/ckptd.conf" <<CONF
# ckptd configuration written by scripts/demo.sh
socket = $SOCK
root = $ROOT
state_dir = $DEMO/state
arena_max = 512M
commit_deadline = 2m
CONF

# Nothing of the daemon's holds this script's stdout: under --serve the
# caller reads it to its end, which must come when this script exits.
"$BUILD/ckptd" -c "$DEMO/ckptd.conf" </dev/null >"$DEMO/ckptd.log" 2>&1 &
PID=$!
stop() {
	if kill -0 "$PID" 2>/dev/null; then
		kill -TERM "$PID" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$PID" 2>/dev/null || true
	fi
	wait "$PID" 2>/dev/null || true
}
trap stop EXIT

for _ in $(seq 100); do
	[ -S "$SOCK" ] && break
	kill -0 "$PID" 2>/dev/null || {
		echo "ckptd exited; its log:" >&2
		cat "$DEMO/ckptd.log" >&2
		exit 1
	}
	sleep 0.1
done
[ -S "$SOCK" ] || {
	echo "ckptd did not come up; its log:" >&2
	cat "$DEMO/ckptd.log" >&2
	exit 1
}
if [ "$serve" = 1 ]; then
	trap - EXIT
	printf 'CKPTD_SOCKET=%q\nCKPT_ROOT=%q\nCKPTD_PID=%d\nexport CKPTD_SOCKET CKPT_ROOT CKPTD_PID\n' \
		"$SOCK" "$ROOT" "$PID"
	echo "demo.sh: ckptd (pid $PID) listens on $SOCK, checkpoints under $ROOT," \
		"log $DEMO/ckptd.log; stop it with: kill $PID" >&2
	exit 0
fi
echo "== ckptd (pid $PID) listening on $SOCK, checkpoints under $ROOT"
echo
echo "== sample trainer: training goes on while each checkpoint is copied and written"
"$BUILD/examples/trainer" --socket "$SOCK" --root "$ROOT" --job demo "$@"

echo
echo "== ckptctl status"
"$BUILD/ckptctl" -s "$SOCK" status
echo
echo "== ckptctl list $ROOT"
"$BUILD/ckptctl" list "$ROOT"
last=$(find "$ROOT" -mindepth 2 -maxdepth 2 -name manifest.json -printf '%h\n' | sort | tail -n 1)
echo
echo "== ckptctl show $last"
out=$("$BUILD/ckptctl" show "$last")
total=$(printf '%s\n' "$out" | wc -l)
printf '%s\n' "$out" | head -n "$SHOW_LINES"
if [ "$total" -gt "$SHOW_LINES" ]; then
	echo "... $((total - SHOW_LINES)) more lines not shown; see them all with:"
	echo "    $BUILD/ckptctl show $last"
fi
echo
echo "== daemon log (last lines)"
tail -n 8 "$DEMO/ckptd.log"
