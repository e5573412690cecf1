#!/usr/bin/env bash
# pyenv.sh NAME - prints the python of a ready virtual environment with the
# packages of scripts/requirements-NAME.txt (NAME: test, bench or wheel: the
# pinned setuptools `make wheel` builds with), making it first if needed.
#
# The environment lives outside the repository, in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/ckptd/venv-NAME-<hash>
# where <hash> is the first 12 hex digits of the SHA-256 of the requirements
# file: a fresh clone reuses it, and a change of pins makes a new one.  A
# marker file is written only once pip succeeded, so an environment left
# half-made by an interrupted or failed run is removed and rebuilt.
#
# stdout: the python path, nothing else.  Progress and errors: stderr.
# Exit status: 0, 1 (could not build it), 2 (usage).
set -euo pipefail

prog=pyenv.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
	echo "$prog: $*" >&2
	exit 1
}

if [ $# -ne 1 ]; then
	echo "usage: $prog test|bench|wheel" >&2
	exit 2
fi
name=$1
case $name in
test | bench | wheel) ;;
*)
	echo "usage: $prog test|bench|wheel" >&2
	exit 2
	;;
esac

req=$here/requirements-$name.txt
[ -r "$req" ] || die "missing $req"
# The system interpreter, not whatever python3 comes first on PATH (version
# managers, other installs): the env must not depend on the caller's shell.
base_python=/usr/bin/python3
[ -x "$base_python" ] || die "$base_python not found: install python3 and python3-venv (scripts/deps.sh)"

hash=$(sha256sum "$req" | cut -c1-12)
cache_home=${XDG_CACHE_HOME:-}
if [ -z "$cache_home" ]; then
	[ -n "${HOME:-}" ] || die "neither XDG_CACHE_HOME nor HOME is set"
	cache_home=$HOME/.cache
fi
cache=$cache_home/ckptd
env=$cache/venv-$name-$hash
marker=$env/.ckptd-complete
python=$env/bin/python

if [ -f "$marker" ] && [ -x "$python" ]; then
	echo "$python"
	exit 0
fi

mkdir -p "$cache" || die "cannot create $cache"

# Two builds of one env at once (parallel make, two shells) would trample
# each other: the second waits for the first, then finds the marker.
exec 9>"$cache/.lock-$name-$hash"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi
if [ -f "$marker" ] && [ -x "$python" ]; then
	echo "$python"
	exit 0
fi

echo "$prog: building the '$name' Python environment in $env (once)" >&2
rm -rf "$env"
log=$(mktemp "${TMPDIR:-/tmp}/ckptd-pyenv.XXXXXX")
trap 'rm -f "$log"' EXIT

if ! "$base_python" -m venv "$env" >"$log" 2>&1; then
	cat "$log" >&2
	rm -rf "$env"
	die "could not create a venv with $base_python -m venv (is python3-venv installed?)"
fi
if ! "$python" -m pip install --quiet --disable-pip-version-check --no-input \
	-r "$req" >"$log" 2>&1; then
	tail -n 30 "$log" >&2
	rm -rf "$env"
	die "pip install -r $req failed (see above); is PyPI reachable?"
fi
date -u +%Y-%m-%dT%H:%M:%SZ >"$marker"
echo "$prog: '$name' environment ready" >&2
echo "$python"
