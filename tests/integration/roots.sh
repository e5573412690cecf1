#!/usr/bin/env bash
# roots.sh - what a save's root may be, with a real ckptd (store.h root_open):
#   1. a root inside a checkpoint (the checkpoint itself, or below it) is
#      refused with a clear message, and the checkpoint stays byte for byte
#      with nothing added;
#   2. a root with a component ckptd keeps for its own (.ckpt-work-<id>,
#      .ckpt-trash-*, .ckpt-lease-*, .partial-*, manifest.json) is refused,
#      nothing is made, and `ckptctl list` shows no save in progress;
#   3. a client with umask 000: the directories the daemon makes for its
#      root are not writable by group or others;
#   4. the root swapped for a symbolic link out of the roots between the
#      daemon's check and its use (made deterministic with the test hook
#      CKPTD_TEST_GATE=DIR, daemon/testgate.h): no byte lands
#      outside the roots; the save goes into the directory that was checked;
#      a link inside the roots to a directory inside them still names it;
#   5. S3 (moto, when the test Python has it): 1 and 2 for s3:// roots, no
#      key made under a refused prefix.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib/moto.sh
. tests/lib/moto.sh
# shellcheck source=tests/lib/ckptd.sh
. tests/lib/ckptd.sh

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
for b in ckptd ckptctl tests/ckpt_save_one; do
	[ -x "$build/$b" ] || { echo "FAIL: $build/$b is not built"; exit 1; }
