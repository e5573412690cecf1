#!/usr/bin/env bash
# ckptctl_prune.sh - `ckptctl prune ROOT --dry-run`: the retention plan of a
# root made here (committed checkpoints with steps, commit times and a loss
# metric, a pin list, a work area, a corrupt and an incomplete checkpoint),
# as the KEEP/REMOVE table and as JSON Lines; the refusal (exit 6) and
# --force; a corrupt checkpoint left out with exit 5; symbolic links and
# bad commit times never candidates; pins naming nothing reported; that
# nothing on disk changes; bad rules (exit 2).  Needs only the system python3
# (standard library).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

ctl=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}/ckptctl
if [ ! -x "$ctl" ]; then
	echo "FAIL: $ctl is not built"
	exit 1
fi
py=/usr/bin/python3
if [ ! -x "$py" ]; then
	echo "needs /usr/bin/python3 for its fixtures"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptctl-prune.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root

fail() {
	echo "FAIL: $*"
	exit 1
}

# Six committed checkpoints, one a day, losses 0.9 0.5 0.7 0.2 0.8 0.6; one
# without the metric; step-000100 pinned.
"$py" - "$root" <<'PY'
import json, os, sys
root = sys.argv[1]
def ck(name, step, day, metrics):
    d = os.path.join(root, name)
    os.makedirs(d)
    man = {"format": "ckpt-1", "name": name, "step": step,
           "time": "2026-11-%02dT03:00:00Z" % day, "job": "j", "world_size": 1,
           "crc_block": 1048576, "metadata": {}, "metrics": metrics, "files": [],
           "total_bytes": 0, "tensors": {}, "blobs": {}}
    json.dump(man, open(os.path.join(d, "manifest.json"), "w"))
for i, loss in enumerate([0.9, 0.5, 0.7, 0.2, 0.8, 0.6]):
    ck("step-%06d" % ((i + 1) * 100), (i + 1) * 100, 10 + i, {"loss": loss})
ck("step-000050", 50, 9, {})
os.makedirs(os.path.join(root, ".ckpt-work-0123456789abcdef0123456789abcdef"))
# A checkpoint elsewhere, with a greater step, linked into the root: never a
# candidate (it would take "newest" from the root's own), nor an alias.
ck("../elsewhere/far", 9000, 20, {"loss": 0.0})
os.symlink(os.path.join(root, "..", "elsewhere", "far"), os.path.join(root, "zz-link"))
os.symlink("step-000600", os.path.join(root, "alias-600"))
# A manifest whose time is no real date: never a candidate.
ck("bad-time", 700, 17, {})
p = os.path.join(root, "bad-time", "manifest.json")
m = json.load(open(p)); m["time"] = "2026-02-31T03:00:00Z"; json.dump(m, open(p, "w"))
os.makedirs(os.path.join(root, "broken"))
open(os.path.join(root, "broken", "manifest.json"), "w").write("{")
os.makedirs(os.path.join(root, "half-done"))
open(os.path.join(root, "half-done", "rank-00000.safetensors"), "w").write("x")
open(os.path.join(root, ".ckpt-pins"), "w").write("# kept for the paper\nstep-000100\n\nno-such\n")
PY
before=$(cd "$tmp" && find root | sort | xargs stat -c '%n %s %Y')

# ---- the table (exit 5: the corrupt and the bad-time checkpoints are left out) ----
rc=0
out=$("$ctl" prune "$root" --dry-run --keep-last 2 --keep-best 1 loss min 2>"$tmp/err") || rc=$?
[ "$rc" = 5 ] || fail "prune: exit $rc, want 5: $(cat "$tmp/err")"
want='KEEP step-000050 50 -
KEEP step-000100 100 pinned
REMOVE step-000200 200 -
REMOVE step-000300 300 -
KEEP step-000400 400 best
KEEP step-000500 500 last
KEEP step-000600 600 newest,last,last-commit'
# step-000050 has no loss: unranked, removed.
want=${want/KEEP step-000050 50 -/REMOVE step-000050 50 -}
got=$(awk '$1 == "KEEP" || $1 == "REMOVE" { print $1, $2, $3, $5 }' <<<"$out")
[ "$got" = "$want" ] || fail "prune table:
$got
want:
$want
full output:
$out"
grep -q '^policy: keep_last 2, keep_best 1 loss min$' <<<"$out" || fail "policy line: $out"
grep -q '^3 of 7 checkpoints would be removed (dry run: nothing was removed)$' <<<"$out" ||
	fail "summary: $out"
grep -q "'broken' is not a candidate (never removed): manifest is not valid JSON" "$tmp/err" ||
	fail "corrupt checkpoint not reported: $(cat "$tmp/err")"
