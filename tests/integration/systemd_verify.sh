#!/usr/bin/env bash
# systemd_verify.sh - the systemd files are valid and keep ckptd confined:
#  - `systemd-analyze verify` reports neither errors nor warnings on the
#    units (an unknown key is only a warning there, so any message about our
#    files fails), and the keys the design depends on are there;
#  - `systemd-analyze security --offline=true` rates ckptd.service 3.0 or
#    lower (its "Overall exposure level" line);
#  - the system call filter, worked out line by line from the sets of this
#    systemd (`systemd-analyze syscall-filter`), allows every call ckptd makes
#    and denies the credential and ownership calls it must not;
#  - ckptd.sysusers and ckptd.tmpfiles, applied to a private root, make the
#    user ckptd and the directories with the intended modes and owners;
#  - the roots of the shipped configuration are writable under the unit.
# Exit 77 (skip) when systemd-analyze is missing; a sub-check whose tool (or
# root) is missing prints "not checked" with the reason.  Nothing here can
# start the service: that needs systemd as PID 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "systemd-analyze not installed (package systemd)"
	exit 77
fi

MAX_EXPOSURE=3.0

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-systemd.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/units"

fail() {
	echo "FAIL: $*"
	exit 1
}

# ExecStart must name an existing executable: the built ckptd if there is
# one, else a stand-in (the daemon may not be built in this tree yet).
built=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}/ckptd
if [ -x "$built" ]; then
	ln -s "$built" "$tmp/bin/ckptd"
else
	printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/ckptd"
	chmod +x "$tmp/bin/ckptd"
	echo "note: $built not built; verifying with a stand-in binary"
fi

unit=$tmp/units/ckptd.service
sed -e "s|@BINDIR@|$tmp/bin|g" -e "s|@SYSCONFDIR@|/etc|g" systemd/ckptd.service.in >"$unit"
cp systemd/ckptd.socket "$tmp/units/ckptd.socket"
if grep -n '@[A-Z_]*@' "$unit"; then
	fail "unsubstituted placeholder left in ckptd.service"
fi

# ---- systemd-analyze verify ----
out=$tmp/verify.out
rc=0
systemd-analyze verify --man=no "$tmp/units/ckptd.socket" "$unit" >"$out" 2>&1 || rc=$?
cat "$out"
[ "$rc" -eq 0 ] || fail "systemd-analyze verify exited $rc"
if grep -q 'ckptd\.\(service\|socket\)' "$out"; then
	fail "systemd-analyze verify has something to say about our units"
fi

# Keys the design depends on (a typo would only be a warning, caught above,
# but a deleted line would not).
for want in 'Type=notify' 'LimitMEMLOCK=infinity' 'ProtectSystem=strict' \
	'NoNewPrivileges=yes' 'RuntimeDirectory=ckptd' 'Requires=ckptd.socket' \
	'User=ckptd' 'Group=ckptd' 'StateDirectory=ckptd/state' 'StateDirectoryMode=0700' \
	'SystemCallArchitectures=native' 'RestrictNamespaces=yes'; do
	grep -qx "$want" "$unit" || fail "ckptd.service lacks '$want'"
done
# Exactly these two capabilities, each key given once (a second line would
# add to the first).
for key in AmbientCapabilities CapabilityBoundingSet; do
	lines=$(grep -c "^$key=" "$unit" || true)
	[ "$lines" = 1 ] || fail "ckptd.service has $lines $key= lines, want 1"
	caps=$(sed -n "s/^$key=//p" "$unit" | tr ' ' '\n' | sed '/^$/d' | sort | tr '\n' ' ')
	[ "$caps" = "CAP_SETGID CAP_SETUID " ] ||
		fail "$key= is '$caps', want exactly CAP_SETUID CAP_SETGID"
done
grep -qx "ExecStart=$tmp/bin/ckptd -c /etc/ckptd/ckptd.conf" "$unit" ||
	fail "ExecStart is not '@BINDIR@/ckptd -c /etc/ckptd/ckptd.conf'"
grep -qx 'ListenSequentialPacket=/run/ckptd/ckptd.sock' systemd/ckptd.socket ||
	fail "ckptd.socket does not listen on /run/ckptd/ckptd.sock (SOCK_SEQPACKET)"
grep -qx 'SocketMode=0660' systemd/ckptd.socket || fail "ckptd.socket lacks 'SocketMode=0660'"
echo "verify: no message; required keys present"

