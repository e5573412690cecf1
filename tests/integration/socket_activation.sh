#!/usr/bin/env bash
# socket_activation.sh - ckptd started the way ckptd.socket starts it: under
# systemd-socket-activate, on a private SOCK_SEQPACKET socket and root made
# here.  Two `ckptctl status` in a row must both be answered (an inherited
# blocking socket used to stall the loop in its second accept4, so not even
# the first one was answered), SIGTERM must stop the daemon with status 0,
# and the socket file, which belongs to the activator, must still be there
# afterwards (ckptd.socket goes on listening on it).  The same as a plain
# user holding only CAP_SETUID and CAP_SETGID, as ckptd.service runs it.
# Then a datagram socket handed over instead must be refused at start-up
# with exit status 1.
# Every process started here is stopped by PID on every path.
# Exit 77 (skip) where systemd-socket-activate is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

bld=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
ckptd=$bld/ckptd
ctl=$bld/ckptctl
for b in "$ckptd" "$ctl"; do
	if [ ! -x "$b" ]; then
		echo "FAIL: $b is not built"
		exit 1
	fi
done
if ! command -v systemd-socket-activate >/dev/null 2>&1; then
	echo "systemd-socket-activate not installed (package systemd)"
	exit 77
fi

# Bounds for things that take milliseconds when they work; they only turn
# a hang into a failure.
ANSWER_S=10
EXIT_S=20

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-sockact.XXXXXX")
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	if [ -f "$tmp/log" ]; then
		echo "--- activator and daemon output ---"
		cat "$tmp/log"
	fi
	exit 1
}

sock=$tmp/ckptd.sock
mkdir "$tmp/root"
cat >"$tmp/ckptd.conf" <<EOF
socket = $sock
root = $tmp/root
state_dir = $tmp/state
o_direct = no
EOF

# start_activated ACTIVATOR_OPTION... [-- WRAPPER...]: systemd-socket-activate
# listens on $sock and, on the first connection, execs WRAPPER... ckptd
# (each wrapper execs the next): $pid is then the daemon's.  Returns once
# the socket exists.
start_activated() {
	local opts=() wrap=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		opts+=("$1")
		shift
	done
	[ $# -gt 0 ] && shift
	wrap=("$@")
	rm -f "$sock"
	systemd-socket-activate "${opts[@]}" -l "$sock" ${wrap[@]+"${wrap[@]}"} \
		"$ckptd" -c "$tmp/ckptd.conf" >"$tmp/log" 2>&1 </dev/null &
	pid=$!
	for _ in $(seq 100); do
		[ -S "$sock" ] && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	fail "systemd-socket-activate did not create '$sock'"
}

# wait_exit SECONDS: waits for $pid to exit and sets $rc to its status.
wait_exit() {
	local state
	for _ in $(seq $(($1 * 10))); do
		# A dead child stays a zombie ("Z") until waited for.
		state=$(sed 's/.*) //; s/ .*//' "/proc/$pid/stat" 2>/dev/null || echo gone)
		if [ "$state" = Z ] || [ "$state" = gone ]; then
			rc=0
			wait "$pid" || rc=$?
			pid=
			return 0
		fi
		sleep 0.1
	done
	fail "pid $pid still running ${1}s after it was told to stop"
}

# ---- a listening SOCK_SEQPACKET socket, as ckptd.socket passes it ----
start_activated --seqpacket
for i in 1 2; do
	rc=0
	out=$(timeout -k 2 "$ANSWER_S" "$ctl" -s "$sock" status --json 2>&1) || rc=$?
	if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		fail "status #$i got no answer within ${ANSWER_S}s (the daemon's loop is stuck)"
	fi
	[ "$rc" = 0 ] || fail "status #$i exited $rc: $out"
	# The activator execs ckptd in place: the pid answering is the one
	# signalled below.
	grep -Eq "\"pid\": *${pid}[,}[:space:]]" <<<"$out" ||
		fail "status #$i does not come from pid $pid: $out"
done
grep -q 'using the socket passed by systemd' "$tmp/log" ||
	fail "ckptd did not say it uses the inherited socket"

kill -TERM "$pid"
wait_exit "$EXIT_S"
[ "$rc" = 0 ] || fail "ckptd exited $rc after SIGTERM, want 0"
# The socket is the activator's (ckptd.socket keeps it and starts the
# service again on the next connection): the daemon must not unlink it.
[ -S "$sock" ] || fail "ckptd removed the activator's socket '$sock' when it stopped"
if grep -q '^<3>' "$tmp/log"; then
	fail "ckptd logged an error"
fi
echo "listening socket: two status answered, SIGTERM exit 0, socket kept"

# ---- as ckptd.service runs it: not root, CAP_SETUID/CAP_SETGID only ----
# setpriv stands in for User=, AmbientCapabilities=, CapabilityBoundingSet=,
# NoNewPrivileges= and UMask= of the unit (systemd itself cannot be run
# here); the socket still comes from the activator, made by root.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
	uid=$((40000 + $$ % 20000)) # a uid with no files anywhere else
	chmod 0755 "$tmp"
	chmod 1777 "$tmp/root"
	# Its own state directory, as StateDirectory= would give it.
	mkdir -p "$tmp/ustate"
	chown "$uid:$uid" "$tmp/ustate"
	chmod 0700 "$tmp/ustate"
	sed -i "s|^state_dir = .*|state_dir = $tmp/ustate|" "$tmp/ckptd.conf"
	chmod 0644 "$tmp/ckptd.conf"
	start_activated --seqpacket -- \
		setpriv --reuid="$uid" --regid="$uid" --clear-groups \
		--inh-caps=-all,+setuid,+setgid --ambient-caps=-all,+setuid,+setgid \
		--bounding-set=-all,+setuid,+setgid --no-new-privs \
		sh -c 'umask 077 && exec "$@"' sh
	rc=0
	out=$(timeout -k 2 "$ANSWER_S" "$ctl" -s "$sock" status --json 2>&1) || rc=$?
	[ "$rc" = 0 ] || fail "status to the unprivileged ckptd exited $rc: $out"
	grep -q "^Uid:[[:space:]]*${uid}[[:space:]]" "/proc/$pid/status" ||
		fail "pid $pid does not run as uid $uid"
	grep -q '^CapEff:[[:space:]]*00000000000000c0$' "/proc/$pid/status" ||
		fail "pid $pid has other capabilities than CAP_SETUID and CAP_SETGID"
	kill -TERM "$pid"
	wait_exit "$EXIT_S"
	[ "$rc" = 0 ] || fail "the unprivileged ckptd exited $rc after SIGTERM, want 0"
	echo "as a plain user with CAP_SETUID/CAP_SETGID: status answered, SIGTERM exit 0"
else
	echo "note: unprivileged sub-check not run: needs root and setpriv (util-linux)"
fi

# ---- the wrong kind of socket: ckptd must refuse it, not serve it ----
if command -v logger >/dev/null 2>&1; then
	start_activated --datagram
	# The first datagram is what makes the activator exec ckptd.
	logger -d -u "$sock" 'wake up' || fail "could not send a datagram to '$sock'"
	wait_exit "$EXIT_S"
	[ "$rc" = 1 ] || fail "ckptd exited $rc on a datagram socket, want 1"
	grep -q 'is not a listening SOCK_SEQPACKET Unix socket' "$tmp/log" ||
		fail "ckptd did not say why it refused the datagram socket"
	echo "datagram socket: refused at start-up, exit 1"
else
	echo "note: datagram sub-check not run: logger (util-linux) is not installed"
fi
echo "socket activation works"
