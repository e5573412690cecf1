#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make bench: ckptd against memcpy, fio, torch.save and DCP async_save.

Run by `make bench` as `BUILD=build QUICK= python3 bench/run.py` from the
repository root, with the system python3 and the standard library only.  The
torch baselines run with the bench environment's python (scripts/pyenv.sh
bench).  The protocol is the project's benchmark protocol, summarised in
bench/RESULTS.md: every figure that matters is a ratio against a baseline
measured in this same run, on the same bytes and the same directory.  Nothing
is cached or hard-coded.

Environment: BUILD (build directory, default "build"), QUICK (non-empty and
not "0": small sizes, a smoke check), BENCH_SKIP_DCP=1 (leave DCP out; its
fields are then null with a reason), BENCH_OUT (output JSON path; default
bench/results/latest.json).

Exit status: 0 when every ckptd scenario ran (targets missed or baselines
unavailable are reported, not failures), 1 otherwise.
"""
import datetime
import json
import os
import platform
import shutil
import statistics
import signal
import socket
import subprocess
import sys
import time

GIB = 1 << 30
MIB = 1 << 20

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_flag(name):
    v = os.environ.get(name, "").strip().lower()
    return v not in ("", "0", "no", "false")


QUICK = env_flag("QUICK")
SKIP_DCP = env_flag("BENCH_SKIP_DCP")
BUILD = os.environ.get("BUILD") or "build"
BUILD = BUILD if os.path.isabs(BUILD) else os.path.join(REPO, BUILD)

# name -> (bytes per rank, tensors per rank, saves, ranks).  The QUICK sizes
# are a smoke check only: their ratios are not the benchmark's.
if QUICK:
    SCENARIOS = {
        "save-2g": dict(bytes=256 * MIB, tensors=256, saves=3, ranks=1),
        "save-many": dict(bytes=8 * MIB, tensors=1000, saves=3, ranks=1),
        "save-8ranks": dict(bytes=32 * MIB, tensors=32, saves=3, ranks=8),
    }
else:
    SCENARIOS = {
        # More saves than save-many: DCP's stager may still be warming up
        # over saves 2-4 (one run: 531, 493, 302, then 133 ms), which a
        # median over 4 saves would count against it.
        "save-2g": dict(bytes=2 * GIB, tensors=256, saves=8, ranks=1),
        "save-many": dict(bytes=64 * MIB, tensors=10000, saves=5, ranks=1),
        "save-8ranks": dict(bytes=256 * MIB, tensors=32, saves=5, ranks=8),
    }

# Targets of the issue: (scenario, key, op, bound).
TARGETS = [
    ("save-2g", "call_ms", "<=", 1.0),
    ("save-2g", "staging_vs_memcpy", ">=", 0.8),
    ("save-2g", "commit_vs_odirect", ">=", 0.9),
    ("save-2g", "durable_speedup_vs_torch", ">=", 3.0),
    ("save-2g", "durable_speedup_vs_dcp", ">=", 3.0),
    ("save-2g", "staged_speedup_vs_dcp", ">=", 1.5),
    ("save-many", "vs_one_tensor", "<=", 2.0),
]

T_START = time.monotonic()


def progress(msg):
    sys.stdout.write("[bench %6.1fs] %s\n" % (time.monotonic() - T_START, msg))
    sys.stdout.flush()


class BenchError(Exception):
    pass


def run_json(argv, timeout, what, env=None, cwd=None):
    """Runs argv in a process group of its own, returns the JSON object on
    the last line of its stdout.  On a timeout the whole group is killed
    (the baselines start processes of their own).  Raises BenchError with
    the tail of stderr on any failure."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                             text=True, start_new_session=True)
    except OSError as e:
        raise BenchError("%s: cannot run %s: %s" % (what, argv[0], e))
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise BenchError("%s timed out after %d s" % (what, timeout))
        raise
    lines = [l for l in out.splitlines() if l.strip()]
    if p.returncode != 0 or not lines:
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise BenchError("%s failed (exit %d): %s" % (what, p.returncode, tail or "no output"))
    # Our programs print one JSON line last; fio prints one indented
    # object (possibly after warnings).
    try:
        return json.loads(lines[-1])
    except ValueError:
        pass
    start = out.find("\n{")
    start = 0 if out.startswith("{") else (start + 1 if start >= 0 else -1)
    try:
        if start >= 0:
            return json.loads(out[start:])
    except ValueError:
        pass
    raise BenchError("%s printed no JSON: %r" % (what, lines[-1][:200]))