# ---- systemd-analyze security ----
sec=$tmp/security.out
rc=0
systemd-analyze security --offline=true --no-pager "$unit" >"$sec" 2>&1 || rc=$?
grep -v '✓' "$sec" || true # the exposures left, for the log
[ "$rc" -eq 0 ] || fail "systemd-analyze security exited $rc"
level=$(sed -n 's/.*Overall exposure level for ckptd\.service: \([0-9][0-9.]*\).*/\1/p' "$sec")
[ -n "$level" ] || fail "no 'Overall exposure level' line in the security report"
if awk -v l="$level" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(l > m) }'; then
	fail "exposure level $level is above $MAX_EXPOSURE"
fi
echo "security: exposure level $level (at most $MAX_EXPOSURE)"

# ---- the system call filter ----
# expand NAME: appends the calls of a `systemd-analyze syscall-filter` set
# (nested sets included) to the array calls; a plain name stands for itself.
declare -A members=()
expand() {
	local name=$1 line
	if [[ $name != @* ]]; then
		calls+=("$name")
		return
	fi
	if [ -z "${members[$name]+x}" ]; then
		members[$name]=$(systemd-analyze syscall-filter --no-pager "$name" |
			sed -n 's/^ \{4\}\([@a-z0-9_-]*\)$/\1/p')
		[ -n "${members[$name]}" ] || fail "systemd-analyze knows no syscall set $name"
	fi
	while IFS= read -r line; do
		expand "$line"
	done <<<"${members[$name]}"
}

# Replays the SystemCallFilter= lines the way systemd reads them: the first
# decides allow or deny list (an allow list starts from @default); later
# lines add to or take from it, in order.  Prints "allow" or "deny", then
# the set, one call a line.
filter_set() {
	local mode='' value inv word call add
	local -A set=()
	while IFS= read -r value; do
		inv=0
		if [[ $value == ~* ]]; then
			inv=1
			value=${value#\~}
		fi
		calls=()
		if [ -z "$mode" ]; then
			if [ "$inv" = 1 ]; then
				mode=deny
			else
				mode=allow
				expand @default
			fi
		fi
		for word in $value; do
			expand "${word%%:*}" # NAME:ERRNO
		done
		# An allow list grows with allowed names, a deny list with denied.
		add=0
		case $mode/$inv in allow/0 | deny/1) add=1 ;; esac
		for call in ${calls[@]+"${calls[@]}"}; do
			if [ "$add" = 1 ]; then
				set[$call]=1
			else
				unset "set[$call]"
			fi
		done
	done < <(sed -n 's/^SystemCallFilter=//p' "$unit")
	echo "${mode:-none}"
	printf '%s\n' "${!set[@]}"
}

filter=$tmp/filter
filter_set >"$filter"
mode=$(head -n 1 "$filter")
[ "$mode" = allow ] || fail "SystemCallFilter= is not an allow list (it is '$mode')"
allowed() { tail -n +2 "$filter" | grep -qx "$1"; }

# What ckptd calls (seen with strace on saves, a status and a stop, run as a
# plain user with CAP_SETUID/CAP_SETGID), what the per-client file identity
# needs (setfsuid, setfsgid, setgroups; umask after unshare(CLONE_FS)) and
# what libcurl needs for S3 (connect, poll, sendto/recvfrom for DNS,
# socketpair for its resolver thread).
need='accept4 bind chmod clone clone3 close connect dup epoll_create1 epoll_ctl
epoll_pwait epoll_wait eventfd2 exit exit_group fallocate fcntl fdatasync
flock fstat fsync ftruncate futex getdents64 getegid geteuid getgroups
getpeername getrandom getsockname getsockopt io_uring_enter
io_uring_register io_uring_setup listen lseek madvise memfd_create mkdir
mkdirat mmap mprotect munmap newfstatat openat poll ppoll pread64
prlimit64 pwrite64 read recvfrom recvmsg renameat renameat2
rt_sigprocmask sendmsg sendto setfsgid setfsuid setgroups setsockopt
shutdown signalfd4 socket socketpair statx timerfd_create timerfd_settime
umask unlink unlinkat unshare write'
# Changing the real/effective ids, ownership or capabilities, and the rest of
# what a confined file writer never does.
deny='setuid setreuid setresuid setgid setregid setresgid chown fchown fchownat
lchown capset ptrace process_vm_readv process_vm_writev mount umount2 pivot_root
chroot init_module finit_module delete_module reboot kexec_load swapon
settimeofday clock_settime bpf perf_event_open setrlimit sched_setaffinity
set_mempolicy'
for call in $need; do
	allowed "$call" || fail "SystemCallFilter= denies $call, which ckptd uses"
done
for call in $deny; do
	if allowed "$call"; then
		fail "SystemCallFilter= allows $call"
	fi
done
echo "syscall filter: allows the $(wc -w <<<"$need") calls ckptd needs, denies $(wc -w <<<"$deny") others"

