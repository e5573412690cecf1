#!/usr/bin/env bash
# systemd_verify.sh - the systemd units and tmpfiles.d entry are valid:
# `systemd-analyze verify` reports neither errors nor warnings on them (an
# unknown key is only a warning there, so any message about our files
# fails), and the tmpfiles.d line creates /run/ckptd as intended.
# Exit 77 (skip) where systemd's tools are missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "systemd-analyze not installed (package systemd)"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-systemd.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/units"

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

sed -e "s|@BINDIR@|$tmp/bin|g" -e "s|@SYSCONFDIR@|/etc|g" systemd/ckptd.service.in >"$tmp/units/ckptd.service"
cp systemd/ckptd.socket "$tmp/units/ckptd.socket"
if grep -n '@[A-Z_]*@' "$tmp/units/ckptd.service"; then
	echo "FAIL: unsubstituted placeholder left in ckptd.service"
	exit 1
fi

out=$tmp/verify.out
rc=0
systemd-analyze verify --man=no "$tmp/units/ckptd.socket" "$tmp/units/ckptd.service" \
	>"$out" 2>&1 || rc=$?
cat "$out"
if [ "$rc" -ne 0 ]; then
	echo "FAIL: systemd-analyze verify exited $rc"
	exit 1
fi
if grep -q 'ckptd\.\(service\|socket\)' "$out"; then
	echo "FAIL: systemd-analyze verify has something to say about our units"
	exit 1
fi

# Keys the design depends on (a typo would only be a warning, caught above,
# but a deleted line would not).
for want in 'Type=notify' 'LimitMEMLOCK=infinity' 'ProtectSystem=strict' \
	'NoNewPrivileges=yes' 'RuntimeDirectory=ckptd' 'Requires=ckptd.socket'; do
	grep -qx "$want" "$tmp/units/ckptd.service" || {
		echo "FAIL: ckptd.service lacks '$want'"
		exit 1
	}
done
grep -qx "ExecStart=$tmp/bin/ckptd -c /etc/ckptd/ckptd.conf" "$tmp/units/ckptd.service" || {
	echo "FAIL: ExecStart is not '@BINDIR@/ckptd -c /etc/ckptd/ckptd.conf'"
	exit 1
}
grep -qx 'ListenSequentialPacket=/run/ckptd/ckptd.sock' systemd/ckptd.socket || {
	echo "FAIL: ckptd.socket does not listen on /run/ckptd/ckptd.sock (SOCK_SEQPACKET)"
	exit 1
}

# tmpfiles.d: create under a private root and look at the result (the
# entry names owner root, so only root can apply it).
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	mkdir -p "$tmp/sysroot"
	systemd-tmpfiles --create --root="$tmp/sysroot" - <systemd/ckptd.tmpfiles
	mode=$(stat -c %a "$tmp/sysroot/run/ckptd")
	if [ "$mode" != 755 ]; then
		echo "FAIL: tmpfiles made /run/ckptd with mode $mode, want 755"
		exit 1
	fi
else
	echo "note: tmpfiles entry not applied (needs root and systemd-tmpfiles)"
fi
echo "units verified"