grep -q "'bad-time' is not a candidate (never removed): its manifest's time" "$tmp/err" ||
	fail "bad time not reported: $(cat "$tmp/err")"
grep -q "2 entries of the root could not be read" "$tmp/err" || fail "no degraded note: $(cat "$tmp/err")"
grep -q "names 'no-such', which is not a committed checkpoint" "$tmp/err" ||
	fail "a pin naming nothing is not reported: $(cat "$tmp/err")"
grep -q "half-done" <<<"$out$(cat "$tmp/err")" && fail "an incomplete checkpoint was a candidate"
grep -q "ckpt-work" <<<"$out" && fail "a work area was a candidate"
grep -Eq "zz-link|alias-600" <<<"$out" && fail "a symbolic link was a candidate: $out"

# ---- JSON Lines ----
rc=0
"$ctl" prune "$root" --dry-run --keep-every-steps 200 --json >"$tmp/json" 2>/dev/null || rc=$?
[ "$rc" = 5 ] || fail "prune --json: exit $rc"
"$py" - "$tmp/json" <<'PY' || fail "prune --json content"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
rows = {l["name"]: l for l in lines if "name" in l}
summ = [l["summary"] for l in lines if "summary" in l]
assert len(summ) == 1 and lines[-1] == {"summary": summ[0]}, lines
s = summ[0]
assert s["checkpoints"] == 7 and s["remove"] == 3 and s["dry_run"] and not s["refused"], s
assert s["not_candidates"] == 2, s
assert rows["step-000200"]["reasons"] == ["every"], rows
assert rows["step-000600"]["reasons"] == ["newest", "every", "last-commit"], rows
assert rows["step-000100"]["reasons"] == ["pinned"], rows
assert sorted(n for n, r in rows.items() if r["action"] == "remove") == \
    ["step-000050", "step-000300", "step-000500"], rows
assert rows["step-000300"]["reasons"] == [] and rows["step-000300"]["time"] == "2026-11-12T03:00:00Z"
PY

# ---- a safety rule refuses; --force does not ----
rc=0
"$ctl" prune "$root" --dry-run --keep-last 1 --max-removals 3 >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 6 ] || fail "max_removals: exit $rc, want 6"
grep -q "refused: the plan removes 5 checkpoints, more than max_removals (3)" "$tmp/err" ||
	fail "refusal message: $(cat "$tmp/err")"
grep -q "^REMOVE" "$tmp/out" || fail "a refused dry run still shows its plan"
rc=0
"$ctl" prune "$root" --dry-run --keep-last 1 --max-removals 3 --force >/dev/null 2>&1 || rc=$?
[ "$rc" = 5 ] || fail "--force: exit $rc"

# ---- no rule keeps everything ----
rc=0
out=$("$ctl" prune "$root" --dry-run 2>/dev/null) || rc=$?
[ "$rc" = 5 ] || fail "no rule: exit $rc"
grep -q "^REMOVE" <<<"$out" && fail "no rule removed something: $out"
grep -q '^policy: none (everything is kept)$' <<<"$out" || fail "no rule: $out"

# ---- nothing changed on disk ----
after=$(cd "$tmp" && find root | sort | xargs stat -c '%n %s %Y')
[ "$before" = "$after" ] || fail "a dry run changed the root"

# ---- usage ----
long=$(printf 'a%.0s' $(seq 700))
for args in "--keep-last 0" "--keep-last x" "--keep-within 3y" "--keep-best 2 loss" \
	"--keep-best 2 loss up" "--keep-forever 1" "--max-removals" "--keep-best 3 --json min" \
	"--keep-last 2 --keep-last 5" "--keep-$long 1"; do
	rc=0
	# shellcheck disable=SC2086
	"$ctl" prune "$root" --dry-run $args >/dev/null 2>"$tmp/err" || rc=$?
	[ "$rc" = 2 ] || fail "prune $args: exit $rc, want 2"
done
rc=0
"$ctl" prune "$tmp/missing" --dry-run --keep-last 1 >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && grep -q "cannot open root" "$tmp/err" || fail "missing root: exit $rc"
# ---- show ROOT/latest and ROOT/best; list with rules ----
out=$("$ctl" show "$root/latest" 2>/dev/null) || fail "show latest: exit $?"
grep -qx "latest: $root/step-000600" <<<"$out" || fail "show latest: $out"
out=$("$ctl" show "$root/best" --metric loss 2>/dev/null) || fail "show best: exit $?"
grep -qx "best: $root/step-000400" <<<"$out" || fail "show best (min): $out"
out=$("$ctl" show "$root/best" --metric loss --max 2>/dev/null) || fail "show best --max: exit $?"
grep -qx "best: $root/step-000100" <<<"$out" || fail "show best (max): $out"
rc=0
"$ctl" show "$root/best" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && grep -q "needs --metric" "$tmp/err" || fail "show best without a metric: $rc"
"$ctl" list "$root" --keep-last 2 --json 2>/dev/null >"$tmp/list.json" || fail "list with rules"
"$py" - "$tmp/list.json" <<'PY' || fail "list with rules: $(cat "$tmp/list.json")"
import json, sys
got = {o["path"]: o.get("retention") for o in map(json.loads, open(sys.argv[1]))
       if o["state"] == "committed"}
