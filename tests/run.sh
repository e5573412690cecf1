#!/usr/bin/env bash
# tests/run.sh - runs the tests and prints one summary line.
#
#   tests/run.sh [--unit | --integration]
#
# Runs, in this order: every unit test program $BUILD/tests/check_X (one per
# tests/unit/check_X.c), every integration test program (tests/integration/
# check_X.c, and tests/gpu/check_X.c: real GPU, SKIP without one), then
# every tests/integration/*.sh script.  Build first (make
# tests-build); `make test` does both.
#
# Environment:
#   BUILD=dir          build directory (default build), relative to the repo
#   TESTS=a,b          run only tests whose name contains a or b
#   TEST_TIMEOUT=s     per-test time limit in seconds (default 600)
#   CK_DEFAULT_TIMEOUT Check's per-test-case limit (set to 60 here, not 4)
# Exported to the tests: BUILD, CKPT_BUILD_DIR (absolute $BUILD) and
# CKPT_TEST_PYTHON (a Python with the packages of scripts/requirements-
# test.txt; empty when it could not be made: tests needing it SKIP).
#
# Counting: a Check program adds its "Checks: N, Failures: F, Errors: E"
# (N - F - E passed, F + E failed); a program that crashes, times out, exits
# non-zero with no failure counted, or prints no summary adds one failure.
# A script passes with exit 0, is skipped with exit 77 (its last line of
# output is the reason), and fails otherwise.
#
# Skips inside a test: a test that cannot check what it is for on this
# machine (no GPU, no test Python, not root) prints one line starting
# "SKIP: " -- "SKIP: [NAME] reason", NAME naming the test -- on stdout or
# stderr, and returns without failing (as td_st_verify of tests/lib/testd.c
# does).  Such a test counts as skipped, not passed: for a Check program each
# distinct "SKIP: [NAME]" (or distinct SKIP line without a NAME) takes one of
# its passed checks, for a script exit 0 with a SKIP line is a skip.  The
# reasons are printed with the program's result.
#
# Last line: "N passed, F failed" (", S skipped" if any); exit 1 if F > 0.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

mode=all
for arg in "$@"; do
	case $arg in
	--unit) mode=unit ;;
	--integration) mode=integration ;;
	-h | --help)
		sed -n '2,37s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
		exit 0
		;;
	*)
		echo "run.sh: unknown option '$arg'" >&2
		exit 2
		;;
	esac
done

BUILD=${BUILD:-build}
if [ ! -d "$BUILD" ]; then
	echo "run.sh: build directory '$BUILD' does not exist: run 'make tests-build' first" >&2
	exit 1
fi
CKPT_BUILD_DIR=$(cd "$BUILD" && pwd)
export BUILD CKPT_BUILD_DIR
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-60}
timeout_s=${TEST_TIMEOUT:-600}

logdir=$CKPT_BUILD_DIR/test-logs
mkdir -p "$logdir"

if CKPT_TEST_PYTHON=$(scripts/pyenv.sh test 2>"$logdir/pyenv.log"); then
	:
else
	CKPT_TEST_PYTHON=
	echo "note: no test Python environment (see $logdir/pyenv.log); tests needing it will SKIP"
fi
export CKPT_TEST_PYTHON

passed=0
failed=0
skipped=0
failed_names=()

IFS=, read -r -a filters <<<"${TESTS:-}"

selected() {
	local f
	[ "${#filters[@]}" -eq 0 ] && return 0
	for f in "${filters[@]}"; do
		[ -n "$f" ] && [[ $1 == *"$f"* ]] && return 0
	done
	return 1
}

# Shows the end of a failed test's output, indented.
show_tail() {
	echo "    --- last lines of $1 ---"
	tail -n 40 "$1" | sed 's/^/    /'
}

fail() {
	failed=$((failed + $2))
	failed_names+=("$1")
}

# The skips a test reported in its log $1, one line each: every distinct
# "SKIP: [NAME]" once (its first line), and every other distinct SKIP line.
skip_lines() {
	grep -E '^SKIP: ' "$1" | awk '{
		key = $0
		if (match($0, /^SKIP: \[[^]]*\]/))
			key = substr($0, 1, RLENGTH)
		if (!(key in seen)) { seen[key] = 1; print }
	}'
}

# Why a command exited with status $1 (for 124: timed out; > 128: signal).
describe_status() {
	case $1 in
	124 | 137) echo "timed out after ${timeout_s}s" ;;
	*)
		if [ "$1" -gt 128 ]; then
			echo "crashed: signal $(($1 - 128)) ($(kill -l $(($1 - 128)) 2>/dev/null || echo '?'))"
		else
			echo "exit status $1"
		fi
		;;
	esac
}