# ---- the machine ------------------------------------------------------------

def mem_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / GIB, 1)
    except OSError:
        pass
    return None


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fs_type(path):
    """The file system of path, from /proc/self/mounts (longest prefix)."""
    best, typ = "", None
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, typ = mnt, parts[2]
    except OSError:
        pass
    return typ


def fio_version():
    fio = shutil.which("fio")
    if not fio:
        return None
    try:
        out = subprocess.run([fio, "--version"], stdout=subprocess.PIPE, text=True, timeout=30).stdout
        return out.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_commit():
    try:
        p = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=10)
        return p.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


# ---- the daemon -------------------------------------------------------------

def die_with_parent():
    """In the child before exec: SIGTERM when run.py dies, so that even a
    SIGKILLed bench leaves no daemon behind (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Daemon:
    """A private ckptd on its own socket and data directory.  stop() is
    always called (try/finally) and kills by PID only."""

    def __init__(self, run_dir, arena_max, arena_total):
        self.run_dir = run_dir
        self.data = os.path.join(run_dir, "data")
        self.socket = os.path.join(run_dir, "ckptd.sock")
        self.conf = os.path.join(run_dir, "ckptd.conf")
        self.log_path = os.path.join(run_dir, "ckptd.log")
        self.arena_max = arena_max
        self.arena_total = arena_total
        self.proc = None
        self.log = None

    def start(self, timeout=60):
        binary = os.path.join(BUILD, "ckptd")
        if not os.access(binary, os.X_OK):
            raise BenchError("%s is missing: run `make bench` (or `make BUILD=%s all`)" % (binary, BUILD))
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        with open(self.conf, "w") as f:
            f.write("# written by bench/run.py for one run\n")
            f.write("socket = %s\n" % self.socket)
            f.write("socket_mode = 0600\n")
            f.write("root = %s\n" % self.data)
            f.write("state_dir = %s\n" % os.path.join(os.path.dirname(self.conf), "state"))
            f.write("arena_max = %dM\n" % (self.arena_max // MIB))
            f.write("arena_total = %dM\n" % (self.arena_total // MIB))
            f.write("commit_deadline = 10m\n")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "-c", self.conf], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError("ckptd exited with status %d at start:\n%s" % (self.proc.returncode,
                                                                                self.log_tail()))
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise BenchError("ckptd did not accept connections on %s within %d s:\n%s"
                                 % (self.socket, timeout, self.log_tail()))
            time.sleep(0.05)

    def ready(self):
        if not os.path.exists(self.socket):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.settimeout(1)
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:]).rstrip()
        except OSError:
            return "(no log)"

    def stop(self, wait=15):
        """Stops the daemon: SIGTERM, then SIGKILL after `wait` seconds.
        Returns its exit status, or None if it was not running any more
        (an earlier exit is reported where it was noticed)."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is not None:
            rc = None
        else:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                progress("ckptd did not exit %d s after SIGTERM: SIGKILL" % wait)
                self.proc.kill()
                rc = self.proc.wait()
        if self.log:
            self.log.close()
            self.log = None
        self.proc = None
        return rc


# ---- measurements -----------------------------------------------------------

def arena_for(nbytes, tensors):
    """What ckpt_bench asks for by default: the whole shard file (data,
    ~256 bytes of header per tensor, rounding), so a save never waits on
    backpressure.  Passed explicitly so run.py and ckpt_bench agree."""
    return nbytes + tensors * 256 + 8 + MIB + 16 * MIB