assert got["step-000600"] == {"action": "keep", "reasons": ["newest", "last", "last-commit"]}, got
assert got["step-000500"]["action"] == "keep", got
assert got["step-000200"] == {"action": "remove", "reasons": []}, got
PY
echo "ok: show latest/best, list with rules"
# ---- pin and unpin ----
out=$("$ctl" pin "$root" step-000300) || fail "pin: exit $?"
[ "$out" = "pinned step-000300" ] || fail "pin said: $out"
out=$("$ctl" pin "$root" step-000300) || fail "pin again: exit $?"
grep -q "pinned already" <<<"$out" || fail "pin again said: $out"
out=$("$ctl" pin "$root" step-000300 --json) || fail "pin --json: exit $?"
[ "$out" = '{"name":"step-000300","pinned":true,"changed":false}' ] || fail "pin --json said: $out"
rc=0
out=$("$ctl" prune "$root" --dry-run --keep-last 1 2>/dev/null) || rc=$?
[ "$rc" = 5 ] || fail "prune after pin: exit $rc"
grep -Eq '^KEEP +step-000300 +300 .* pinned$' <<<"$out" || fail "a pin is not kept: $out"
"$ctl" unpin "$root" step-000100 >/dev/null || fail "unpin: exit $?"
grep -qx "step-000100" "$root/.ckpt-pins" && fail "unpin left the name"
grep -qx "step-000300" "$root/.ckpt-pins" || fail "unpin took another name"
for bad in "unpin $root step-000100:1:is not in" "pin $root half-done:1:is not a committed" 	"pin $root bad-time:1:is not a committed" "pin $root zz-link:1:is not a committed" 	"pin $root ../x:2:contains '/'" "pin $root:2:takes ROOT and NAME"; do
	IFS=: read -r cmdline want msg <<<"$bad"
	rc=0
	# shellcheck disable=SC2086
	"$ctl" $cmdline >/dev/null 2>"$tmp/err" || rc=$?
	[ "$rc" = "$want" ] && grep -q -- "$msg" "$tmp/err" ||
		fail "$cmdline: exit $rc (want $want), said: $(cat "$tmp/err")"
done
# Pins at once all land (the list is rewritten under a lock on the root).
pids=()
for n in 200 400 500 600; do
	"$ctl" pin "$root" "step-000$n" >/dev/null &
	pids+=($!)
done
for p in "${pids[@]}"; do
	wait "$p" || fail "a concurrent pin failed"
done
for n in 200 300 400 500 600; do
	grep -qx "step-000$n" "$root/.ckpt-pins" || fail "concurrent pins lost step-000$n"
done
ls -a "$root" | grep -q "ckpt-pins.tmp" && fail "a temporary pin list is left"
# ---- a real prune: only the plan's REMOVE rows go; the pinned, the
# corrupt, the links and their targets, the work area all stay ----
"$ctl" unpin "$root" step-000200 >/dev/null || fail "unpin 200"
"$ctl" unpin "$root" step-000400 >/dev/null || fail "unpin 400"
rc=0
out=$("$ctl" prune "$root" --keep-last 1 2>"$tmp/err") || rc=$?
[ "$rc" = 5 ] || fail "real prune: exit $rc (want 5: corrupt entries), said: $(cat "$tmp/err")"
for n in 050 100 200 400; do
	[ -e "$root/step-000$n" ] && fail "step-000$n not removed: $out"
	grep -Eq "^REMOVED +step-000$n " <<<"$out" || fail "step-000$n not shown removed: $out"
done
for n in 300 500 600; do
	[ -f "$root/step-000$n/manifest.json" ] || fail "step-000$n (kept) lost: $out"
done
for e in broken/manifest.json bad-time/manifest.json zz-link alias-600 ../elsewhere/far/manifest.json \
	.ckpt-work-0123456789abcdef0123456789abcdef; do
	[ -e "$root/$e" ] || [ -L "$root/$e" ] || fail "$e was touched by the prune"
done
ls -a "$root" | grep -q "ckpt-trash" && fail "a trash directory is left"
grep -q "4 of 7 checkpoints removed" <<<"$out" || fail "summary: $out"
echo "ckptctl prune --dry-run, prune, pin, unpin: all checks passed"
