#!/usr/bin/env bash
# bench_gpu.sh - the save-gpu-2g benchmark scenario runs end to end: `make
# bench`'s driver (bench/run.py, QUICK sizes, no torch peers) with a real
# ckptd and ckpt_bench --gpu against the fake CUDA runtime
# (BENCH_FAKE_CUDA=1), and its results say plainly that no GPU ran: figures
# present, targets not judged; the same when only $CKPT_CUDART names the
# fake.  Then with no runtime at all ($CKPT_CUDART naming nothing): the
# scenario is null with the reason.  Needs only the
# system python3; SKIPs in a build without CUDA.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

build=${CKPT_BUILD_DIR:-$PWD/${BUILD:-build}}
for f in bench/ckpt_bench bench/gpu_probe ckptd; do
	if [ ! -x "$build/$f" ]; then
		echo "FAIL: $build/$f is not built (make tests-build)"
		exit 1
	fi
done
if [ ! -f "$build/tests/libfakecudart.so" ]; then
	echo "SKIP: [bench_gpu] this build has no CUDA (no fake runtime): nothing to run"
	exit 0
fi
py=/usr/bin/python3
if [ ! -x "$py" ]; then
	echo "needs /usr/bin/python3"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-gpu-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	exit 1
}

# run.py stops every process it started (ckptd, ckpt_bench) by PID itself,
# also when it fails; `timeout` bounds it.
run_bench() {
	local out=$1
	shift
	env "$@" BUILD="$build" QUICK=1 SCENARIOS=save-gpu-2g BENCH_SKIP_DCP=1 BENCH_SKIP_TORCH=1 \
		BENCH_OUT="$out" BENCH_RUN_DIR="$tmp/run" timeout 300 "$py" bench/run.py >"$out.log" 2>&1
}

# 1. Against the fake runtime: every measurement ran, none is a GPU's.
if ! run_bench "$tmp/fake.json" BENCH_FAKE_CUDA=1; then
	tail -20 "$tmp/fake.json.log"
	fail "bench/run.py with BENCH_FAKE_CUDA=1 failed"
fi
"$py" - "$tmp/fake.json" <<'EOF' || fail "fake-runtime results (see above)"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["scenarios"]["save-gpu-2g"]
errs = []
def want(cond, what):
    if not cond:
        errs.append(what)
want(s.get("fake_cuda") is True, "fake_cuda is not true")
want(s.get("rounds") == 2, "rounds %r, want 2" % s.get("rounds"))
for k in ("call_ms", "staged_ms", "committed_ms", "d2h_limit_gibps"):
    want(isinstance(s.get(k), (int, float)) and s[k] > 0, "%s = %r" % (k, s.get(k)))
if isinstance(s.get("staged_ms"), (int, float)) and isinstance(s.get("committed_ms"), (int, float)):
    want(s["staged_ms"] <= s["committed_ms"], "staged after committed")
g = s.get("gpu") or {}
want(g.get("devices", 0) >= 1 and "libfakecudart" in (g.get("cuda_runtime") or ""),
     "ready line's gpu: %r" % g)
rat = s.get("ratios", {}).get("staging_vs_d2h_limit", {})
want(isinstance(rat.get("median"), float) and rat["median"] > 0, "staging_vs_d2h_limit %r" % rat)
want(any("fake CUDA runtime" in n for n in s.get("notes", [])), "no note naming the fake runtime")
want(s.get("dcp_async_staged_ms") is None and any("BENCH_SKIP_DCP" in n for n in s.get("notes", [])),
     "DCP not null with its reason")
ts = [t for t in r["targets"] if t["scenario"] == "save-gpu-2g"]
want(len(ts) == 3, "%d save-gpu-2g targets, want 3" % len(ts))
for t in ts:
    want(t["met"] is None and "fake" in t["rule"], "target judged against the fake: %r" % t)
methods = s.get("detail", {}).get("d2h_limit", {}).get("medians_gibps", {})
want(set(methods) == {"d2h_whole", "d2h_chunked"} and all(v and v > 0 for v in methods.values()),
     "D2H limit methods %r" % methods)
if errs:
    print("\n".join(errs))
    sys.exit(1)
EOF
grep -q "FAKE CUDA runtime" "$tmp/fake.json.log" || fail "the printed table does not say the runtime was fake"

# 2. The fake named by CKPT_CUDART alone (no BENCH_FAKE_CUDA): still found
# out and not judged.
if ! run_bench "$tmp/named.json" CKPT_CUDART="$build/tests/libfakecudart.so"; then
	tail -20 "$tmp/named.json.log"
	fail "bench/run.py with CKPT_CUDART naming the fake failed"
fi
"$py" - "$tmp/named.json" <<'EOF' || fail "a fake named by CKPT_CUDART was judged as a GPU"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["scenarios"]["save-gpu-2g"]
ts = [t for t in r["targets"] if t["scenario"] == "save-gpu-2g"]
ok = s.get("fake_cuda") is True and s["gpu"]["fake"] is True and ts and all(t["met"] is None for t in ts)
if not ok:
    print(json.dumps({"fake_cuda": s.get("fake_cuda"), "gpu": s.get("gpu"), "targets": ts}))
    sys.exit(1)
EOF

# 3. No runtime: not run, with the loader's reason; nothing failed.
if ! run_bench "$tmp/none.json" CKPT_CUDART="$tmp/no-such-libcudart.so"; then
	tail -20 "$tmp/none.json.log"
	fail "bench/run.py without a runtime failed"
fi
"$py" - "$tmp/none.json" <<'EOF' || fail "no-runtime results (see above)"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["scenarios"]["save-gpu-2g"]
notes = " ".join(s.get("notes", []))
ok = (s.get("rounds") == 0 and s.get("staged_ms") is None and "no GPU, so not run" in notes
      and "no-such-libcudart" in notes and not s.get("fake_cuda"))
ok = ok and all(t["met"] is None for t in r["targets"] if t["scenario"] == "save-gpu-2g")
if not ok:
    print(json.dumps(s, indent=1)[:2000])
    sys.exit(1)
EOF
echo "ok: save-gpu-2g ran against the fake runtime (not judged) and reported null without one"