def ckpt_bench(args, timeout=900):
    return run_json([os.path.join(BUILD, "bench", "ckpt_bench")] + [str(a) for a in args], timeout,
                    "ckpt_bench " + " ".join(str(a) for a in args[:2]))


def run_ckpt(daemon, sc):
    args = ["--scenario", "ranks" if sc["ranks"] > 1 else "save", "--socket", daemon.socket,
            "--root", daemon.data, "--saves", sc["saves"], "--bytes", sc["bytes"],
            "--tensors", sc["tensors"], "--arena", arena_for(sc["bytes"], sc["tensors"])]
    if sc["ranks"] > 1:
        args += ["--ranks", sc["ranks"]]
    return ckpt_bench(args)


def run_memcpy(nbytes):
    return ckpt_bench(["--scenario", "memcpy", "--bytes", nbytes], timeout=300)["gibps"]


def run_odirect(nbytes, directory, notes, repeats=3):
    """fio O_DIRECT io_uring sequential write of nbytes into directory; the
    built-in writer only if fio is missing.  Returns (gibps, detail).

    Each run writes a NEW file, as a checkpoint does: rewriting a file whose
    blocks are already allocated skips allocation and is up to twice as fast
    on ext4 here, which is not what a save does.  The figure is the median of
    `repeats` runs, to compare with our medians: this disk's speed swings by
    2x over minutes, so a best-of would pick the luckiest moment."""
    path = os.path.join(directory, "odirect-bench.tmp")
    fio = shutil.which("fio")
    runs = []
    try:
        for _ in range(repeats):
            if os.path.exists(path):
                os.unlink(path)
            if fio:
                d = run_json([fio, "--name=odirect", "--filename=" + path, "--ioengine=io_uring",
                              "--direct=1", "--bs=8m", "--iodepth=8", "--rw=write",
                              "--size=%d" % nbytes, "--end_fsync=1", "--output-format=json"],
                             600, "fio")
                job = d["jobs"][0]
                if job.get("error"):
                    raise BenchError("fio job error %s" % job["error"])
                runs.append(job["write"]["bw_bytes"] / GIB)
            else:
                d = ckpt_bench(["--scenario", "odirect", "--path", path, "--bytes", nbytes], timeout=600)
                runs.append(d["gibps"])
    finally:
        if os.path.exists(path):
            os.unlink(path)
    if not fio:
        notes.append("fio not found: odirect_gibps is ckpt_bench's built-in io_uring O_DIRECT "
                     "writer (8 MiB blocks, depth 8, fsync), not fio")
    engine = "fio io_uring direct bs=8m iodepth=8 end_fsync" if fio else "built-in"
    return statistics.median(runs), {"engine": engine, "stat": "median, fresh file each run",
                                     "runs_gibps": [round(r, 4) for r in runs]}