run_check_prog() {
	local name=$1 bin=$2 log=$logdir/$1.log rc n f e line
	if [ ! -x "$bin" ]; then
		echo "FAIL: $name: $bin is not built"
		fail "$name" 1
		return
	fi
	# The subshell keeps bash's own "Segmentation fault" notice out of the
	# report: the crash is described below.
	(
		timeout -k 10 "$timeout_s" "$bin" >"$log" 2>&1 </dev/null
		exit $?
	) 2>/dev/null
	rc=$?
	n=0 f=0 e=0
	while IFS= read -r line; do
		if [[ $line =~ [0-9]+%:\ Checks:\ ([0-9]+),\ Failures:\ ([0-9]+),\ Errors:\ ([0-9]+) ]]; then
			n=$((n + BASH_REMATCH[1]))
			f=$((f + BASH_REMATCH[2]))
			e=$((e + BASH_REMATCH[3]))
		fi
	done <"$log"

	if [ "$rc" -eq 77 ] && [ "$n" -eq 0 ]; then
		echo "SKIP: $name: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
		skipped=$((skipped + 1))
		return
	fi
	# A check that said SKIP did not check what it is for: count it as
	# skipped (never more than the checks that passed).
	local skips=() s=0 ok=$((n - f - e))
	mapfile -t skips < <(skip_lines "$log")
	s=${#skips[@]}
	[ "$s" -gt "$ok" ] && s=$ok
	[ "$ok" -lt 0 ] && ok=0 s=0
	passed=$((passed + ok - s))
	skipped=$((skipped + s))
	if [ "$n" -eq 0 ]; then
		echo "FAIL: $name: no Check summary ($(describe_status "$rc"))"
		fail "$name" 1
		show_tail "$log"
	elif [ $((f + e)) -gt 0 ]; then
		echo "FAIL: $name: $f failure(s), $e error(s) of $n checks"
		fail "$name" $((f + e))
		grep -E '^[^:]+:[0-9]+:[EF]:' "$log" | head -n 40 | sed 's/^/    /'
		[ "$rc" -gt 128 ] && echo "    and then $(describe_status "$rc")"
	elif [ "$rc" -ne 0 ]; then
		# Every check passed but the program failed afterwards (a crash
		# at exit, a sanitizer report): that is a failure of its own.
		echo "FAIL: $name: $n checks passed, then $(describe_status "$rc")"
		fail "$name" 1
		show_tail "$log"
	elif [ "$s" -gt 0 ]; then
		echo "PASS: $name ($((n - s)) checks, $s skipped)"
	else
		echo "PASS: $name ($n checks)"
	fi
	for line in "${skips[@]}"; do
		echo "    $line"
	done
}

run_script() {
	local name=$1 script=$2 log=$logdir/$1.log rc
	(
		timeout -k 10 "$timeout_s" bash "$script" >"$log" 2>&1 </dev/null
		exit $?
	) 2>/dev/null
	rc=$?
	case $rc in
	0)
		local skip
		skip=$(skip_lines "$log" | head -n 1)
		if [ -n "$skip" ]; then
			echo "SKIP: $name: ${skip#SKIP: }"
			skipped=$((skipped + 1))
		else
			echo "PASS: $name"
			passed=$((passed + 1))
		fi
		;;
	77)
		echo "SKIP: $name: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
		skipped=$((skipped + 1))
		;;
	*)
		echo "FAIL: $name: $(describe_status "$rc")"
		fail "$name" 1
		show_tail "$log"
		;;
	esac
}

shopt -s nullglob

if [ "$mode" != integration ]; then
	for src in tests/unit/check_*.c; do
		name=$(basename "$src" .c)
		selected "$name" && run_check_prog "$name" "$BUILD/tests/$name"
	done
fi
if [ "$mode" != unit ]; then
	for src in tests/integration/check_*.c tests/gpu/check_*.c; do
		name=$(basename "$src" .c)
		selected "$name" && run_check_prog "$name" "$BUILD/tests/$name"
	done
	for script in tests/integration/*.sh; do
		name=$(basename "$script" .sh)
		selected "$name" && run_script "$name" "$script"
	done
fi

if [ $((passed + failed + skipped)) -eq 0 ]; then
	echo "run.sh: no test ran${TESTS:+ (TESTS=$TESTS matched nothing)}" >&2
	echo "0 passed, 1 failed"
	exit 1
fi

if [ "$failed" -gt 0 ]; then
	echo "failed: ${failed_names[*]} (logs in $logdir)"
fi
summary="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && summary="$summary, $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ]
