#!/usr/bin/env bash
# python.sh - the Python package's tests (python/tests, pytest) against
# this build's libckpt and real ckptd processes, with the test Python
# (scripts/requirements-test.txt: torch, torchdata, safetensors, pytest).
#
# A sanitized build (SANITIZE=...) skips them: its libckpt needs the
# sanitizer's runtime loaded before python itself, so the Python tests run
# in the plain build (`make test`), which CI runs too.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
build=${CKPT_BUILD_DIR:-$(pwd)/${BUILD:-build}}
py=${CKPT_TEST_PYTHON:-}
if [ -z "$py" ]; then
	echo "SKIP: no test Python environment (scripts/pyenv.sh test)"
	exit 77
fi
# (ldd's output matched whole: `ldd | grep -q` under pipefail could fail
# on ldd's SIGPIPE instead of matching.)
libs=$(ldd "$build/libckpt.so" 2>/dev/null || true)
if [[ $libs == *libasan* || $libs == *libtsan* || $libs == *libubsan* ]]; then
	echo "SKIP: sanitized build: the Python tests run in the plain build"
	exit 77
fi
if ! "$py" -c 'import torch, pytest' 2>/dev/null; then
	echo "SKIP: the test Python has no torch or pytest"
	exit 77
fi
export CKPT_BUILD_DIR=$build
export PYTHONPATH=$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}
# The package must not find a bundled libckpt of an earlier wheel build:
# tests run this build's.
export CKPTD_LIBCKPT=$build/libckpt.so
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-pytest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$py" -m pytest -q -p no:cacheprovider --timeout="${PYTEST_TIMEOUT:-600}" --basetemp="$tmp" \
	${PYTEST_ARGS:-} python/tests