done
ctl=$build/ckptctl
save=$build/tests/ckpt_save_one
py=${CKPT_TEST_PYTHON:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-roots.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -n "$py" ] && moto_stop "$py" "$tmp/moto"
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	for l in "$tmp"/*.log; do
		[ -f "$l" ] && { echo "--- $l"; tail -n 30 "$l"; }
	done
	exit 1
}

# refused SOCK ROOT NAME WANT: a save that must fail, its message matching WANT.
refused() {
	local sock=$1 r=$2 n=$3 want=$4 out
	if out=$("$save" -s "$sock" -r "$r" -n "$n" --wait committed 2>&1); then
		fail "a save to '$r' was accepted: $out"
	fi
	grep -q -- "$want" <<<"$out" || fail "a save to '$r' failed unclearly: $out"
}

chmod 755 "$tmp"
mkdir -p "$tmp/root" "$tmp/outside" "$tmp/state" "$tmp/state2" "$tmp/hook"
root=$(cd "$tmp/root" && pwd -P)
outside=$(cd "$tmp/outside" && pwd -P)
cat >"$tmp/d.conf" <<CONF
socket = $tmp/d.sock
state_dir = $tmp/state
root = $root
arena_max = 64M
arena_total = 1G
o_direct = no
CONF
start d "$tmp/d.conf"
sock=$tmp/d.sock

# ---- 1. a root inside a checkpoint ----
"$save" -s "$sock" -r "$root/job" -n a --wait committed >/dev/null 2>"$tmp/err" ||
	fail "the first save: $(cat "$tmp/err")"
[ -f "$root/job/a/manifest.json" ] || fail "no checkpoint a"
digest "$root/job/a" >"$tmp/a.before"
refused "$sock" "$root/job/a" x "lies inside checkpoint '$root/job/a'"
refused "$sock" "$root/job/a/deeper/still" x "lies inside checkpoint '$root/job/a'"
digest "$root/job/a" | cmp -s - "$tmp/a.before" || fail "checkpoint a changed: $(find "$root/job/a")"
echo "ok: a root inside a checkpoint is refused; the checkpoint is untouched"

# ---- 2. reserved names ----
hex=0123456789abcdef0123456789abcdef
for r in "$root/.ckpt-work-$hex" "$root/job/.ckpt-work-$hex" "$root/job/.ckpt-trash-x/y" \
	"$root/job/.ckpt-lease-x" "$root/.partial-1" "$root/job/manifest.json" \
	"$root/job/.ckpt-pins"; do
	refused "$sock" "$r" x "is a name ckptd keeps for its own"
done
left=$(find "$root" -name '.ckpt-*' -o -name '.partial-*')
[ -z "$left" ] && [ ! -e "$root/job/manifest.json" ] || fail "refused roots were made: $left"
"$ctl" list "$root" --json >"$tmp/list.json" || fail "ckptctl list"
grep -q '"state":"in_progress"' "$tmp/list.json" && fail "a save in progress listed: $(cat "$tmp/list.json")"
[ "$(grep -c '"state":"committed"' "$tmp/list.json")" = 1 ] || fail "list: $(cat "$tmp/list.json")"
echo "ok: roots with reserved names are refused and nothing is made"

# ---- 3. umask 000 ----
(umask 000 && "$save" -s "$sock" -r "$root/open/deep/er" -n c --wait committed) >/dev/null \
	2>"$tmp/err" || fail "the save with umask 000: $(cat "$tmp/err")"
for d in open open/deep open/deep/er open/deep/er/c; do
	m=$(stat -c %a "$root/$d")
	[ $((8#$m & 8#022)) = 0 ] || fail "'$d' was made mode $m with a client's umask 000"
done
echo "ok: directories made for a client with umask 000 are not writable by others"

# ---- 4. the root swapped for a symbolic link between the check and its use ----
cat >"$tmp/p.conf" <<CONF
socket = $tmp/p.sock
state_dir = $tmp/state2
root = $root
arena_max = 64M
arena_total = 1G
o_direct = no
CONF
touch "$tmp/hook/root-open.hold"
start p "$tmp/p.conf" "CKPTD_TEST_GATE=$tmp/hook"
mkdir -p "$root/swap"
"$save" -s "$tmp/p.sock" -r "$root/swap" -n s --wait committed >"$tmp/race.out" 2>&1 &
saver=$!
pids+=("$saver")
for _ in $(seq 1200); do
	[ -e "$tmp/hook/root-open.waiting" ] && break
	kill -0 "$saver" 2>/dev/null || fail "the save ended before the pause: $(cat "$tmp/race.out")"
	sleep 0.05
done
[ -e "$tmp/hook/root-open.waiting" ] || fail "ckptd never paused at root-open"
mv "$root/swap" "$root/swap.old"
ln -s "$outside" "$root/swap"
rm "$tmp/hook/root-open.hold"
rc=0
wait "$saver" || rc=$?
[ -z "$(ls -A "$outside")" ] || fail "the save landed outside the roots: $(find "$outside")"
[ $rc = 0 ] || fail "the save failed: $(cat "$tmp/race.out")"
[ -f "$root/swap.old/s/manifest.json" ] || fail "the save is not in the directory checked: $(find "$root")"
echo "ok: a root swapped for a link after its check: nothing outside the roots"
# A link inside the roots to a directory inside them names that directory.
ln -s job "$root/alias"
"$save" -s "$sock" -r "$root/alias" -n via --wait committed >/dev/null 2>"$tmp/err" ||
	fail "a save through a link inside the roots: $(cat "$tmp/err")"
[ -f "$root/job/via/manifest.json" ] && [ -L "$root/alias" ] ||
	fail "a save through a link inside the roots went elsewhere: $(find "$root")"

# ---- 5. S3 ----
if [ -z "$py" ] || ! "$py" -c 'import moto, boto3' 2>/dev/null; then
	echo "SKIP: [s3] needs the test Python with moto and boto3 (scripts/pyenv.sh test)"
	exit 0
fi
moto_start "$py" "$tmp/moto" || fail "moto did not start: $(tail -n 5 "$tmp/moto/moto.log" 2>/dev/null)"
s3root="s3://$S3_BUCKET/r"
cat >"$tmp/s.conf" <<CONF
socket = $tmp/s.sock
state_dir = $tmp/state3
root = $s3root
s3_endpoint = $S3_ENDPOINT
arena_max = 64M
arena_total = 1G
CONF
mkdir -p "$tmp/state3"
start s "$tmp/s.conf"
"$save" -s "$tmp/s.sock" -r "$s3root/job" -n a --wait committed >/dev/null 2>"$tmp/err" ||
	fail "the first S3 save: $(cat "$tmp/err")"
s3keys r/ >"$tmp/s3.before"
grep -q '^r/job/a/manifest.json ' "$tmp/s3.before" || fail "no S3 checkpoint a: $(cat "$tmp/s3.before")"
refused "$tmp/s.sock" "$s3root/job/a" x "lies inside checkpoint 's3://$S3_BUCKET/r/job/a'"
refused "$tmp/s.sock" "$s3root/job/a/deeper" x "lies inside checkpoint 's3://$S3_BUCKET/r/job/a'"
for r in "$s3root/.ckpt-work-$hex" "$s3root/job/.ckpt-lease-x/y" "$s3root/.partial-2" \
	"$s3root/job/manifest.json"; do
	refused "$tmp/s.sock" "$r" x "is a name ckptd keeps for its own"
done
s3keys r/ | cmp -s - "$tmp/s3.before" ||
	fail "refused S3 saves changed the bucket: $(diff "$tmp/s3.before" <(s3keys r/))"
"$ctl" list "$s3root" --json >"$tmp/s3list.json" || fail "ckptctl list $s3root"
grep -q '"state":"in_progress"' "$tmp/s3list.json" && fail "S3: a save in progress listed"
echo "ok: S3 roots inside a checkpoint or with reserved names are refused; nothing is written"
