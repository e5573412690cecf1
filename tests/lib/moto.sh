# shellcheck shell=bash
# tests/lib/moto.sh - sourced by the S3 test scripts: a moto server for the
# test (tests/tools/s3_fixture.py: 127.0.0.1, signatures checked).
#
#   moto_start PY DIR   starts it with its files in DIR and exports what it
#                       wrote (S3_ENDPOINT, S3_BUCKET, MOTO_PID, AWS_*), with
#                       AWS_ENDPOINT_URL_S3 = moto for libckpt's reader and
#                       instance metadata off; returns 1 if it did not start
#   moto_stop PY DIR    stops it (by the PID in DIR); never fails

moto_start() {
	local py=$1 dir=$2

	mkdir -p "$dir"
	"$py" tests/tools/s3_fixture.py start --dir "$dir" >/dev/null || return 1
	set -a
	# shellcheck disable=SC1091
	. "$dir/s3.env"
	set +a
	export AWS_EC2_METADATA_DISABLED=true
	export AWS_ENDPOINT_URL_S3=$S3_ENDPOINT
}

moto_stop() {
	"$1" tests/tools/s3_fixture.py stop --dir "$2" >/dev/null 2>&1 || true
}
