#!/usr/bin/env bash
# deps.sh - installs what ckptd needs to build, test and benchmark, when it
# is missing: Debian packages (apt-get), then the Python environments
# (scripts/pyenv.sh, cached outside the repository).
#
#   scripts/deps.sh                 build + test packages, the test Python env
#                                   and the one `make wheel` builds with
#   scripts/deps.sh --bench         also the bench Python env (torch: large)
#   scripts/deps.sh --check-build   only check the build packages: exit 1 and
#                                   name the missing ones; installs nothing
#   scripts/deps.sh --quiet         say something only when installing
#
# Runs apt-get as root, or through sudo when not root and sudo exists.  It
# installs only the packages that are missing (--no-upgrade: an installed
# package is never upgraded because it is listed here) and prints first what
# apt-get will install, including the dependencies it pulls in and any
# installed package it must upgrade for them.  It never runs upgrade or
# dist-upgrade.
set -euo pipefail

prog=deps.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

build_pkgs=(gcc make pkg-config liburing-dev libjansson-dev libisal-dev libsystemd-dev
	check libcurl4-openssl-dev)
# pkg-config names of the libraries above, for systems without dpkg.
build_pcs=(liburing jansson libisal libsystemd check libcurl)
# fio: the bench compares against it, and integration tests may use it.
test_pkgs=(python3 python3-venv fio awscli)

check_build=0
quiet=0
bench=0

usage() {
	sed -n '2,18s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

for arg in "$@"; do
	case $arg in
	--check-build) check_build=1 ;;
	--quiet | -q) quiet=1 ;;
	--bench) bench=1 ;;
	--help | -h)
		usage
		exit 0
		;;
	*)
		echo "$prog: unknown option '$arg'" >&2
		usage >&2
		exit 2
		;;
	esac
done

say() {
	[ "$quiet" = 1 ] || echo "$prog: $*"
}

# Prints the packages of "$@" that are not installed, one per line.
missing_pkgs() {
	local p
	for p in "$@"; do
		if ! dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
			echo "$p"
		fi
	done
}

have_dpkg=1
command -v dpkg-query >/dev/null 2>&1 || have_dpkg=0

if [ "$check_build" = 1 ]; then
	if [ "$have_dpkg" = 0 ]; then
		# Not Debian: ask pkg-config for the libraries instead.
		if ! command -v pkg-config >/dev/null 2>&1; then
			echo "$prog: missing: pkg-config (and cannot check the libraries without it)" >&2
			exit 1
		fi
		miss=()
		for p in "${build_pcs[@]}"; do
			pkg-config --exists "$p" || miss+=("$p")
		done
		if [ "${#miss[@]}" -gt 0 ]; then
			echo "$prog: missing libraries (pkg-config names): ${miss[*]}" >&2
			exit 1
		fi
		exit 0
	fi
	mapfile -t miss < <(missing_pkgs "${build_pkgs[@]}")
	if [ "${#miss[@]}" -gt 0 ]; then
		echo "$prog: missing build packages: ${miss[*]}" >&2
		exit 1
	fi
	exit 0
fi

if [ "$have_dpkg" = 1 ]; then
	mapfile -t miss < <(missing_pkgs "${build_pkgs[@]}" "${test_pkgs[@]}")
	if [ "${#miss[@]}" -gt 0 ]; then
		sudo=()
		if [ "$(id -u)" != 0 ]; then
			if command -v sudo >/dev/null 2>&1; then
				sudo=(sudo)
			else
				echo "$prog: missing packages: ${miss[*]}" >&2
				echo "$prog: not root and no sudo: run 'apt-get install ${miss[*]}' as root" >&2
				exit 1
			fi
		fi
		echo "$prog: missing packages: ${miss[*]}"
		export DEBIAN_FRONTEND=noninteractive
		"${sudo[@]}" apt-get update -q
		# Say exactly what will change before changing it: apt-get's
		# simulation lists each package to install ("Inst NAME (VER ...)")
		# and each installed one it must upgrade ("Inst NAME [OLD] (NEW
		# ...)") because a new package needs a newer version.
		apt_opts=(-y -q --no-upgrade --no-install-recommends)
		plan=$(apt-get install -s "${apt_opts[@]}" "${miss[@]}" 2>&1) || {
			printf '%s\n' "$plan" >&2
			echo "$prog: apt-get cannot install ${miss[*]}" >&2
			exit 1
		}
		new=$(awk '$1 == "Inst" && $3 !~ /^\[/ { printf "%s ", $2 }' <<<"$plan")
		upg=$(awk '$1 == "Inst" && $3 ~ /^\[/ { v = $4; sub(/^\(/, "", v); printf "%s (%s -> %s) ", $2, substr($3, 2, length($3) - 2), v }' <<<"$plan")
		echo "$prog: installing: ${new:-${miss[*]}}"
		if [ -n "$upg" ]; then
			echo "$prog: note: to satisfy their dependencies apt-get also upgrades these installed packages: $upg"
		fi
		"${sudo[@]}" apt-get install "${apt_opts[@]}" "${miss[@]}"
		mapfile -t still < <(missing_pkgs "${miss[@]}")
		if [ "${#still[@]}" -gt 0 ]; then
			echo "$prog: still missing after apt-get install: ${still[*]}" >&2
			exit 1
		fi
	else
		say "all Debian packages present"
	fi
else
	echo "$prog: no dpkg-query: not a Debian system; install by hand:" \
		"${build_pkgs[*]} ${test_pkgs[*]}" >&2
fi

# The test env and the wheel env (`make wheel`'s setuptools) are optional
# for building and for most tests: when one cannot be made (no network), the
# tests that need it say SKIP.  The bench env is what --bench was asked for,
# so its failure is an error.
if py=$("$here/pyenv.sh" test); then
	say "test Python: $py"
else
	echo "$prog: warning: no test Python environment; tests that need it will SKIP" >&2
fi
if py=$("$here/pyenv.sh" wheel); then
	say "wheel-building Python: $py"
else
	echo "$prog: warning: no Python environment to build wheels with; make wheel fails" \
		"and its test will SKIP" >&2
fi
if [ "$bench" = 1 ]; then
	py=$("$here/pyenv.sh" bench) || {
		echo "$prog: could not build the bench Python environment" >&2
		exit 1
	}
	say "bench Python: $py"
fi