def bench_python(notes):
    """The bench environment's python, or None with a note."""
    script = os.path.join(REPO, "scripts", "pyenv.sh")
    if not os.access(script, os.X_OK):
        notes.append("scripts/pyenv.sh missing: torch baselines not run")
        return None
    progress("bench Python environment (scripts/pyenv.sh bench)")
    try:
        p = subprocess.run([script, "bench"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=3600, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as e:
        notes.append("scripts/pyenv.sh bench failed: %s" % e)
        return None
    py = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not os.access(py, os.X_OK):
        notes.append("scripts/pyenv.sh bench failed (exit %d): %s"
                     % (p.returncode, " ".join(p.stderr.strip().splitlines()[-3:])))
        return None
    return py


def baseline_env(threads):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_torch_save(py, sc, directory):
    argv = [py, os.path.join(REPO, "bench", "baselines", "torch_save.py"), "--dir", directory,
            "--bytes", str(sc["bytes"]), "--tensors", str(sc["tensors"]), "--repeats", "3",
            "--procs", str(sc["ranks"])]
    threads = max(1, (os.cpu_count() or 1) // sc["ranks"])
    return run_json(argv, 900, "torch_save baseline", env=baseline_env(threads))


def run_dcp(py, sc, directory):
    argv = [py, os.path.join(REPO, "bench", "baselines", "dcp_async.py"), "--dir", directory,
            "--bytes", str(sc["bytes"]), "--tensors", str(sc["tensors"]), "--saves", str(sc["saves"]),
            "--procs", str(sc["ranks"])]
    threads = max(1, (os.cpu_count() or 1) // sc["ranks"])
    return run_json(argv, 900, "DCP async_save baseline", env=baseline_env(threads))


# ---- ratios and report ------------------------------------------------------

def ratio(num, den):
    if num is None or den is None or den <= 0:
        return None
    return num / den


def compute_ratios(r):
    gib = r["bytes"] / GIB
    staged_s = r["staged_ms"] / 1e3 if r.get("staged_ms") else None
    committed_s = r["committed_ms"] / 1e3 if r.get("committed_ms") else None
    call_s = r["call_ms"] / 1e3 if r.get("call_ms") else None
    r["staging_vs_memcpy"] = ratio(ratio(gib, staged_s), r.get("memcpy_gibps"))
    r["commit_vs_odirect"] = ratio(ratio(gib, committed_s), r.get("odirect_gibps"))
    r["durable_speedup_vs_torch"] = ratio(r.get("torch_save_s"), committed_s)
    r["blocking_speedup_vs_torch"] = ratio(r.get("torch_save_s"), call_s)
    r["durable_speedup_vs_dcp"] = ratio(r.get("dcp_async_committed_ms"), r.get("committed_ms"))
    r["staged_speedup_vs_dcp"] = ratio(r.get("dcp_async_staged_ms"), r.get("staged_ms"))


def check_targets(scenarios):
    out = []
    for name, key, op, bound in TARGETS:
        v = scenarios.get(name, {}).get(key)
        met = None if v is None else (v <= bound if op == "<=" else v >= bound)
        out.append({"scenario": name, "key": key, "target": "%s %s %s" % (key, op, bound),
                    "value": v, "met": met})
    return out


def fmt(v, nd=2):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return "%.0f" % v
        return ("%." + str(nd) + "f") % v
    return str(v)


def print_table(scenarios):
    cols = [("call_ms", "call ms", 3), ("staged_ms", "staged ms", 1), ("committed_ms", "commit ms", 1),
            ("memcpy_gibps", "memcpy GiB/s", 2), ("odirect_gibps", "odirect GiB/s", 2),
            ("torch_save_s", "torch.save s", 2), ("dcp_async_staged_ms", "dcp staged ms", 1),
            ("dcp_async_committed_ms", "dcp commit ms", 1)]
    rcols = [("staging_vs_memcpy", "stage/memcpy"), ("commit_vs_odirect", "commit/odirect"),
             ("durable_speedup_vs_torch", "durable x torch"), ("blocking_speedup_vs_torch", "blocking x torch"),
             ("durable_speedup_vs_dcp", "durable x dcp"), ("staged_speedup_vs_dcp", "staged x dcp")]
    names = list(scenarios)
    w = max(18, max(len(n) for n in names) + 2) if names else 18

    def row(label, vals):
        print(label.ljust(18) + "".join(v.rjust(w) for v in vals))

    print()
    row("", names)
    row("bytes (all ranks)", ["%.0f MiB" % (scenarios[n]["bytes"] / MIB) for n in names])
    row("tensors", ["%d" % scenarios[n]["tensors"] for n in names])
    row("ranks", ["%d" % scenarios[n].get("ranks", 1) for n in names])
    for key, label, nd in cols:
        row(label, [fmt(scenarios[n].get(key), nd) for n in names])
    row("first commit ms", [fmt(scenarios[n].get("first_committed_ms"), 1) for n in names])
    print("-" * (18 + w * len(names)))
    for key, label in rcols:
        row(label, [fmt(scenarios[n].get(key), 2) for n in names])
    if "save-many" in scenarios:
        s = scenarios["save-many"]
        print("save-many: committed %s ms vs one tensor %s ms (x%s)"
              % (fmt(s.get("committed_ms"), 1), fmt(s.get("one_tensor_committed_ms"), 1),
                 fmt(s.get("vs_one_tensor"), 2)))
    print()


def markdown(result):
    """The run as a Markdown table for bench/RESULTS.md's history (from a
    results file: formatting only, nothing is measured or kept)."""
    sc = result["scenarios"]
    names = list(sc)
    rows = [("bytes (all ranks)", lambda s: "%.0f MiB" % (s["bytes"] / MIB)),
            ("ranks x tensors", lambda s: "%d x %d" % (s.get("ranks", 1), s["tensors"]))]
    for key, nd in (("call_ms", 3), ("staged_ms", 1), ("committed_ms", 1), ("first_committed_ms", 1),
                    ("memcpy_gibps", 2), ("odirect_gibps", 2), ("torch_save_s", 2),
                    ("dcp_async_call_ms", 1), ("dcp_async_staged_ms", 1), ("dcp_async_committed_ms", 1),
                    ("staging_vs_memcpy", 2), ("commit_vs_odirect", 2), ("durable_speedup_vs_torch", 2),
                    ("blocking_speedup_vs_torch", 0), ("durable_speedup_vs_dcp", 2),
                    ("staged_speedup_vs_dcp", 2), ("vs_one_tensor", 2)):
        rows.append((key, lambda s, k=key, n=nd: fmt(s.get(k), n) if k in s else "-"))
    m = result.get("machine", {})
    lines = ["%s%s, commit %s: %s cpus, %s GiB, kernel %s, %s, %s, torch %s" % (
        result.get("started", "?"), " (QUICK)" if result.get("quick") else "", result.get("commit"),
        m.get("cpus"), m.get("mem_gib"), m.get("kernel"), m.get("fs"), m.get("fio"), m.get("torch")), ""]
    lines.append("| | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for label, f in rows:
        lines.append("| %s | %s |" % (label, " | ".join(f(sc[n]) for n in names)))
    lines.append("")
    met = ["%s %s: %s" % ("met" if t["met"] else ("n/a" if t["met"] is None else "MISSED"), t["scenario"],
                          t["target"]) for t in result.get("targets", [])]
    lines.append("Targets: " + "; ".join(met) + ".")
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------

def empty_result(name, sc):
    """A scenario's JSON with every measured field null.  "bytes" is what
    the whole job saves (all ranks); with ranks, "bytes_per_rank" is one
    client's share and "tensors" counts global tensors (each rank holds one
    chunk of every tensor)."""
    r = {"bytes": sc["bytes"] * sc["ranks"], "tensors": sc["tensors"], "saves": sc["saves"]}
    if sc["ranks"] > 1:
        r["ranks"] = sc["ranks"]
        r["bytes_per_rank"] = sc["bytes"]
    if name == "save-many":
        r["one_tensor_committed_ms"] = None
        r["vs_one_tensor"] = None
    for k in ("call_ms", "staged_ms", "committed_ms", "first_committed_ms", "connect_ms", "memcpy_gibps",
              "odirect_gibps", "torch_save_s", "dcp_async_call_ms", "dcp_async_staged_ms",
              "dcp_async_committed_ms"):
        r[k] = None
    r["notes"] = []
    r["detail"] = {}
    return r


def run_scenario(name, sc, daemon, py, failures):
    r = empty_result(name, sc)
    notes = r["notes"]
    total = sc["bytes"] * sc["ranks"]
    label = "%s (%s%d MiB in %d tensors%s, %d saves)" % (
        name, "%d x " % sc["ranks"] if sc["ranks"] > 1 else "", sc["bytes"] // MIB, sc["tensors"],
        " each" if sc["ranks"] > 1 else "", sc["saves"])

    progress("%s: ckptd" % label)
    try:
        if not daemon.alive():
            raise BenchError("ckptd is not running:\n" + daemon.log_tail())
        d = run_ckpt(daemon, sc)
        for k in ("call_ms", "staged_ms", "committed_ms", "first_committed_ms", "connect_ms"):
            r[k] = d.get(k)
        r["detail"]["ckpt_bench"] = d
        progress("%s: call %.3f ms, staged %.1f ms, committed %.1f ms (first %.1f ms)"
                 % (name, d["call_ms"], d["staged_ms"], d["committed_ms"], d["first_committed_ms"]))
    except BenchError as e:
        notes.append("ckptd: %s" % e)
        failures.append("%s: %s" % (name, e))
        progress("%s: ckptd FAILED: %s" % (name, e))
        if not daemon.alive():
            notes.append("ckptd log tail: " + daemon.log_tail(10))

    if name == "save-many":
        one = dict(sc, tensors=1)
        progress("%s: the same bytes in one tensor" % name)
        try:
            d = run_ckpt(daemon, one)
            r["one_tensor_committed_ms"] = d["committed_ms"]
            r["detail"]["ckpt_bench_one_tensor"] = d
        except BenchError as e:
            notes.append("one-tensor run: %s" % e)
            failures.append("%s one tensor: %s" % (name, e))
        r["vs_one_tensor"] = ratio(r.get("committed_ms"), r.get("one_tensor_committed_ms"))

    progress("%s: memcpy baseline" % name)
    try:
        r["memcpy_gibps"] = run_memcpy(total)
    except BenchError as e:
        notes.append("memcpy: %s" % e)

    progress("%s: O_DIRECT baseline" % name)
    try:
        r["odirect_gibps"], r["detail"]["odirect"] = run_odirect(total, daemon.data, notes)
    except BenchError as e:
        notes.append("odirect: %s" % e)

    if py is None:
        notes.append("torch_save_s, dcp_async_*: no bench Python environment (see top-level notes)")
    else:
        progress("%s: torch.save baseline" % name)
        try:
            t = run_torch_save(py, sc, daemon.data)
            r["torch_save_s"] = t["median_s"]
            r["detail"]["torch_save"] = t
        except BenchError as e:
            notes.append("torch_save: %s" % e)
        if SKIP_DCP:
            notes.append("dcp_async: skipped (BENCH_SKIP_DCP)")
        else:
            progress("%s: DCP async_save baseline" % name)
            try:
                t = run_dcp(py, sc, daemon.data)
                r["dcp_async_call_ms"] = t["call_ms"]
                r["dcp_async_staged_ms"] = t["staged_ms"]
                r["dcp_async_committed_ms"] = t["committed_ms"]
                r["detail"]["dcp_async"] = t
            except BenchError as e:
                notes.append("dcp_async: %s" % e)
    compute_ratios(r)
    for n in notes:
        progress("%s: note: %s" % (name, n.splitlines()[0] if n else n))
    return r


def main():
    started = datetime.datetime.now(datetime.timezone.utc)
    out_path = os.environ.get("BENCH_OUT") or os.path.join(REPO, "bench", "results", "latest.json")
    run_dir = os.path.join(BUILD, "bench-run")
    notes = []
    failures = []

    # SIGTERM (e.g. a CI timeout) must still stop the daemon: turn it into
    # an exception so the finally below runs.
    def on_term(signum, _frame):
        raise SystemExit("bench: signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)

    if not os.access(os.path.join(BUILD, "bench", "ckpt_bench"), os.X_OK):
        sys.exit("bench: %s/bench/ckpt_bench is missing: run `make bench`" % BUILD)

    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(os.path.join(run_dir, "data"))
    data = os.path.realpath(os.path.join(run_dir, "data"))

    need = max(arena_for(s["bytes"], s["tensors"]) for s in SCENARIOS.values())
    arena_max = (need // MIB + 64) * MIB
    arena_total = max(arena_max, max(arena_for(s["bytes"], s["tensors"]) * s["ranks"]
                                     for s in SCENARIOS.values())) + 256 * MIB
    # Memory: one state and one arena at a time per scenario, plus the
    # memcpy baseline's two buffers.
    peak = max(2 * s["bytes"] * s["ranks"] + arena_for(s["bytes"], s["tensors"]) * s["ranks"]
               for s in SCENARIOS.values())
    avail = mem_available()
    if avail is not None and avail < peak:
        notes.append("only %.1f GiB of memory available, the largest scenario wants ~%.1f GiB"
                     % (avail / GIB, peak / GIB))
    free = shutil.disk_usage(data).free
    disk_need = 3 * max(s["bytes"] * s["ranks"] for s in SCENARIOS.values())
    if free < disk_need:
        sys.exit("bench: %.1f GiB free in %s, need ~%.1f GiB" % (free / GIB, data, disk_need / GIB))

    machine = {"cpus": os.cpu_count(), "mem_gib": mem_gib(), "kernel": platform.release(),
               "fs": fs_type(data), "fio": fio_version(), "torch": None,
               "python": platform.python_version()}
    progress("%s run: %d cpus, %s GiB, kernel %s, %s on %s" % (
        "QUICK" if QUICK else "full", machine["cpus"] or 0, machine["mem_gib"], machine["kernel"],
        machine["fs"], data))

    py = bench_python(notes)
    daemon = Daemon(run_dir, arena_max, arena_total)
    daemon.data = data
    scenarios = {}
    rc_daemon = None
    try:
        progress("starting ckptd (%s)" % daemon.socket)
        daemon.start()
        for name, sc in SCENARIOS.items():
            scenarios[name] = run_scenario(name, sc, daemon, py, failures)
    except BenchError as e:
        failures.append(str(e))
        progress("FAILED: %s" % e)
        notes.append("ckptd: %s" % e)
    finally:
        rc_daemon = daemon.stop()
    for name, sc in SCENARIOS.items():
        if name not in scenarios:
            scenarios[name] = empty_result(name, sc)
            scenarios[name]["notes"].append("not run: ckptd failed (see top-level notes)")
            compute_ratios(scenarios[name])
    if rc_daemon not in (None, 0):
        notes.append("ckptd exited with status %d on SIGTERM: %s" % (rc_daemon, daemon.log_tail(3)))

    for r in scenarios.values():
        for key in ("torch_save", "dcp_async"):
            v = r["detail"].get(key, {}).get("torch")
            if v and not machine["torch"]:
                machine["torch"] = v
    targets = check_targets(scenarios)
    if QUICK:
        notes.append("QUICK run: smaller sizes, a smoke check; ratios are not the benchmark's")

    result = {
        "machine": machine,
        "quick": QUICK,
        "commit": git_commit(),
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_s": round(time.monotonic() - T_START, 1),
        "ckptd": {"arena_max": arena_max, "arena_total": arena_total, "commit_deadline": "10m",
                  "exit_status": rc_daemon},
        "scenarios": scenarios,
        "targets": targets,
        "notes": notes,
    }
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, out_path)

    print_table(scenarios)
    print("targets%s:" % (" (QUICK sizes: indicative only)" if QUICK else ""))
    for t in targets:
        state = "n/a " if t["met"] is None else ("MET " if t["met"] else "MISS")
        print("  %s  %-10s %-34s value %s" % (state, t["scenario"], t["target"], fmt(t["value"], 3)))
    for n in notes:
        print("note: " + n)
    shown = os.path.relpath(out_path, REPO)
    print("wrote %s (%.0f s)" % (out_path if shown.startswith("..") else shown, time.monotonic() - T_START))
    if failures:
        print("bench: %d ckptd measurement(s) failed:" % len(failures), file=sys.stderr)
        for f in failures:
            print("  " + f.splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--markdown":
        with open(sys.argv[2]) as f:
            print(markdown(json.load(f)))
        sys.exit(0)
    if len(sys.argv) != 1:
        sys.exit("usage: BUILD=build QUICK= python3 bench/run.py  |  python3 bench/run.py --markdown RESULTS.json")
    sys.exit(main())
