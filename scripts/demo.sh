#!/usr/bin/env bash
# demo.sh - start a private ckptd with a default local config, drive it with
# the sample trainer (examples/trainer.c), then show what ckptctl sees.
# Everything lives under $BUILD/demo and the daemon is stopped on exit.
#
# The trainer's options pass through: scripts/demo.sh --steps 80 --mib 512.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DEMO="$BUILD/demo"
SOCK="$DEMO/ckptd.sock"
ROOT="$(pwd)/$DEMO/checkpoints"
SHOW_LINES=30

rm -rf "$DEMO"
mkdir -p "$ROOT"
cat >"$DEMO/ckptd.conf" <<CONF
# ckptd configuration written by scripts/demo.sh
socket = $SOCK
root = $ROOT
state_dir = $(pwd)/$DEMO/state
arena_max = 512M
commit_deadline = 2m
CONF

"$BUILD/ckptd" -c "$DEMO/ckptd.conf" 2>"$DEMO/ckptd.log" &
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