# ---- sysusers.d and tmpfiles.d, applied to a private root ----
grep -Eq '^u[[:space:]]+ckptd[[:space:]]' systemd/ckptd.sysusers ||
	fail "ckptd.sysusers does not create the user ckptd"
sysroot=$tmp/sysroot
mkdir -p "$sysroot/etc"
if ! command -v systemd-sysusers >/dev/null 2>&1; then
	echo "not checked: sysusers and tmpfiles entries (systemd-sysusers not installed)"
elif [ "$(id -u)" != 0 ]; then
	# Parsing still works without root: --dry-run writes nothing.
	systemd-sysusers --root="$sysroot" --dry-run - <systemd/ckptd.sysusers ||
		fail "systemd-sysusers --dry-run refused ckptd.sysusers"
	echo "sysusers: parses (dry run)"
	echo "not checked: tmpfiles entries (applying them needs root: they name owners)"
elif ! command -v systemd-tmpfiles >/dev/null 2>&1; then
	echo "not checked: sysusers and tmpfiles entries (systemd-tmpfiles not installed)"
else
	systemd-sysusers --root="$sysroot" - <systemd/ckptd.sysusers ||
		fail "systemd-sysusers refused ckptd.sysusers"
	pw=$(grep '^ckptd:' "$sysroot/etc/passwd") || fail "sysusers made no user ckptd"
	gr=$(grep '^ckptd:' "$sysroot/etc/group") || fail "sysusers made no group ckptd"
	IFS=: read -r _ _ uid gid _ _ shell <<<"$pw"
	if [ "$uid" -le 0 ] || [ "$uid" -ge 1000 ]; then
		fail "ckptd got uid $uid, not a system uid"
	fi
	[ "$gid" = "$(cut -d: -f3 <<<"$gr")" ] || fail "ckptd's primary group is not the group ckptd"
	case $shell in */nologin | */false) ;; *) fail "ckptd has a login shell: $shell" ;; esac
	echo "sysusers: system user ckptd, uid $uid, no login"

	systemd-tmpfiles --create --root="$sysroot" - <systemd/ckptd.tmpfiles ||
		fail "systemd-tmpfiles refused ckptd.tmpfiles"
	# path, then "mode uid:gid" as stat prints it.
	while read -r path want; do
		got=$(stat -c '%a %u:%g' "$sysroot$path" 2>/dev/null) || fail "tmpfiles did not create $path"
		[ "$got" = "$want" ] || fail "tmpfiles made $path '$got', want '$want'"
	done <<EOF
/run/ckptd 755 $uid:$gid
/var/lib/ckptd 755 0:0
/var/lib/ckptd/checkpoints 1777 0:0
/var/lib/ckptd/state 700 $uid:$gid
EOF
	echo "tmpfiles: /run/ckptd, the checkpoint root (1777) and the state directory (0700 ckptd)"
fi

# ---- the shipped configuration fits the unit ----
# ProtectSystem=strict: a root outside ReadWritePaths= fails every save with
# EROFS, so each `root` of the example config must lie below one of them.
rw=$(sed -n 's/^ReadWritePaths=//p' "$unit" | tr ' ' '\n' | sed 's/^-//; /^$/d')
n_roots=0
while read -r root; do
	n_roots=$((n_roots + 1))
	ok=0
	for p in $rw; do
		case $root/ in "$p"/*) ok=1 ;; esac
	done
	[ "$ok" = 1 ] || fail "root '$root' of ckptd.conf.example is not in ReadWritePaths= ($rw)"
	awk -v r="$root" '$1 == "d" && $2 == r { found = 1 } END { exit !found }' \
		systemd/ckptd.tmpfiles ||
		fail "root '$root' of ckptd.conf.example is not created by ckptd.tmpfiles"
done < <(sed -n 's/^[[:space:]]*root[[:space:]]*=[[:space:]]*\([^[:space:]#]*\).*/\1/p' \
	systemd/ckptd.conf.example)
[ "$n_roots" -gt 0 ] || fail "ckptd.conf.example sets no root"
# state_dir, when the example sets it, is the unit's StateDirectory=.
state=$(sed -n 's/^[[:space:]]*#\{0,1\}[[:space:]]*state_dir[[:space:]]*=[[:space:]]*\([^[:space:]#]*\).*/\1/p' \
	systemd/ckptd.conf.example | head -n 1)
if [ -n "$state" ] && [ "$state" != /var/lib/ckptd/state ]; then
	fail "state_dir of ckptd.conf.example is '$state', the unit's StateDirectory is /var/lib/ckptd/state"
fi
echo "config: its $n_roots root(s) are writable under the unit"
echo "units verified"
