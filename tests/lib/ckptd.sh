# shellcheck shell=bash
# tests/lib/ckptd.sh - sourced by test scripts that start real ckptds and
# compare what is on disk or in S3 before and after.  The script defines
# $build (the build directory), $tmp (its private directory), an array
# pids (what its clean-up kills) and fail (prints and exits).
#
#   start NAME CONF [ENV=VALUE...]
#                 ckptd -c CONF (its socket $tmp/NAME.sock) with ENV set,
#                 log $tmp/NAME.log; waits (bounded) until it listens
#   digest DIR    every entry under DIR and every file's content digest
#   s3keys PREFIX every key under PREFIX in $S3_BUCKET with its ETag,
#                 sorted (with $py, the test Python, and moto_start's
#                 environment)

start() {
	local name=$1 conf=$2 p
	shift 2
	env "$@" "$build/ckptd" -c "$conf" -v >"$tmp/$name.log" 2>&1 &
	p=$!
	pids+=("$p")
	for _ in $(seq 400); do
		[ -S "$tmp/$name.sock" ] && return 0
		kill -0 "$p" 2>/dev/null || fail "ckptd $name exited"
		sleep 0.05
	done
	fail "ckptd $name did not listen"
}

digest() {
	(cd "$1" && find . -print | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z |
		xargs -0 sha256sum)
}

s3keys() {
	"$py" - "$S3_BUCKET" "$1" <<'PY'
import boto3, sys
s3 = boto3.client("s3")
pg = s3.get_paginator("list_objects_v2")
keys = ["%s %s" % (o["Key"], o["ETag"]) for p in pg.paginate(Bucket=sys.argv[1], Prefix=sys.argv[2])
        for o in p.get("Contents", [])]
print("\n".join(sorted(keys)))
PY
}
