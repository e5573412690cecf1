#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make bench: ckptd against its limits (copy, disk, read) and its peers
(torch.save, DCP async_save and load, `aws s3 cp`), benchmark protocol v2
(bench/RESULTS.md).

Run by `make bench` as `BUILD=build QUICK= python3 bench/run.py` from the
repository root, with the system python3 and the standard library only; the
torch baselines run with the bench environment's python (scripts/pyenv.sh
bench).  Every figure is measured in this run, on the same bytes and in the
same directory; nothing is cached or hard-coded.

Each scenario starts a private ckptd, then its workers (ckpt_bench and the
peers' worker, bench/baselines/peers.py: torch.save and DCP), each of which
builds its state, connects and warms up before round 1.  It then runs R rounds (5; QUICK: 2); a round runs
every measurement once, in an order that changes from round to round (each
measurement moves through the positions and follows other measurements).
Figures are medians over rounds; ratios are computed per round and reported
as their median, min and max (and a ceiling where one is defined).

Environment: BUILD (build directory, default "build"), QUICK (non-empty and
not "0": small sizes, 2 rounds: a smoke check), SCENARIOS (comma-separated
subset of save-2g, save-many, save-8ranks, two-jobs, save-gpu-2g,
save-s3-1g, s3-sink-2g, load-2g, reshard-8to3, restore-ram-2g, scale-1024,
prune-1000, py-save-2g, py-load-2g, train-overhead; reshard-8to3 and
restore-ram-2g bring load-2g with them),
BENCH_SKIP_S3=1 (the S3 scenarios, and prune-1000's S3 prune, report null
with the reason instead of running),
BENCH_ROUNDS (override the number of rounds, >= 2; fewer than 5 is noted as
not a protocol run), BENCH_SKIP_DCP=1 / BENCH_SKIP_TORCH=1 (leave a peer out;
its fields are then null with a reason), BENCH_OUT (output JSON path; default
bench/results/latest.json), BENCH_RUN_DIR (the daemon's and workers' files,
removed at the start, which a directory not made by an earlier run must not
need; default $BUILD/bench-run), BENCH_FAKE_CUDA=1 (save-gpu-2g against the
tests' fake CUDA runtime, $BUILD/tests/libfakecudart.so from `make
tests-build`: a check that the GPU scenario's code runs on a machine without
a GPU; its figures are not a GPU's and its targets are not judged),
BENCH_CKPTD_VERBOSE=1 (the daemons log at debug level into their
ckptd.log under BENCH_RUN_DIR, e.g. every event-loop round longer than
usual: for finding what a max_loop_stall_ms figure was).

save-gpu-2g runs where libckpt's CUDA loader finds a device (bench/gpu_probe)
and reports null with the reason elsewhere.  It has run only against the
fake runtime so far: no GPU machine has been available.

save-s3-1g and s3-sink-2g save to S3 through a ckptd whose root is
s3://BUCKET/bench, against `aws s3 cp` of a file of the same size at the
best of several settings, in the same rounds: save-s3-1g to a moto server
(tests/tools/s3_fixture.py, signatures checked), s3-sink-2g to
tests/tools/s3_proxy.py --sink (checks signatures and checksums, stores
nothing).  Both servers run with the test environment's python
(scripts/pyenv.sh test), on 127.0.0.1, started and stopped (by PID) by this
script; their CPU time is measured around every run.

load-2g and reshard-8to3 restore checkpoints that ckpt_bench saves (and
keeps) before round 1, with the page cache of their files dropped before
every load: load-2g one rank's 2 GiB against the read limit of the same
file (O_DIRECT: fio and ckpt_bench's reader) and DCP's load of the same
state; reshard-8to3, in the same rounds, 8 ranks' row-sharded tensors
loaded by 3 ranks as column bands (and reshard-8to3-wide, the same bytes
as one tensor per rank).  Each of these loads is measured twice in every
round: through the daemon (ckpt_load_set_client: ckptd reads the files
with io_uring and O_DIRECT into the loader's arena; the headline figures
and the targets) and by the library alone (buffered preadv: the
"standalone" figures, informational).  restore-ram-2g, also in load-2g's rounds, is a
trainer killed with SIGKILL after a committed save and a new one loading
that checkpoint from the daemon's memory (CKPT_CONNECT_RESIDENT,
ckpt_load_set_client): each of its measurements starts a saver and, once
the saver is killed, a loader (two ckpt_bench processes of one job).

prune-1000 (issue 11) prunes roots of 1,000 committed checkpoints (QUICK:
100) with `ckptctl prune ROOT --keep-last 100 --json`, which removes 900: a
directory on the data disk and s3://BUCKET/prune on a moto server.  The
checkpoints are copies of one real checkpoint saved through the scenario's
ckptd before round 1 (4 MiB in 4 tensors: its shard, index, manifest and
attempt files), with the manifest's name, step and time rewritten
(bench/baselines/prune_root.py, which also uploads the S3 copies with
boto3).  A prune removes 900 of them, so every measurement makes its root
afresh, outside its timed part (copied and synced, or uploaded, then
counted with `ckptctl list --json`), and checks after the prune that the
100 newest are left.  In the same rounds, save-2g's save through the same
ckptd, alone and started while a local prune runs (once a removal is seen
under way), in a pair whose order alternates: stall_during_prune = the
staged_ms during / the staged_ms alone, per round.

py-save-2g, py-load-2g and train-overhead (issue 31) measure the Python
package, ckptd.torch, and follow protocol v3 (see "the Python package"
below: at least 7 rounds (py-save-2g 9, train-overhead 11), sync and
drop_caches before every timed save and load, targets judged by judge_v3,
other processes' CPU share recorded and a run marked NOT RECORDABLE above
10 %).  Their Python side
(bench/baselines/pyckptd.py, bench/baselines/train.py) runs in the bench
environment with this tree's package and this build's libckpt.
py-save-2g: save-2g's state (2 GiB in 256 fp32 tensors) as a dict of torch
CPU tensors, saved by ckptd.torch.async_save, by DCP async_save (async and
sync staging into a cached shared-memory DefaultStager x FileSystemWriter
thread counts 1, 2, 4, every configuration in every round, in the same
process on the same tensors; each DCP figure the configuration with the
best median of it) and by the C client (ckpt_bench, the same shapes) next
to the Python save, with the copy and disk limits in the same block; and,
in every round, the binding's cost per call and per tensor (async_save of
1, 256 and 10,000 small tensors).  py-load-2g: ckptd.torch.load of its own
checkpoint of that state (through the daemon) against DCP load of DCP's
checkpoints of it (1 and 4 files), the read limit (fio on the Python
checkpoint's shard file, ckpt_bench's reader on its own) and ckpt_bench's
load through the daemon.  train-overhead: a CPU training loop (Linear
layers and Adam; the batch chosen so that a step takes about as long as
ckptd stages the state) for a fixed number of steps without saves, with
ckptd.torch saves every K steps and with DCP async saves every K steps.

  python3 bench/run.py --markdown FILE   prints a results file as Markdown

Exit status: 0 when every ckptd measurement ran (missed targets and
baselines that could not run are reported, not failures), 1 otherwise, 2 bad
usage.
"""
import datetime
import json
import math
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines"))
import prune_root  # noqa: E402

# The load scenarios' targets (BENCH.md v2 and their issue), ratios and
# table rows, added to report.py's tables: judged and shown as the save
# scenarios' are.  read_amplification's "ceiling" is its floor (what a
# perfect loader reads: analyse_reshard).
report.TARGETS += [
    ("load-2g", "load_vs_read_limit", ">=", 0.9, "ratio"),
    ("load-2g", "load_speedup_vs_dcp", ">=", 2.0, "peer"),
    ("reshard-8to3", "read_amplification", "<=", 1.05, "ratio"),
    ("reshard-8to3", "vs_load_2g", ">=", 0.7, "ratio"),
]
report.RATIOS += ["load_vs_read_limit", "load_speedup_vs_dcp", "read_amplification", "vs_load_2g",
                  "reshard_vs_read_limit", "standalone_vs_read_limit", "daemon_vs_standalone"]
# scale-1024 (bench/ckpt_scale: no daemon, no disk): the merge and the load
# planner at 128..1024 ranks.  The ratios are the worst world size's.
report.TARGETS += [
    ("scale-1024", "merge_vs_parse", "<=", 2.0, "ratio"),
    ("scale-1024", "plan_one_vs_open", "<=", 0.1, "ratio"),
    ("scale-1024", "scaling_exponent_merge", "<=", 1.2, "value"),
    ("scale-1024", "scaling_exponent_plan_all", "<=", 1.2, "value"),
]
report.RATIOS += ["merge_vs_parse", "plan_one_vs_open"]
# restore-ram-2g (issue 10): a restarted trainer's load from ckptd's memory
# against load-2g's load from the disk through ckptd, in the same round.
report.TARGETS += [("restore-ram-2g", "ram_vs_load_2g", ">=", 3.0, "ratio")]
report.RATIOS += ["ram_vs_load_2g"]


def _mib_row(key):
    def get(s):
        return "%.0f" % (s[key] / MIB) if s.get(key) is not None else "-"
    return get


_at = next(i for i, row in enumerate(report.ROWS) if row[0] == "max_loop_stall_ms")
report.ROWS[_at:_at] = [
    ("global tensors (reshard)", lambda s: s.get("global_shape", "-")),
    ("loaders x band columns", lambda s: "%d x %d" % (s["loaders"], s["band_columns"]) if "loaders" in s else "-"),
    ("load_ms (through ckptd)", report._val("load_ms", 1)),
    ("first_load_ms (through ckptd)", report._val("first_load_ms", 1)),
    ("load_gibps (through ckptd)", report._val("load_gibps", 2)),
    ("standalone_load_ms (library alone)", report._val("standalone_load_ms", 1)),
    ("standalone_gibps (library alone)", report._val("standalone_gibps", 2)),
    ("reshard_ms (through ckptd)", report._val("reshard_ms", 1)),
    ("first_reshard_ms (through ckptd)", report._val("first_reshard_ms", 1)),
    ("reshard_gibps (bytes wanted, through ckptd)", report._val("reshard_gibps", 2)),
    ("reshard_standalone_ms (library alone)", report._val("reshard_standalone_ms", 1)),
    ("reshard_standalone_gibps (library alone)", report._val("reshard_standalone_gibps", 2)),
    ("read_limit_gibps", report._val("read_limit_gibps", 2)),
    ("dcp_load_s", report._val("dcp_load_s", 2)),
    ("dcp_load layout (files per rank)", report._val("dcp_load_thread_count", 0)),
    ("MiB read (all loaders)", lambda s: _mib_row("load_bytes_read")(s) if "load_bytes_read" in s
     else _mib_row("reshard_bytes_read")(s)),
    ("MiB floor (CRC pieces touched)", lambda s: _mib_row("load_floor_bytes")(s) if "load_floor_bytes" in s
     else _mib_row("reshard_floor_bytes")(s)),
    ("MiB read by ckptd (through ckptd)", lambda s: _mib_row("load_bytes_daemon")(s) if "load_bytes_daemon" in s
     else _mib_row("reshard_bytes_daemon")(s)),
    ("reads", lambda s: report.fmt(s.get("load_reads", s.get("reshard_reads")), 0)
     if "load_reads" in s or "reshard_reads" in s else "-"),
    ("KiB resident after drop", lambda s: "%.0f" % (s["resident_after_drop_bytes"] / 1024)
     if s.get("resident_after_drop_bytes") is not None else "-"),
    ("load CPU ms", lambda s: report.fmt(s.get("load_cpu_ms", s.get("reshard_cpu_ms", s.get("ram_cpu_ms"))), 0)
     if "load_cpu_ms" in s or "reshard_cpu_ms" in s or "ram_cpu_ms" in s else "-"),
    ("ckptd CPU ms (through ckptd)", lambda s: report.fmt(s.get("load_daemon_cpu_ms",
                                                                s.get("reshard_daemon_cpu_ms")), 0)
     if "load_daemon_cpu_ms" in s or "reshard_daemon_cpu_ms" in s else "-"),
    ("ram_load_s (restarted trainer)", report._val("ram_load_s", 3)),
    ("first_ram_load_s", report._val("first_ram_load_s", 3)),
    ("ram_gibps", report._val("ram_gibps", 2)),
    ("MiB / files from ckptd's memory", lambda s: "%.0f / %d" % (s["ram_bytes_resident"] / MIB,
                                                                 s["ram_files_resident"])
     if s.get("ram_bytes_resident") is not None else "-"),
    ("scale: chunks (largest world)", report._val("scale_chunks", 0)),
    ("scale: manifest MiB (largest world)", lambda s: "%.1f" % (s["scale_manifest_bytes"] / MIB)
     if s.get("scale_manifest_bytes") is not None else "-"),
    ("scale: merge_ms / open_ms (largest world)", lambda s: "%s / %s" % (
        report.fmt(s.get("scale_merge_ms"), 1), report.fmt(s.get("scale_open_ms"), 1))
     if "scale_merge_ms" in s else "-"),
    ("scale: plan one rank / all 1000 ranks ms", lambda s: "%s / %s" % (
        report.fmt(s.get("scale_plan_one_ms"), 2), report.fmt(s.get("scale_plan_all_ms"), 1))
     if "scale_plan_one_ms" in s else "-"),
    ("scale: peak MiB merge / open", lambda s: "%.0f / %.0f" % (
        s["scale_merge_peak_bytes"] / MIB, s["scale_open_peak_bytes"] / MIB)
     if s.get("scale_merge_peak_bytes") is not None else "-"),
    ("scaling_exponent_merge", report._val("scaling_exponent_merge", 3)),
    ("scaling_exponent_plan_all", report._val("scaling_exponent_plan_all", 3)),
]

GIB = 1 << 30
MIB = 1 << 20

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_flag(name):
    v = os.environ.get(name, "").strip().lower()
    return v not in ("", "0", "no", "false")


QUICK = env_flag("QUICK")
SKIP_DCP = env_flag("BENCH_SKIP_DCP")
SKIP_TORCH = env_flag("BENCH_SKIP_TORCH")
SKIP_S3 = env_flag("BENCH_SKIP_S3")
BUILD = os.environ.get("BUILD") or "build"
BUILD = BUILD if os.path.isabs(BUILD) else os.path.join(REPO, BUILD)
# The GPU scenario against the tests' fake CUDA runtime: a check that its
# code runs, never a GPU figure (its targets are not judged).
FAKE_CUDA = env_flag("BENCH_FAKE_CUDA")
FAKE_CUDART = os.path.join(BUILD, "tests", "libfakecudart.so")
PROTOCOL_ROUNDS = 5
ROUNDS = 2 if QUICK else PROTOCOL_ROUNDS
# DCP's FileSystemWriter thread counts tried in every round (BENCH.md).
DCP_THREADS = (1, 2, 4)
# two-jobs: how many times the second job saves alone per round.
ALONE_SAVES = 3
CMD_TIMEOUT = 900
START_TIMEOUT = 1800

# Scenarios: bytes and tensors are per rank.  The QUICK sizes are a smoke
# check only: their ratios are not the benchmark's.
if QUICK:
    SCENARIOS = {
        "save-2g": dict(kind="save", bytes=256 * MIB, tensors=256, ranks=1),
        "save-many": dict(kind="many", bytes=8 * MIB, tensors=1000, ranks=1),
        "save-8ranks": dict(kind="ranks", bytes=32 * MIB, tensors=32, ranks=8),
        "two-jobs": dict(kind="two", bytes=256 * MIB, tensors=256, ranks=1,
                         second_bytes=32 * MIB, second_tensors=32),
        "save-gpu-2g": dict(kind="gpu", bytes=256 * MIB, tensors=256, ranks=1),
        "save-s3-1g": dict(kind="s3", server="moto", bytes=256 * MIB, tensors=256, ranks=1),
        "s3-sink-2g": dict(kind="s3", server="sink", bytes=256 * MIB, tensors=256, ranks=1),
        "load-2g": dict(kind="load", bytes=256 * MIB, tensors=256, ranks=1),
        "reshard-8to3": dict(kind="reshard", bytes=32 * MIB, tensors=32, ranks=8, cols=4096, loaders=3),
        "restore-ram-2g": dict(kind="restore", bytes=256 * MIB, tensors=256, ranks=1),
        "scale-1024": dict(kind="scale", bytes=0, tensors=50, ranks=128, worlds="16,32,64,128"),
        "prune-1000": dict(kind="prune", bytes=256 * MIB, tensors=256, ranks=1, checkpoints=100, keep=10,
                           ckpt_bytes=4 * MIB, ckpt_tensors=4),
        "py-save-2g": dict(kind="pysave", bytes=256 * MIB, tensors=256, ranks=1),
        "py-load-2g": dict(kind="pyload", bytes=256 * MIB, tensors=256, ranks=1),
        "train-overhead": dict(kind="train", width=1024, layers=8, trainable=1, steps=40, every=10, ranks=1,
                               tensors=22),
    }
else:
    SCENARIOS = {
        "save-2g": dict(kind="save", bytes=2 * GIB, tensors=256, ranks=1),
        "save-many": dict(kind="many", bytes=64 * MIB, tensors=10000, ranks=1),
        "save-8ranks": dict(kind="ranks", bytes=256 * MIB, tensors=32, ranks=8),
        "two-jobs": dict(kind="two", bytes=2 * GIB, tensors=256, ranks=1,
                         second_bytes=256 * MIB, second_tensors=32),
        "save-gpu-2g": dict(kind="gpu", bytes=2 * GIB, tensors=256, ranks=1),
        "save-s3-1g": dict(kind="s3", server="moto", bytes=1 * GIB, tensors=256, ranks=1),
        "s3-sink-2g": dict(kind="s3", server="sink", bytes=2 * GIB, tensors=256, ranks=1),
        "load-2g": dict(kind="load", bytes=2 * GIB, tensors=256, ranks=1),
        # 8 ranks x 32 chunks of [512, 4096] fp32: 32 global [4096, 4096]
        # tensors (the size of a 7B model's attention projections).
        "reshard-8to3": dict(kind="reshard", bytes=256 * MIB, tensors=32, ranks=8, cols=4096, loaders=3),
        # load-2g's state, saved and loaded back by a restarted trainer
        # through the daemon's memory, in load-2g's rounds.
        "restore-ram-2g": dict(kind="restore", bytes=2 * GIB, tensors=256, ranks=1),
        # Synthetic checkpoints of 128..1024 ranks x 500 tensors, each sharded
        # over every rank: merge, open and load planning (bench/ckpt_scale.c).
        "scale-1024": dict(kind="scale", bytes=0, tensors=500, ranks=1024, worlds="128,256,512,1024"),
        # 1,000 committed checkpoints (copies of one real 4 MiB checkpoint),
        # a policy that removes 900, locally and on moto; and save-2g's save
        # while the local prune runs, against the same save alone.
        "prune-1000": dict(kind="prune", bytes=2 * GIB, tensors=256, ranks=1, checkpoints=1000, keep=100,
                           ckpt_bytes=4 * MIB, ckpt_tensors=4),
        # Issue 31, the Python package (protocol v3): save-2g's state as a
        # dict of torch CPU tensors saved by ckptd.torch.async_save against
        # DCP and the C client; load-2g's against DCP load; a CPU training
        # loop with saves every `every` steps, against the same loop without
        # saves and with DCP's.  The loop: 8 layers of 2048 x 2048, the last
        # trained (a head fine-tuned: see bench/baselines/train.py), 160 MiB
        # of state, 200 steps, a save every 10.
        # 9 and 11 rounds, not 7: their per-round ratios spread widely on
        # the 2-CPU VM (a save's staging and a 2 s run move by 20-40 %).
        "py-save-2g": dict(kind="pysave", bytes=2 * GIB, tensors=256, ranks=1, rounds=9),
        "py-load-2g": dict(kind="pyload", bytes=2 * GIB, tensors=256, ranks=1),
        "train-overhead": dict(kind="train", width=2048, layers=8, trainable=1, steps=200, every=10, ranks=1,
                               tensors=22, rounds=11),
    }
for _sc in SCENARIOS.values():
    if _sc["kind"] == "train":
        # What it saves (train_state_bytes below), for the disk check.
        _sc["bytes"] = 4 * (_sc["layers"] + 2 * _sc["trainable"]) * (_sc["width"] ** 2 + _sc["width"]) + \
            64 * _sc["trainable"]
# save-8ranks is measured with the library's default copy threads and with
# 2 per client, interleaved in the same rounds; the second is reported as
# a scenario of its own.
TWO_THREADS = "save-8ranks-2threads"
# reshard-8to3 runs in load-2g's rounds (vs_load_2g divides by load-2g's
# figure of the same round), with a variant: the same bytes saved as one
# tensor per rank, whose rows are long enough for a loader to read little
# more than its band (see analyse_reshard), reported as a scenario of its
# own.
WIDE = "reshard-8to3-wide"
# restore-ram-2g runs in load-2g's rounds too (ram_vs_load_2g divides
# load-2g's load time through ckptd, its item "ckptd", by its own, per
# round).
RESTORE = "restore-ram-2g"

T_START = time.monotonic()


def progress(msg):
    sys.stdout.write("[bench %6.1fs] %s\n" % (time.monotonic() - T_START, msg))
    sys.stdout.flush()


class BenchError(Exception):
    pass


def median(vals):
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


# ---- the machine ------------------------------------------------------------

def meminfo(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
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


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def tool_version(argv):
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_commit():
    try:
        p = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=10)
        return p.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_dirty():
    """Whether tracked files differ from the commit (what was built is then
    not exactly the commit), or None."""
    try:
        p = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30)
        return bool(p.stdout.strip()) if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---- processes --------------------------------------------------------------

def die_with_parent():
    """In the child before exec: SIGTERM when run.py dies, so that even a
    SIGKILLed bench leaves no process behind (Linux PR_SET_PDEATHSIG).  Also
    a session of its own, so a timeout kills the whole group."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def log_tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return "(no log)"


class Worker:
    """A long-lived measuring process: commands on stdin, one JSON object
    per line on stdout (other lines are skipped), stderr to a log file.
    Stopped by its PID (its process group) only."""

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.log_path = log_path
        self.buf = b""
        self.dead = None  # the reason, once it failed
        self.log = open(log_path, "w")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.log, env=env, cwd=REPO, preexec_fn=die_with_parent)
        except OSError as e:
            self.log.close()
            raise BenchError("%s: cannot run %s: %s" % (name, argv[0], e))
        self.fd = self.proc.stdout.fileno()

    def fail(self, why):
        self.dead = why
        self.kill()
        raise BenchError("%s: %s" % (self.name, why))

    def _line(self, deadline):
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail("no answer within %.0f s" % (deadline - self.t_asked))
            r, _, _ = select.select([self.fd], [], [], min(left, 1))
            if not r:
                # Its children may hold stdout open after it died.
                if self.proc.poll() is not None:
                    self.fail("exited with status %s: %s" % (self.proc.returncode, log_tail(self.log_path)))
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                rc = self.proc.wait()
                self.fail("exited with status %s: %s" % (rc, log_tail(self.log_path)))
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace")

    def read(self, timeout=CMD_TIMEOUT):
        """The next JSON object it prints; BenchError if it fails, exits or
        says {"error": ...}."""
        if self.dead:
            raise BenchError("%s: not running (%s)" % (self.name, self.dead))
        self.t_asked = time.monotonic()
        deadline = self.t_asked + timeout
        while True:
            line = self._line(deadline).strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if "error" in obj:
                raise BenchError("%s: %s" % (self.name, obj["error"]))
            return obj

    def has_output(self):
        """Whether a line is already waiting (without blocking)."""
        if b"\n" in self.buf:
            return True
        r, _, _ = select.select([self.fd], [], [], 0)
        return bool(r)

    def send(self, line):
        if self.dead:
            raise BenchError("%s: not running (%s)" % (self.name, self.dead))
        try:
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            self.fail("cannot send '%s': %s" % (line, e))

    def cmd(self, line, timeout=CMD_TIMEOUT):
        self.send(line)
        return self.read(timeout)

    def ready(self, timeout=START_TIMEOUT):
        obj = self.read(timeout)
        if obj.get("event") != "ready":
            self.fail("expected a ready line, got %r" % obj)
        return obj

    def kill(self):
        """SIGKILL to its process group: the worker and whatever it
        started (DCP's ranks and checkpoint processes outlive their parent
        otherwise).  The group keeps the worker's PID as its id while any
        member lives, so this never reaches another process."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def pause(self, stop=True):
        """SIGSTOP (stop) or SIGCONT to its process group: a worker that
        must not use the CPUs while another is measured (its children,
        e.g. DCP's checkpoint process, with it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self, timeout=120):
        """quit, then SIGKILL to its group if it has not exited in time."""
        if self.proc.poll() is None and not self.dead:
            try:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                progress("%s did not exit %d s after quit: SIGKILL" % (self.name, timeout))
        self.kill()
        self.log.close()
        return self.proc.returncode


class Daemon:
    """A private ckptd on its own socket and data directory, one per
    scenario (so its max_loop_stall_ms is that scenario's).  stop() is
    always called and kills by PID only."""

    def __init__(self, run_dir, data, arena_max, arena_total, root=None, extra_conf=(), env=None):
        self.run_dir = run_dir
        self.data = data
        self.root = root or data  # an s3:// root for the S3 scenarios
        self.extra_conf = list(extra_conf)
        self.env = env
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
            f.write("# written by bench/run.py for one scenario\n")
            f.write("socket = %s\n" % self.socket)
            f.write("socket_mode = 0600\n")
            f.write("root = %s\n" % self.root)
            f.write("state_dir = %s\n" % os.path.join(os.path.dirname(self.conf), "state"))
            f.write("arena_max = %dM\n" % (self.arena_max // MIB))
            f.write("arena_total = %dM\n" % (self.arena_total // MIB))
            # Every client of the bench is one uid's: its share must hold
            # every arena the scenario planned (unset, it is half of
            # arena_total, and a second client of the same size got what
            # was left of that half: 120 of 273 MiB, seen in py-save-2g).
            f.write("arena_per_uid = %dM\n" % (self.arena_total // MIB))
            f.write("commit_deadline = 10m\n")
            for line in self.extra_conf:
                f.write(line + "\n")
        self.log = open(self.log_path, "a")
        argv = [os.path.join(BUILD, "ckptd"), "-c", self.conf]
        if os.environ.get("BENCH_CKPTD_VERBOSE", "0") not in ("", "0"):
            argv.append("-v")  # debug lines in ckptd.log: long loop rounds, with what preceded them
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError("ckptd exited with status %d at start:\n%s"
                                 % (self.proc.returncode, log_tail(self.log_path)))
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise BenchError("ckptd did not accept connections on %s within %d s:\n%s"
                                 % (self.socket, timeout, log_tail(self.log_path)))
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

    def status(self):
        """The daemon's status JSON (ckptctl status --json)."""
        ctl = os.path.join(BUILD, "ckptctl")
        if not os.access(ctl, os.X_OK):
            raise BenchError("%s is missing" % ctl)
        try:
            p = subprocess.run([ctl, "-s", self.socket, "status", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BenchError("ckptctl status: %s" % e)
        if p.returncode != 0:
            raise BenchError("ckptctl status failed (exit %d): %s" % (p.returncode, p.stderr.strip()[-300:]))
        try:
            return json.loads(p.stdout)
        except ValueError:
            raise BenchError("ckptctl status --json printed no JSON: %r" % p.stdout[:200])

    def stop(self, wait=15):
        """SIGTERM, then SIGKILL after `wait` seconds.  Returns the exit
        status, or None if it was not running any more."""
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


def find_key(obj, key):
    """The first value of `key` in a JSON object, top level first."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            if isinstance(v, (dict, list)):
                found = find_key(v, key)
                if found is not None:
                    return found
    elif isinstance(obj, list):
        for v in obj:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


# ---- measurements -----------------------------------------------------------

def arena_for(nbytes, tensors):
    """What ckpt_bench asks for by default: the whole shard file (data,
    ~256 bytes of header per tensor, rounding), so a save never waits on
    backpressure."""
    return nbytes + tensors * 256 + 8 + MIB + 16 * MIB


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


def worker_env(ranks, gpu=False):
    """Every measuring process gets the same CPU-only torch settings (with
    gpu: the devices this process sees, and for BENCH_FAKE_CUDA the fake
    runtime), and LOCAL_WORLD_SIZE = the ranks of its job on this machine
    (the library's default copy threads depend on it)."""
    env = dict(os.environ)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif FAKE_CUDA:
        env["CKPT_CUDART"] = FAKE_CUDART
    threads = str(max(1, cpus() // ranks))
    env["OMP_NUM_THREADS"] = threads
    env["MKL_NUM_THREADS"] = threads
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if ranks > 1:
        env["LOCAL_WORLD_SIZE"] = str(ranks)
    else:
        env.pop("LOCAL_WORLD_SIZE", None)
    return env


def run_fio(argv):
    """Runs fio (argv, with --output-format=json --group_reporting) within
    CMD_TIMEOUT and returns its first (grouped) job's JSON; BenchError if
    it fails, times out or reports a job error."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent)
    try:
        out, err = p.communicate(timeout=CMD_TIMEOUT)
    except BaseException as e:
        # fio's jobs are processes of its own group: stop them all.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise BenchError("fio timed out after %d s" % CMD_TIMEOUT)
        raise
    start = out.find("{")
    try:
        d = json.loads(out[start:]) if start >= 0 else None
    except ValueError:
        d = None
    if p.returncode != 0 or not d:
        raise BenchError("fio failed (exit %d): %s" % (p.returncode, err.strip()[-300:]))
    job = d["jobs"][0]
    if job.get("error"):
        raise BenchError("fio job error %s: %s" % (job["error"], err.strip()[-300:]))
    return job


def fio_write(directory, bytes_per_rank, ranks, depth):
    """fio's best durable write of the scenario's bytes (BENCH.md): io_uring,
    O_DIRECT, 8 MiB blocks, registered buffers and file, fallocate, a fresh
    file per job (one job per rank), end_fsync (counted in fio's runtime).
    Returns {"gibps", ...}."""
    fio = shutil.which("fio")
    if not fio:
        raise BenchError("fio not found")
    name = "ckpt-bench-fio-%d" % os.getpid()

    def clean():
        for f in os.listdir(directory):
            if f.startswith(name + "."):
                os.unlink(os.path.join(directory, f))

    argv = [fio, "--name=" + name, "--directory=" + directory, "--ioengine=io_uring", "--direct=1",
            "--rw=write", "--bs=8m", "--size=%d" % bytes_per_rank, "--numjobs=%d" % ranks,
            "--iodepth=%d" % depth, "--fixedbufs=1", "--registerfiles=1", "--fallocate=native",
            "--end_fsync=1", "--group_reporting", "--output-format=json"]
    clean()
    try:
        w = run_fio(argv)["write"]
    finally:
        clean()
    want = bytes_per_rank * ranks
    if w["io_bytes"] != want or w["runtime"] <= 0:
        raise BenchError("fio wrote %d bytes in %d ms, expected %d" % (w["io_bytes"], w["runtime"], want))
    return {"gibps": w["io_bytes"] / GIB / (w["runtime"] / 1e3), "runtime_ms": w["runtime"],
            "depth": depth}


def sectors_written(directory):
    """Sectors written so far to the block device that holds `directory`
    (/sys/dev/block/MAJ:MIN/stat, field 7), or None."""
    st = os.stat(directory)
    try:
        with open("/sys/dev/block/%d:%d/stat" % (os.major(st.st_dev), os.minor(st.st_dev))) as f:
            return int(f.read().split()[6])
    except (OSError, ValueError, IndexError):
        return None


def copy_during_write(ckpt, directory, nbytes, depth, cname="default"):
    """Not a limit: the client's copy (streaming stores, its threads and
    piece size) timed while fio writes to the data directory as the daemon
    does (O_DIRECT, 8 MiB blocks, io_uring at the daemon's depth, fixed
    buffers).  A save stages while its first bytes drain, so this is what
    the copy can do beside a disk written at full speed on this machine.
    fio runs until the copy is done; the copy starts once fio has written
    64 MiB, and the result says how fast the disk was written during it."""
    fio = shutil.which("fio")
    if not fio:
        raise BenchError("fio not found")
    if sectors_written(directory) is None:
        raise BenchError("cannot read the write counter of the disk under %s" % directory)
    name = "ckpt-bench-bgfio-%d" % os.getpid()
    path = os.path.join(directory, name)
    argv = [fio, "--name=" + name, "--filename=" + path, "--ioengine=io_uring", "--direct=1",
            "--rw=write", "--bs=8m", "--size=%d" % min(nbytes, 2 * GIB), "--iodepth=%d" % depth,
            "--fixedbufs=1", "--registerfiles=1", "--fallocate=native", "--time_based", "--runtime=60",
            "--thread",  # one process: fio forks each job into a session of its own otherwise
            "--output=/dev/null"]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent)
    try:
        s0 = sectors_written(directory)
        t0 = time.monotonic()
        while (sectors_written(directory) or 0) - s0 < (64 * MIB) // 512:
            if p.poll() is not None:
                raise BenchError("background fio exited (%d): %s" % (p.returncode, p.stderr.read()[-300:]))
            if time.monotonic() - t0 > 30:
                raise BenchError("background fio wrote less than 64 MiB in 30 s")
            time.sleep(0.005)
        a, ta = sectors_written(directory), time.monotonic()
        res = ckpt.cmd("copy stream %s" % cname)
        b, tb = sectors_written(directory), time.monotonic()
        if p.poll() is not None:
            raise BenchError("background fio exited during the copy (%d)" % p.returncode)
        res["write_gibps_during"] = (round((b - a) * 512 / GIB / (tb - ta), 3)
                                     if a is not None and b is not None else None)
        return res
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.kill()
        p.communicate()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# ---- rounds -----------------------------------------------------------------

SETTLE_LIMIT_S = 20.0


def free_bytes(path):
    """Free bytes of the file system holding path (None without a path)."""
    if not path:
        return None
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def round_order(m, n, r):
    """The order of m measurements in round r of n: the items taken with a
    step (0, step, 2 * step, ... mod m), rotated by an offset.  The offset
    moves every measurement across the order over the rounds; the step, one
    of the numbers coprime to m in turn (1, m - 1, then the others), changes
    which measurement runs right before which.  A plain rotation keeps every measurement behind
    the same neighbour in every round, so whatever one measurement leaves
    behind (a file system still freeing its blocks, a peer's processes still
    winding down) would always land on the same one."""
    units = [u for u in range(1, m + 1) if math.gcd(u, m) == 1] if m > 1 else [1]
    steps = [1] + ([m - 1] if m > 2 else []) + [u for u in units if u not in (1, m - 1)]
    k = (r * max(1, m // n)) % m
    step = steps[r % len(steps)]
    base = [(i * step) % m for i in range(m)]
    return base[k:] + base[:k]


class Rounds:
    """Runs named measurements in rounds with a changing order and keeps
    every figure: rounds[r] = {"order": [...], "figures": {item: {...}},
    "errors": {item: "..."}}.  A measurement whose worker has died is
    skipped in later rounds (its figures stay missing, with the reason)."""

    def __init__(self, scenario, items, data_dir=None, blocks=(), no_warmup=(), flip_blocks=False):
        self.scenario = scenario
        self.items = items  # [(name, function, worker or None)]
        self.no_warmup = set(no_warmup)
        # flip_blocks: a block runs in its given order in even rounds and
        # reversed in odd ones (instead of rotated), so that its first two
        # members are always next to each other and each goes first in
        # every other round (rotating a block of 7 put the same one first
        # in 6 of 7 rounds).
        self.flip_blocks = flip_blocks
        # Units of the order: a block (names measured back to back) or one
        # item.  A ratio of two figures taken in one round is only as good
        # as the machine was the same for both; on this VM the speed of
        # memory moves by 20-40% over tens of seconds (other guests, the
        # host taking back idle pages), so the measurements a ratio pairs
        # run next to each other, in an order that changes every round.
        by_name = {i[0]: i for i in items}
        in_block = set()
        self.units = []
        for b in blocks:
            members = [by_name[x] for x in b if x in by_name]
            if members:
                self.units.append(members)
                in_block.update(m[0] for m in members)
        self.units += [[i] for i in items if i[0] not in in_block]
        self.rounds = []
        self.min_mem_available = meminfo("MemAvailable")
        self.data_dir = data_dir
        self.free_at_start = free_bytes(data_dir)
        self.settle_timeouts = 0

    def settle(self):
        """Waits (bounded) until the data directory's file system has its
        free space back to what it had before the first measurement (less
        64 MiB for other users of the disk); returns the ms waited.  Every
        measurement removes its files before it returns, but a removal can
        finish later than the unlink: fio's files are still held by its
        io_uring instance (--registerfiles=1), whose teardown the kernel
        completes after fio has exited, so their blocks are freed (and, with
        the `discard` mount option, discarded) a few hundred ms later, during
        whatever runs next.  Measured here: the writer right after fio ran
        ~30% slower (2 GiB at 1.5 instead of 2.2 GiB/s)."""
        if self.free_at_start is None:
            return 0.0
        t0 = time.monotonic()
        while free_bytes(self.data_dir) < self.free_at_start - 64 * MIB:
            if time.monotonic() - t0 > SETTLE_LIMIT_S:
                # Something else holds the space: go on from here.
                self.free_at_start = free_bytes(self.data_dir)
                self.settle_timeouts += 1
                break
            time.sleep(0.01)
        return (time.monotonic() - t0) * 1e3

    def run(self, n, failures, notes):
        names = [i[0] for i in self.items]
        for r in range(n):
            order = []
            for u in round_order(len(self.units), n, r):
                unit = self.units[u]
                if self.flip_blocks:
                    order += unit[::-1] if r % 2 else unit
                    continue
                k = r % len(unit)
                unit = unit[k:] + unit[:k]
                order += unit[::-1] if (r // len(unit)) % 2 else unit
            rec = {"order": [o[0] for o in order], "figures": {}, "warmup": {}, "errors": {},
                   "settle_ms": {}}
            for name, fn, worker in order:
                rec["settle_ms"][name] = round(self.settle(), 1)
                if worker is not None and worker.dead:
                    rec["errors"][name] = "skipped: %s died (%s)" % (worker.name, worker.dead.splitlines()[0])
                    if name.startswith("ckptd"):
                        failures.append("%s round %d, %s: %s" % (self.scenario, r + 1, name, rec["errors"][name]))
                    continue
                try:
                    # An untimed run first, then the timed one.  This VM's
                    # host takes back guest memory that sits idle for ~10 s
                    # or more: the first pass over a 2 GiB buffer after such
                    # a pause ran 2-2.5x slower than the next, in 3 of 6
                    # tries after 15-30 s (and a round is longer than that).
                    # Every measurement, peers included, gets the same
                    # warm-up, and its figures are kept ("warmup"), except
                    # those named in no_warmup (measurements that pass over
                    # no large buffer: their warm-up runs once, before round
                    # 1).
                    if name in self.no_warmup:
                        rec["warmup"][name] = None
                    else:
                        rec["warmup"][name] = fn()
                        self.settle()
                    rec["figures"][name] = fn()
                    avail = meminfo("MemAvailable")
                    if avail is not None and (self.min_mem_available is None or avail < self.min_mem_available):
                        self.min_mem_available = avail
                except BenchError as e:
                    rec["errors"][name] = str(e)
                    msg = "%s round %d, %s: %s" % (self.scenario, r + 1, name, e)
                    progress("FAILED " + msg.splitlines()[0])
                    if name.startswith("ckptd"):
                        failures.append(msg)
                    else:
                        notes.append(msg)
            self.rounds.append(rec)
            progress("%s round %d/%d: %s" % (self.scenario, r + 1, n, summary(rec, names)))

    def note_settling(self, notes):
        if self.settle_timeouts:
            notes.append("%s: the data directory's free space did not come back within %d s before a "
                         "measurement %d time(s) (something else was using the disk): those measurements "
                         "may overlap another's file removal" % (self.scenario, SETTLE_LIMIT_S,
                                                                 self.settle_timeouts))

    def series(self, item, key):
        """item's `key` per round (None where it did not run)."""
        return [rd["figures"].get(item, {}).get(key) for rd in self.rounds]


def summary(rec, names):
    parts = []
    for name in names:
        f = rec["figures"].get(name)
        if f is None:
            parts.append("%s failed" % name)
        elif "committed_ms" in f and "staged_ms" in f:
            parts.append("%s %.0f/%.0f ms" % (name, f["staged_ms"], f["committed_ms"]))
        elif "staged_ms" in f:
            parts.append("%s staged %.1f ms" % (name, f["staged_ms"]))
        elif "gibps" in f:
            parts.append("%s %.2f GiB/s" % (name, f["gibps"]))
        elif "seconds" in f:
            parts.append("%s %.2f s" % (name, f["seconds"]))
    return ", ".join(parts)


def ratio(num, den):
    if num is None or den is None or den <= 0:
        return None
    return num / den


def spread(per_round, ceilings=None, ceiling=None):
    """{"median", "min", "max", "ceiling", "rounds"} of per-round values;
    ceiling: the median of per-round ceilings, or the fixed value given."""
    vals = [v for v in per_round if v is not None]
    if ceilings is not None:
        ceiling = median(ceilings)
    return {"median": median(vals), "min": min(vals) if vals else None, "max": max(vals) if vals else None,
            "ceiling": ceiling, "rounds": len(vals)}


def best_of(rounds, items, key, higher=True):
    """Of several measurements of one thing (items), the one with the best
    median `key`: returns (item, its median, its per-round list, {item:
    median})."""
    meds = {i: median(rounds.series(i, key)) for i in items}
    have = [i for i in items if meds[i] is not None]
    if not have:
        return None, None, [None] * len(rounds.rounds), meds
    best = max(have, key=lambda i: meds[i]) if higher else min(have, key=lambda i: meds[i])
    return best, meds[best], rounds.series(best, key), meds


# ---- scenarios --------------------------------------------------------------

def memory_plan(sc, clients, uring_depth):
    """Bytes of memory the workers of a save scenario hold at once (from
    what they allocate; the per-process figures were measured with the CUDA
    build of torch from PyPI): ckpt_bench (per rank: the state, the limits'
    memfd, one arena per client), the peers (per rank: the state and
    torch's own memory; DCP adds its shared-memory stager and one
    checkpoint process per rank) and fio (its buffers: depth x 8 MiB per
    job, at twice the daemon's depth)."""
    ranks, nbytes = sc["ranks"], sc["bytes"]
    arena = arena_for(nbytes, sc["tensors"])
    return {"ckpt_bench": ranks * (2 * nbytes + clients * arena) + 64 * MIB,
            "peers": ranks * (nbytes + 200 * MIB) + 200 * MIB,
            "dcp": ranks * (nbytes + 400 * MIB),
            "fio": ranks * 2 * uring_depth * 8 * MIB,
            "margin": GIB}


def start_worker(name, argv, run_dir, env, notes):
    try:
        return Worker(name, argv, os.path.join(run_dir, name + ".log"), env=env)
    except BenchError as e:
        notes.append(str(e))
        return None


def close_workers(workers, notes):
    """Stops every worker; an unexpected exit status becomes a note."""
    for w in workers:
        rc = w.close()
        if rc not in (0, None) and not w.dead:
            notes.append("%s exited with status %s: %s" % (w.name, rc, log_tail(w.log_path, 3)))


def await_ready(w, notes, what):
    """The worker's ready line, or None (worker stopped, note added)."""
    if w is None:
        return None
    try:
        return w.ready()
    except BenchError as e:
        notes.append("%s could not start: %s" % (what, e))
        return None


def ckpt_argv(daemon, nbytes, tensors, ranks, clients, arena, root=None):
    argv = [os.path.join(BUILD, "bench", "ckpt_bench"), "--socket", daemon.socket, "--root", root or daemon.root,
            "--bytes", str(nbytes), "--tensors", str(tensors), "--ranks", str(ranks),
            "--arena", str(arena), "--timeout", str(CMD_TIMEOUT)]
    for c in clients:
        argv += ["--client", c]
    return argv


def loop_stall(daemon, notes):
    """max_loop_stall_ms from the daemon's status, or None with a note."""
    try:
        st = daemon.status()
    except BenchError as e:
        notes.append("max_loop_stall_ms: %s" % e)
        return None, None
    v = find_key(st, "max_loop_stall_ms")
    if v is None:
        notes.append("max_loop_stall_ms: this ckptd's status has no such field yet")
    return v, st


def save_scenario(name, sc, daemon, py, run_dir, failures):
    """save-2g, save-many, save-8ranks: ckptd, the two limits and the two
    peers on the same bytes, in rounds.  Returns {scenario name: result}."""
    ranks, nbytes, tensors = sc["ranks"], sc["bytes"], sc["tensors"]
    total = nbytes * ranks
    notes = []
    detail = {}
    env = worker_env(ranks)
    clients = ["default:0"] + (["2threads:2"] if sc["kind"] == "ranks" else [])
    uring_depth = None
    try:
        uring_depth = find_key(daemon.status(), "uring_depth")
    except BenchError as e:
        notes.append("daemon status: %s" % e)
    if not isinstance(uring_depth, int) or uring_depth < 1:
        raise BenchError("cannot read the daemon's uring_depth from its status")

    # What the workers will hold at once decides what can run: on a machine
    # without that memory, the OOM killer would pick among every process,
    # other users' included.
    plan = memory_plan(sc, len(clients), uring_depth)
    avail = meminfo("MemAvailable")
    want_torch = bool(py) and not SKIP_TORCH
    want_dcp = bool(py) and not SKIP_DCP
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    detail["mem_available_gib_at_start"] = round(avail / GIB, 2) if avail is not None else None
    if avail is not None:
        base = plan["ckpt_bench"] + plan["fio"] + plan["margin"]
        if want_dcp and avail < base + plan["peers"] + plan["dcp"]:
            want_dcp = False
            notes.append("DCP left out: %.1f GiB of memory available, the scenario with DCP wants ~%.1f GiB"
                         % (avail / GIB, (base + plan["peers"] + plan["dcp"]) / GIB))
        if want_torch and avail < base + plan["peers"]:
            want_torch = False
            notes.append("torch.save left out: %.1f GiB of memory available, the scenario with it wants "
                         "~%.1f GiB" % (avail / GIB, (base + plan["peers"]) / GIB))
        if avail < base:
            notes.append("only %.1f GiB of memory available, ckpt_bench and fio want ~%.1f GiB"
                         % (avail / GIB, base / GIB))

    # Start-up (before round 1), all at once: the workers build their
    # states, connect, make their buffers and start their process pools.
    progress("%s: starting ckpt_bench%s%s" % (name, ", torch.save" if want_torch else "",
                                              ", DCP" if want_dcp else ""))
    ckpt = start_worker("ckpt_bench", ckpt_argv(daemon, nbytes, tensors, ranks, clients,
                                                arena_for(nbytes, tensors)), run_dir, env, notes)
    peers = None
    if want_torch or want_dcp:
        peers = start_worker("peers", [py, os.path.join(REPO, "bench", "baselines", "peers.py"),
                                       "--dir", daemon.data, "--bytes", str(nbytes), "--tensors",
                                       str(tensors), "--procs", str(ranks)] + ([] if want_dcp else ["--no-dcp"]),
                             run_dir, env, notes)
    workers = [w for w in (ckpt, peers) if w]
    results = {}
    client_notes = {}
    try:
        ready = await_ready(ckpt, notes, "ckpt_bench")
        if ready is None:
            raise BenchError("ckpt_bench did not start: %s" % notes[-1])
        peers_ready = await_ready(peers, notes, "the torch.save/DCP worker")
        if peers_ready is None:
            want_torch = want_dcp = False
        elif want_dcp and peers_ready.get("no_dcp"):
            notes.append("DCP: %s" % peers_ready["no_dcp"])
            want_dcp = False
        have_torch, have_dcp = want_torch, want_dcp
        detail["ckpt_bench"] = ready
        detail["peers"] = {"ready": peers_ready}
        detail["uring_depth"] = uring_depth
        for cname, c in ready["clients"].items():
            if c["copy_threads"] != c["expected_copy_threads"]:
                client_notes[cname] = ("client '%s' runs %d copy threads (counted), %s gives %d: the copy "
                                       "limit uses %d" % (cname, c["copy_threads"],
                                                          "the documented default" if c["threads_asked"] == 0
                                                          else "the number asked for",
                                                          c["expected_copy_threads"], c["copy_threads"]))
        if not ready["limit_buffer"]["registered"]:
            notes.append("built-in writer: buffers not registered (%s)"
                         % ready["limit_buffer"].get("not_registered"))

        # Warm-ups: the first save of every process is not in the medians.
        warm = {}
        progress("%s: warm-up saves" % name)
        for cname in [c.split(":")[0] for c in clients]:
            warm["ckptd_" + cname] = ckpt.cmd("save %s" % cname)
        if sc["kind"] == "many":
            warm["ckptd_one"] = ckpt.cmd("save default one")
        for method in ("memcpy", "stream"):
            ckpt.cmd("copy %s default" % method)
        if have_torch:
            try:
                warm["torch"] = peers.cmd("torch_save")
            except BenchError as e:
                notes.append("torch.save warm-up: %s" % e)
        if have_dcp:
            # One warm-up per thread count: DCP's stager cache and its
            # checkpoint process settle over the first saves.
            for t in DCP_THREADS:
                try:
                    warm["dcp_t%d" % t] = peers.cmd("dcp %d" % t)
                except BenchError as e:
                    notes.append("DCP warm-up: %s" % e)
                    break
        stall_before, _ = loop_stall(daemon, [])

        # The measurements of one round.
        # Each ckptd save runs in a block next to what its ratio divides it
        # by: the copy limits of its client (and, for save-many, the
        # one-tensor save).
        items = [("ckptd", lambda: ckpt.cmd("save default"), ckpt)]
        blocks = [["ckptd"]]
        if sc["kind"] == "many":
            items.append(("ckptd_one", lambda: ckpt.cmd("save default one"), ckpt))
        if sc["kind"] == "ranks":
            items.append(("ckptd_2threads", lambda: ckpt.cmd("save 2threads"), ckpt))
            blocks.append(["ckptd_2threads"])
        for block, cname in zip(blocks, [c.split(":")[0] for c in clients]):
            suffix = "" if cname == "default" else "_" + cname
            for method in ("memcpy", "stream"):
                items.append(("copy_%s%s" % (method, suffix),
                              (lambda m=method, c=cname: ckpt.cmd("copy %s %s" % (m, c))), ckpt))
                block.append("copy_%s%s" % (method, suffix))
        if sc["kind"] == "many":
            blocks[0].append("ckptd_one")
        if sc["kind"] == "save":
            items.append(("copy_during_write",
                          lambda: copy_during_write(ckpt, daemon.data, nbytes, uring_depth), ckpt))
            blocks[0].append("copy_during_write")
        items.append(("disk_builtin", lambda: ckpt.cmd("write %s %d" % (daemon.data, uring_depth)), ckpt))
        for mult in (1, 2):
            items.append(("disk_fio_d%d" % (uring_depth * mult),
                          (lambda d=uring_depth * mult: fio_write(daemon.data, nbytes, ranks, d)), None))
        if have_torch:
            items.append(("torch", lambda: peers.cmd("torch_save"), peers))
        if have_dcp:
            for t in DCP_THREADS:
                items.append(("dcp_t%d" % t, (lambda t=t: peers.cmd("dcp %d" % t)), peers))

        rounds = Rounds(name, items, daemon.data, blocks)
        rounds.run(ROUNDS, failures, notes)
        rounds.note_settling(notes)
        stall, status = loop_stall(daemon, notes)
        detail["max_loop_stall_ms_after_warmup"] = stall_before
        detail["min_mem_available_gib"] = (round(rounds.min_mem_available / GIB, 2)
                                           if rounds.min_mem_available is not None else None)
        detail["status_totals"] = (status or {}).get("totals")
        detail["max_loop_cpu_ms"] = find_key(status, "max_loop_cpu_ms") if status else None
    finally:
        close_workers(workers, notes)

    variants = [("default", name)]
    if sc["kind"] == "ranks":
        variants.append(("2threads", TWO_THREADS))
    for cname, sname in variants:
        vnotes = list(notes) + ([client_notes[cname]] if cname in client_notes else [])
        r = analyse_save(sname, sc, rounds, warm, cname, ready, have_torch, have_dcp,
                         vnotes, detail, uring_depth, stall, py)
        results[sname] = r
    if sc["kind"] == "ranks":
        results[TWO_THREADS]["notes"].append(
            "measured in the rounds of save-8ranks, interleaved with it: the same clients' "
            "states saved through a second job whose clients copy with 2 threads each")
        results[name]["notes"].append(
            "copy threads: the library's default (copy_threads 0, LOCAL_WORLD_SIZE=%d); "
            "%s has 2 per client" % (ranks, TWO_THREADS))
    return results


def dcp_figures(rounds, r):
    """DCP's figures into result r: the thread count with the best median
    committed_ms, and the medians of that count's call/staged/committed ms.
    Returns (the count's item name, its per-round figures by key, every
    count's median committed_ms)."""
    dcp_best, _, _, dcp_meds = best_of(rounds, ["dcp_t%d" % t for t in DCP_THREADS], "committed_ms",
                                       higher=False)
    dcp = {k: (rounds.series(dcp_best, k) if dcp_best else [None] * len(rounds.rounds))
           for k in ("call_ms", "staged_ms", "committed_ms")}
    for k in ("call_ms", "staged_ms", "committed_ms"):
        r["dcp_async_" + k] = median(dcp[k])
    r["dcp_thread_count"] = int(dcp_best[len("dcp_t"):]) if dcp_best else None
    return dcp_best, dcp, dcp_meds


def dcp_null_note(r, notes, py, have_dcp):
    """Why DCP's figures are null, if they are."""
    if r["dcp_async_committed_ms"] is None:
        notes.append("dcp_async_*: %s" % ("skipped (BENCH_SKIP_DCP)" if SKIP_DCP else
                                          "no bench Python environment" if not py else
                                          "DCP did not run (see notes)" if not have_dcp
                                          else "no DCP measurement succeeded"))


def analyse_save(sname, sc, rounds, warm, cname, ready, have_torch, have_dcp, notes, shared_detail,
                 uring_depth, stall, py):
    """One scenario's JSON from the rounds (figures, per-round ratios)."""
    ranks, total = sc["ranks"], sc["bytes"] * sc["ranks"]
    gib = total / GIB
    suffix = "" if cname == "default" else "_" + cname
    ck = "ckptd" + suffix
    cl = ready["clients"][cname]
    r = {"bytes": total, "tensors": sc["tensors"], "ranks": ranks, "rounds": len(rounds.rounds)}
    if ranks > 1:
        r["bytes_per_rank"] = sc["bytes"]
    for k in ("call_ms", "staged_ms", "committed_ms"):
        r[k] = median(rounds.series(ck, k))
        r["first_" + k] = warm.get("ckptd_" + cname, {}).get(k)
    r["connect_ms"] = cl["connect_ms"]
    r["copy_threads"] = cl["copy_threads"]
    r["slot_bytes"] = cl["slot_bytes"]

    copy_items = ["copy_memcpy" + suffix, "copy_stream" + suffix]
    copy_best, r["copy_limit_gibps"], copy_r, copy_meds = best_of(rounds, copy_items, "gibps")
    disk_items = ["disk_builtin", "disk_fio_d%d" % uring_depth, "disk_fio_d%d" % (2 * uring_depth)]
    disk_best, r["disk_limit_gibps"], disk_r, disk_meds = best_of(rounds, disk_items, "gibps")

    torch_r = rounds.series("torch", "seconds")
    r["torch_save_s"] = median(torch_r)
    r["first_torch_save_s"] = warm.get("torch", {}).get("seconds")
    _, dcp, dcp_meds = dcp_figures(rounds, r)
    for k in ("call_ms", "staged_ms", "committed_ms"):
        r["first_dcp_async_" + k] = warm.get("dcp_t%d" % DCP_THREADS[0], {}).get(k)
    r["max_loop_stall_ms"] = stall
    # The loop's own CPU time in its longest round: a stall far above it
    # was the loop waiting for a CPU (2 cores, many copy threads), not work.
    r["max_loop_cpu_ms"] = shared_detail.get("max_loop_cpu_ms")

    # Per-round ratios.
    per = {k: [] for k in ("staging_vs_copy_limit", "commit_vs_disk_limit", "durable_speedup_vs_torch",
                           "durable_speedup_vs_dcp", "staged_speedup_vs_dcp", "blocking_speedup_vs_dcp")}
    ceil = {k: [] for k in ("durable_speedup_vs_torch", "durable_speedup_vs_dcp", "staged_speedup_vs_dcp")}
    if sc["kind"] == "many":
        per["vs_one_tensor"] = []
    cdw = rounds.series("copy_during_write", "gibps")
    if sc["kind"] == "save":
        per["staging_vs_copy_during_write"] = []
        r["copy_during_write_gibps"] = median(cdw)
    round_ratios = []
    for i, rd in enumerate(rounds.rounds):
        f = rd["figures"].get(ck, {})
        call_s = f.get("call_ms") / 1e3 if f.get("call_ms") else None
        staged_s = f.get("staged_ms") / 1e3 if f.get("staged_ms") else None
        comm_s = f.get("committed_ms") / 1e3 if f.get("committed_ms") else None
        disk_s = ratio(gib, disk_r[i])     # the limit's time for these bytes
        copy_s = ratio(gib, copy_r[i])
        x = {
            "staging_vs_copy_limit": ratio(ratio(gib, staged_s), copy_r[i]),
            "commit_vs_disk_limit": ratio(ratio(gib, comm_s), disk_r[i]),
            "durable_speedup_vs_torch": ratio(torch_r[i], comm_s),
            "durable_speedup_vs_dcp": ratio(dcp["committed_ms"][i], f.get("committed_ms")),
            "staged_speedup_vs_dcp": ratio(dcp["staged_ms"][i], f.get("staged_ms")),
            "blocking_speedup_vs_dcp": ratio(dcp["call_ms"][i], f.get("call_ms")),
        }
        c = {
            "durable_speedup_vs_torch": ratio(torch_r[i], disk_s),
            "durable_speedup_vs_dcp": ratio(dcp["committed_ms"][i] / 1e3 if dcp["committed_ms"][i] else None,
                                            disk_s),
            "staged_speedup_vs_dcp": ratio(dcp["staged_ms"][i] / 1e3 if dcp["staged_ms"][i] else None, copy_s),
        }
        if sc["kind"] == "many":
            x["vs_one_tensor"] = ratio(f.get("committed_ms"), rd["figures"].get("ckptd_one", {}).get("committed_ms"))
        if sc["kind"] == "save":
            x["staging_vs_copy_during_write"] = ratio(ratio(gib, staged_s), cdw[i])
        for k, v in x.items():
            per[k].append(v)
        for k, v in c.items():
            ceil[k].append(v)
        round_ratios.append({"ratios": x, "ceilings": c, "call_s": call_s})
    ratios = {}
    for k in per:
        if k in ceil:
            ratios[k] = spread(per[k], ceilings=[v for v in ceil[k] if v is not None])
        elif k in ("staging_vs_copy_limit", "commit_vs_disk_limit", "vs_one_tensor"):
            # Against a limit (or the same bytes in one tensor), a perfect
            # implementation gets 1.0.
            ratios[k] = spread(per[k], ceiling=1.0)
        else:
            ratios[k] = spread(per[k])
    r["ratios"] = ratios
    if sc["kind"] == "many":
        for k in ("call_ms", "staged_ms", "committed_ms"):
            r["one_tensor_" + k] = median(rounds.series("ckptd_one", k))

    # Why a figure is null.
    if r["copy_limit_gibps"] is None:
        notes.append("copy_limit_gibps: no copy-limit measurement succeeded")
    if r["disk_limit_gibps"] is None:
        notes.append("disk_limit_gibps: neither fio nor the built-in writer succeeded")
    if r["torch_save_s"] is None:
        notes.append("torch_save_s: %s" % ("skipped (BENCH_SKIP_TORCH)" if SKIP_TORCH else
                                           "no bench Python environment" if not py else
                                           "torch.save did not run (see notes)" if not have_torch
                                           else "no torch.save measurement succeeded"))
    dcp_null_note(r, notes, py, have_dcp)
    for k in ("staging_vs_copy_limit", "commit_vs_disk_limit"):
        v = ratios[k]
        above = sum(1 for x in per[k] if x is not None and x > 1.0)
        if v["median"] is not None and v["median"] > 1.0:
            notes.append("%s: median %.2f is above 1.0: ckptd beat the limit, so the limit is not the limit "
                         "on this machine; suspect the limit first (BENCH.md)" % (k, v["median"]))
        elif above:
            notes.append("%s: above 1.0 in %d of %d rounds (max %.2f), median below: the machine's noise "
                         "between the measurements of one round, or a limit that is sometimes weak "
                         "(detail.rounds)" % (k, above, len(per[k]), v["max"]))

    d = dict(shared_detail)
    d["client"] = cname
    d["copy_limit"] = {"method": copy_best, "medians_gibps": copy_meds, "threads_per_rank": cl["copy_threads"],
                       "piece_bytes": cl["slot_bytes"],
                       "stat": "best median of the methods; per round, the best method's figure"}
    d["disk_limit"] = {"method": disk_best, "medians_gibps": disk_meds, "uring_depth": uring_depth,
                       "fio": "io_uring, direct, bs=8m, iodepth=%d and %d, fixedbufs, registerfiles, "
                              "fallocate=native, end_fsync, one fresh file per rank, group_reporting"
                              % (uring_depth, 2 * uring_depth),
                       "builtin": "registered pre-faulted memfd of the checkpoint's size, 8 MiB O_DIRECT "
                                  "writes at depth %d after fallocate, fsync of file(s) and directory, "
                                  "timed from open to the last fsync" % uring_depth,
                       "stat": "best median of the methods; per round, the best method's figure"}
    if sc["kind"] == "save":
        d["copy_during_write"] = {
            "what": "not a limit and not a target: the client's copy (streaming stores, %d threads, %d-byte "
                    "pieces) while fio writes to the data directory at depth %d (O_DIRECT, 8 MiB, io_uring, "
                    "fixed buffers), started once fio has written 64 MiB; a save stages while its first "
                    "bytes drain" % (cl["copy_threads"], cl["slot_bytes"], uring_depth),
            "write_gibps_during": median(rounds.series("copy_during_write", "write_gibps_during"))}
    # Where the CPU went (medians over rounds; ckpt_bench's struct cost):
    # the client's own CPU and the machine's busy time, while a save staged
    # and while each copy ran.
    cost = {}
    for item, key in ((ck, "staging_cost"), ("copy_stream" + suffix, "cost"), ("copy_during_write", "cost")):
        per_round = [rd["figures"].get(item, {}).get(key) for rd in rounds.rounds]
        per_round = [c for c in per_round if c]
        if per_round:
            cost[item] = {f: median([c.get(f) for c in per_round if c.get(f) is not None])
                          for f in ("cpu_ms", "sys_busy_ms", "sys_idle_ms", "sys_steal_ms", "nivcsw")}
    d["cpu"] = cost
    d["dcp"] = {"thread_count": r["dcp_thread_count"], "median_committed_ms_by_thread_count": dcp_meds,
                "tried": list(DCP_THREADS), "stat": "the thread count with the best median committed_ms"}
    d["warmup"] = warm
    d["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                    "settle_ms": rd.get("settle_ms", {}),
                    "ratios": rr["ratios"], "ceilings": rr["ceilings"]}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return r


def two_jobs_scenario(name, sc, daemon, run_dir, failures):
    """A second job's staged_ms (second_bytes) while a first job commits
    (bytes), against the same save alone, in rounds."""
    notes = []
    env = worker_env(1)
    progress("%s: starting two jobs (first %d MiB, second %d MiB)"
             % (name, sc["bytes"] // MIB, sc["second_bytes"] // MIB))
    first = start_worker("first_job", ckpt_argv(daemon, sc["bytes"], sc["tensors"], 1, ["default:0"],
                                                arena_for(sc["bytes"], sc["tensors"])), run_dir, env, notes)
    second = start_worker("second_job", ckpt_argv(daemon, sc["second_bytes"], sc["second_tensors"], 1,
                                                  ["default:0"], arena_for(sc["second_bytes"],
                                                                           sc["second_tensors"])),
                          run_dir, env, notes)
    try:
        rf = await_ready(first, notes, "first job")
        rs = await_ready(second, notes, "second job")
        if rf is None or rs is None:
            raise BenchError("a job did not start: %s" % "; ".join(notes))
        progress("%s: warm-up saves" % name)
        warm = {"first": first.cmd("save default"), "second": second.cmd("save default")}

        def alone():
            saves = [second.cmd("save default") for _ in range(ALONE_SAVES)]
            return {"staged_ms": max(s["staged_ms"] for s in saves),
                    "staged_ms_each": [s["staged_ms"] for s in saves],
                    "committed_ms_each": [s["committed_ms"] for s in saves]}

        def during():
            first.send("save default notify")
            ev = first.read()
            if ev.get("event") != "staged":
                raise BenchError("first job: expected its staged event, got %r" % ev)
            saves = []
            # The second job saves back to back (each to committed) from the
            # moment the first is staged until the first has committed.
            try:
                while True:
                    saves.append(second.cmd("save default"))
                    if first.has_output() or len(saves) >= 100:
                        break
            except BenchError:
                # Collect the first job's result, so that its next command
                # does not read this one's.
                try:
                    first.read()
                except BenchError:
                    pass
                raise
            a = first.read()
            inside = [s for s in saves if a["t_staged_ns"] <= s["t_start_ns"] < a["t_committed_ns"]]
            if not inside:
                raise BenchError("no second-job save started while the first committed")
            return {"staged_ms": max(s["staged_ms"] for s in inside),
                    "staged_ms_each": [s["staged_ms"] for s in inside],
                    "committed_ms_each": [s["committed_ms"] for s in inside],
                    "saves_after_first_committed": len(saves) - len(inside),
                    "first_job_staged_ms": a["staged_ms"], "first_job_committed_ms": a["committed_ms"],
                    "second_started_ms_after_first_staged":
                        (saves[0]["t_start_ns"] - a["t_staged_ns"]) / 1e6,
                    "last_second_committed_ms_after_first_committed":
                        (inside[-1]["t_committed_ns"] - a["t_committed_ns"]) / 1e6}

        rounds = Rounds(name, [("alone", alone, second), ("during", during, first)], daemon.data)
        rounds.run(ROUNDS, failures, notes)
        rounds.note_settling(notes)
        stall, _ = loop_stall(daemon, notes)
    finally:
        for w in (first, second):
            if w:
                rc = w.close()
                if rc not in (0, None) and not w.dead:
                    notes.append("%s exited with status %s: %s" % (w.name, rc, log_tail(w.log_path, 3)))

    alone_r = rounds.series("alone", "staged_ms")
    during_r = rounds.series("during", "staged_ms")
    per = [ratio(d, a) for d, a in zip(during_r, alone_r)]
    r = {"bytes": sc["bytes"], "tensors": sc["tensors"], "second_bytes": sc["second_bytes"],
         "second_tensors": sc["second_tensors"], "rounds": len(rounds.rounds),
         "staged_ms": median(during_r), "alone_staged_ms": median(alone_r),
         "first_job_committed_ms": median(rounds.series("during", "first_job_committed_ms")),
         "max_loop_stall_ms": stall,
         "ratios": {"stall_vs_alone": spread(per, ceiling=1.0)}}
    n_cpus = cpus()
    if r["staged_ms"] is not None and r["alone_staged_ms"] is not None:
        r["stall_excess_ms"] = r["staged_ms"] - r["alone_staged_ms"]
    # A bound, not a target: while the first job commits, the daemon
    # (completions, checksums) and the kernel's writes may take up to one
    # CPU from the second job's copy threads, and a loop that blocks delays
    # the second save's SAVE_BEGIN reply by at most its longest stall.
    bound = None
    if r["alone_staged_ms"] is not None and n_cpus > 1:
        bound = r["alone_staged_ms"] * n_cpus / (n_cpus - 1) + (stall or 0)
    r["bound_ms"] = bound
    notes.append(
        "stall_vs_alone = the second job's worst staged_ms among its saves started while the first "
        "job committed, over its worst of %d saves alone, per round. Not a pass/fail target. On %d "
        "CPUs, the daemon's work for the first job (completions, CRCs) and the kernel's writes can take "
        "up to one CPU from the second job's copy threads, which also share memory bandwidth with the "
        "first job's writes, and a blocked event loop delays the second save's SAVE_BEGIN reply by up "
        "to max_loop_stall_ms: bound_ms = alone x cpus/(cpus-1) + max_loop_stall_ms%s. Whatever the "
        "SAVE_BEGIN reply waits for on the disk (an fsync before the reply queues behind the first "
        "job's journal commit on ext4) comes on top of that bound and is not in max_loop_stall_ms."
        % (ALONE_SAVES, n_cpus, "" if stall is not None else " (stall unknown: taken as 0)"))
    if bound is not None and r["staged_ms"] is not None and r["staged_ms"] > bound:
        notes.append("two-jobs: the second job's staged_ms (%.1f) is above bound_ms (%.1f): it waited on "
                     "something other than CPU and the event loop, most likely the disk before its "
                     "SAVE_BEGIN reply" % (r["staged_ms"], bound))
    r["notes"] = notes
    r["detail"] = {"warmup": warm, "first_job": rf, "second_job": rs,
                   "min_mem_available_gib": (round(rounds.min_mem_available / GIB, 2)
                                             if rounds.min_mem_available is not None else None),
                   "rounds": [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                    "settle_ms": rd.get("settle_ms", {}),
                               "ratios": {"stall_vs_alone": p}} for rd, p in zip(rounds.rounds, per)]}
    return {name: r}


def gpu_scenario(name, sc, daemon, py, run_dir, failures):
    """save-gpu-2g: device tensors saved by ckptd against the D2H limit
    (cudaMemcpyAsync of the same device bytes into pinned memory: one call
    and the engine's pieces, the better median) and DCP async_save of the
    same CUDA tensors, in rounds.  Returns {scenario name: result}."""
    ranks, nbytes, tensors = sc["ranks"], sc["bytes"], sc["tensors"]
    gib = nbytes * ranks / GIB
    notes = []
    detail = {}
    env = worker_env(ranks, gpu=True)
    fake = sc.get("fake", False)
    want_dcp = bool(py) and not SKIP_DCP
    if fake:
        notes.append("%s: measured against the fake CUDA runtime of the tests "
                     "(tests/fakes/fake_cudart.c: device memory is host memory, a stream is a thread "
                     "running memcpy), a check that this scenario's code runs: not a GPU figure, and "
                     "its targets are not judged" % ("BENCH_FAKE_CUDA" if FAKE_CUDA else
                                                     "CKPT_CUDART names the fake runtime"))
        if want_dcp:
            # A real GPU's DCP against the fake's ckptd would be a ratio of
            # two different machines.
            want_dcp = False
            notes.append("DCP left out: the ckptd side runs on the fake CUDA runtime")
    arena = arena_for(nbytes, tensors)
    # ckpt_bench holds the host copy of the state, the limit's buffer and
    # the arena (and, with the fake, the "device" memory); DCP its pinned
    # stager and torch's own memory.
    plan = {"ckpt_bench": ranks * (2 * nbytes + arena + (nbytes if fake else 0)) + 64 * MIB,
            "dcp": ranks * (nbytes + 600 * MIB), "margin": GIB}
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    avail = meminfo("MemAvailable")
    if avail is not None and want_dcp and avail < plan["ckpt_bench"] + plan["dcp"] + plan["margin"]:
        want_dcp = False
        notes.append("DCP left out: %.1f GiB of memory available, the scenario with DCP wants ~%.1f GiB"
                     % (avail / GIB, (plan["ckpt_bench"] + plan["dcp"] + plan["margin"]) / GIB))

    progress("%s: starting ckpt_bench --gpu%s" % (name, ", DCP" if want_dcp else ""))
    ckpt = start_worker("ckpt_bench", ckpt_argv(daemon, nbytes, tensors, ranks, ["default:0"], arena) + ["--gpu"],
                        run_dir, env, notes)
    peers = None
    if want_dcp:
        peers = start_worker("peers", [py, os.path.join(REPO, "bench", "baselines", "peers.py"),
                                       "--dir", daemon.data, "--bytes", str(nbytes), "--tensors", str(tensors),
                                       "--procs", str(ranks), "--device", "cuda"], run_dir, env, notes)
    workers = [w for w in (ckpt, peers) if w]
    warm = {}
    try:
        ready = await_ready(ckpt, notes, "ckpt_bench")
        if ready is None:
            raise BenchError("ckpt_bench --gpu did not start: %s" % notes[-1])
        peers_ready = await_ready(peers, notes, "the DCP worker")
        have_dcp = want_dcp and peers_ready is not None
        if have_dcp and peers_ready.get("no_dcp"):
            notes.append("DCP: %s" % peers_ready["no_dcp"])
            have_dcp = False
        detail["ckpt_bench"] = ready
        detail["peers"] = {"ready": peers_ready}

        progress("%s: warm-up saves" % name)
        warm["ckptd"] = ckpt.cmd("save default")
        for method in ("whole", "chunked"):
            warm["d2h_" + method] = ckpt.cmd("d2h %s default" % method)
        if have_dcp:
            for t in DCP_THREADS:
                try:
                    warm["dcp_t%d" % t] = peers.cmd("dcp %d" % t)
                except BenchError as e:
                    notes.append("DCP warm-up: %s" % e)
                    have_dcp = False
                    break

        # The save runs in a block next to the D2H limit it is divided by.
        items = [("ckptd", lambda: ckpt.cmd("save default"), ckpt)]
        for method in ("whole", "chunked"):
            items.append(("d2h_" + method, (lambda m=method: ckpt.cmd("d2h %s default" % m)), ckpt))
        if have_dcp:
            for t in DCP_THREADS:
                items.append(("dcp_t%d" % t, (lambda t=t: peers.cmd("dcp %d" % t)), peers))
        rounds = Rounds(name, items, daemon.data, [["ckptd", "d2h_whole", "d2h_chunked"]])
        rounds.run(ROUNDS, failures, notes)
        rounds.note_settling(notes)
        stall, status = loop_stall(daemon, notes)
    finally:
        close_workers(workers, notes)

    cl = ready["clients"]["default"]
    fake = fake or bool((ready.get("gpu") or {}).get("fake"))
    if fake and not any("fake CUDA runtime" in n for n in notes):
        notes.append("the CUDA runtime ckpt_bench loaded is the tests' fake: not a GPU figure, and the "
                     "targets are not judged")
    r = {"bytes": nbytes * ranks, "tensors": tensors, "ranks": ranks, "rounds": len(rounds.rounds),
         "fake_cuda": fake, "gpu": ready.get("gpu")}
    for k in ("call_ms", "staged_ms", "committed_ms"):
        r[k] = median(rounds.series("ckptd", k))
        r["first_" + k] = warm.get("ckptd", {}).get(k)
    r["connect_ms"] = cl["connect_ms"]
    r["copy_threads"] = cl["copy_threads"]
    r["slot_bytes"] = cl["slot_bytes"]
    d2h_best, r["d2h_limit_gibps"], d2h_r, d2h_meds = best_of(rounds, ["d2h_whole", "d2h_chunked"], "gibps")
    _, dcp, dcp_meds = dcp_figures(rounds, r)
    r["max_loop_stall_ms"] = stall
    r["max_loop_cpu_ms"] = find_key(status, "max_loop_cpu_ms") if status else None

    per = {k: [] for k in ("staging_vs_d2h_limit", "staged_speedup_vs_dcp", "blocking_speedup_vs_dcp",
                           "durable_speedup_vs_dcp")}
    ceil = []
    round_ratios = []
    for i, rd in enumerate(rounds.rounds):
        f = rd["figures"].get("ckptd", {})
        staged_s = f.get("staged_ms") / 1e3 if f.get("staged_ms") else None
        x = {"staging_vs_d2h_limit": ratio(ratio(gib, staged_s), d2h_r[i]),
             "staged_speedup_vs_dcp": ratio(dcp["staged_ms"][i], f.get("staged_ms")),
             "blocking_speedup_vs_dcp": ratio(dcp["call_ms"][i], f.get("call_ms")),
             "durable_speedup_vs_dcp": ratio(dcp["committed_ms"][i], f.get("committed_ms"))}
        # A perfect save stages in the D2H limit's time.
        c = ratio(dcp["staged_ms"][i] / 1e3 if dcp["staged_ms"][i] else None, ratio(gib, d2h_r[i]))
        for k, v in x.items():
            per[k].append(v)
        if c is not None:
            ceil.append(c)
        round_ratios.append({"ratios": x, "ceilings": {"staged_speedup_vs_dcp": c}})
    r["ratios"] = {"staging_vs_d2h_limit": spread(per["staging_vs_d2h_limit"], ceiling=1.0),
                   "staged_speedup_vs_dcp": spread(per["staged_speedup_vs_dcp"], ceilings=ceil),
                   "blocking_speedup_vs_dcp": spread(per["blocking_speedup_vs_dcp"]),
                   "durable_speedup_vs_dcp": spread(per["durable_speedup_vs_dcp"])}
    if r["d2h_limit_gibps"] is None:
        notes.append("d2h_limit_gibps: no D2H measurement succeeded")
    dcp_null_note(r, notes, py, have_dcp)
    v = r["ratios"]["staging_vs_d2h_limit"]
    if v["median"] is not None and v["median"] > 1.0:
        notes.append("staging_vs_d2h_limit: median %.2f is above 1.0: ckptd beat the limit, so the limit is "
                     "not the limit on this machine; suspect the limit first (BENCH.md)" % v["median"])
    detail["d2h_limit"] = {"method": d2h_best, "medians_gibps": d2h_meds, "piece_bytes": cl["slot_bytes"],
                           "what": "cudaMemcpyAsync device to host of the same device bytes into a memfd "
                                   "pinned with cudaHostRegister, on one non-blocking stream: one call "
                                   "(whole) or one per slot-sized piece (chunked), then "
                                   "cudaStreamSynchronize; timed from the first call",
                           "stat": "best median of the methods; per round, the best method's figure"}
    detail["dcp"] = {"thread_count": r["dcp_thread_count"], "median_committed_ms_by_thread_count": dcp_meds,
                     "tried": list(DCP_THREADS), "stat": "the thread count with the best median committed_ms"}
    detail["warmup"] = warm
    detail["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                         "settle_ms": rd.get("settle_ms", {}), "ratios": rr["ratios"], "ceilings": rr["ceilings"]}
                        for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = detail
    return {name: r}


# ---- loads ------------------------------------------------------------------

# DCP layouts the load baseline reads: a checkpoint saved once (untimed) by
# FileSystemWriter with each of these thread counts, which is the number
# of files per rank.  FileSystemReader has no setting of its own (it reads
# each file in turn, on the rank's thread), so the layout is what a user
# can choose; the one with the best median is DCP's figure.
DCP_LOAD_THREADS = (1, 4)
# The arenas of the load scenarios' clients.  Their saves only make the
# checkpoints (untimed), so they need not hold a shard at once; but the
# loads through the daemon (ckpt_load_set_client) are read by ckptd into
# the loader's arena (or, for the reshard's loaders, its pool, the arena's
# slots then only bounding what they hold), at most half of it per read
# (client/load.c do_daemon: a read larger is done by the library itself,
# which this bench counts as a failure), and the library's 8 load threads
# through the daemon each have a read of up to 16 MiB (LOAD_DAEMON_READ) in
# flight, i.e. 3 slots of 8 MiB once widened to 8 MiB cells: 24 slots for
# all eight.  load-2g's loader and reshard-8to3's 3 loaders get 256 MiB
# each (32 slots; ckpt_bench --loader-arena), its 5 other ranks, which only
# save, 64 MiB: the load group's memory plan (load_memory_plan, ~21.9 GiB at
# full size with DCP and ckptd's pool) must stay within what a 23 GiB
# machine has available, or DCP is left out.
LOAD_ARENA = 256 * MIB
RESHARD_ARENA = 64 * MIB
RESHARD_LOADER_ARENA = 256 * MIB
# restore-ram-2g's saver (its save is not timed) and its loader, which
# stages nothing and reads nothing through ckptd (every byte comes from the
# image): its connection only serves the load, so it asks for a small arena.
RESTORE_SAVER_ARENA = 256 * MIB
RESTORE_LOADER_ARENA = 16 * MIB


def restore_image_bytes(ram):
    """What restore-ram-2g's image takes of arena_total: the shard file
    (the state, a header of ~100 bytes per tensor), rounded up to 2 MiB by
    the daemon; arena_for's allowance covers both."""
    return arena_for(ram["bytes"], ram["tensors"])


def shard_files(data, name):
    """The shard files of checkpoint `name` under the root `data`."""
    d = os.path.join(data, name)
    try:
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))
    except OSError as e:
        raise BenchError("cannot list %s: %s" % (d, e))


def fio_read(files, depth):
    """fio reading the given files whole with O_DIRECT (io_uring, 8 MiB
    blocks, registered buffers and files, one job per file, its page cache
    invalidated first: fio's default): {"gibps", ...} over the bytes it
    read (whole blocks: a file's last partial block is left out) and the
    longest job's runtime (--group_reporting)."""
    fio = shutil.which("fio")
    if not fio:
        raise BenchError("fio not found")
    argv = [fio, "--ioengine=io_uring", "--direct=1", "--rw=read", "--bs=8m", "--iodepth=%d" % depth,
            "--fixedbufs=1", "--registerfiles=1", "--invalidate=1", "--group_reporting",
            "--output-format=json"]
    for i, f in enumerate(files):
        argv += ["--name=r%d" % i, "--filename=" + f]
    rd = run_fio(argv)["read"]
    want = sum(os.path.getsize(f) for f in files)
    if rd["io_bytes"] < want - len(files) * 8 * MIB or rd["runtime"] <= 0:
        raise BenchError("fio read %d bytes in %d ms of the %d in %d files" % (rd["io_bytes"], rd["runtime"],
                                                                             want, len(files)))
    return {"gibps": rd["io_bytes"] / GIB / (rd["runtime"] / 1e3), "runtime_ms": rd["runtime"],
            "bytes_read": rd["io_bytes"], "depth": depth, "files": len(files)}


def load_memory_plan(sc, rsc, uring_depth, ram=None):
    """Bytes the load scenarios' workers hold at once: ckpt_bench (state,
    the limits' memfd, the arena; the reshard's loaders their band
    buffers), the DCP worker (the state and torch), fio's buffers and, for
    restore-ram-2g, the daemon's image, one ckpt_bench without limits
    (saver and loader never run at once) and their arenas.  The page cache
    the loads fill is dropped before each one."""
    plan = {"ckpt_bench": 2 * sc["bytes"] + LOAD_ARENA + 64 * MIB,
            "dcp": sc["bytes"] + 600 * MIB,
            "fio": 2 * uring_depth * 8 * MIB * max(1, rsc["ranks"] if rsc else 1),
            "margin": GIB}
    if rsc:
        total = rsc["bytes"] * rsc["ranks"]
        plan["ckpt_bench_reshard"] = (rsc["ranks"] * (2 * rsc["bytes"] + RESHARD_ARENA) +
                                      rsc["loaders"] * (total // rsc["loaders"] + MIB +
                                                        RESHARD_LOADER_ARENA - RESHARD_ARENA) + 64 * MIB)
    if rsc:
        # ckptd's pool for the reshard's loaders (one job; load-2g's lone
        # loader shares with nobody and gets none).
        plan["ckptd_pool"] = LOAD_SHARE_DEFAULT
    if ram:
        plan["restore"] = (restore_image_bytes(ram) + ram["bytes"] + RESTORE_SAVER_ARENA + RESTORE_LOADER_ARENA +
                           64 * MIB)
    return plan


class RestoreCycles:
    """restore-ram-2g's measurement.  Each call is one trainer's two lives,
    both ckpt_bench processes of one job (--job), without the limits'
    memfd (--no-limits: they need no second copy of the state):

    - the saver connects with CKPT_CONNECT_RESIDENT (--resident), saves
      its state as its first save ("save default keep", so the state is
      state_init's and stays on disk) and answers once the save has
      committed; then it is killed with SIGKILL (its process group, by PID:
      the rank process holding the client dies with it) and reaped;
    - the loader, a new process, builds and touches its state and connects
      (no flag: serving needs none); once it is ready, the daemon's status
      is read (which image it holds), then "load via default from X" loads
      X into the state through the client (ckpt_load_set_client), timed
      from ckpt_reader_open to the done future as load-2g's load is, X's
      files dropped from the page cache first, the bytes checked against
      the saved state after the clock stopped.  The loader quits; X is
      removed.

    The figure must be a load from memory: a call whose load took any file
    or byte from storage fails (not a figure).  Every call has a job of its
    own: a job's newest image stays while its next save fills another, so
    one job for every call would keep two images (4 GiB at full size); with
    a job per call, a new image evicts the last call's when arena_total has
    no room for both (it has room for one)."""

    def __init__(self, daemon, ram, run_dir):
        self.daemon = daemon
        self.ram = ram
        self.run_dir = run_dir
        self.calls = 0
        self.env = worker_env(1)

    def argv(self, job, arena):
        return ckpt_argv(self.daemon, self.ram["bytes"], self.ram["tensors"], 1, ["default:0"], arena) + [
            "--job", job, "--no-limits"]

    def image(self, job):
        """The daemon's status entry of job's image (rank 0), the status's
        resident_bytes, and an error text if the status could not be read."""
        try:
            st = self.daemon.status()
        except BenchError as e:
            return None, None, str(e)
        found = [x for x in (st.get("resident") or []) if x.get("job") == job + "-default"
                 and x.get("rank") == 0]
        return (found[0] if found else None), st.get("resident_bytes"), None

    def __call__(self):
        self.calls += 1
        job = "restore-%d-%d" % (os.getpid(), self.calls)
        tag = "%02d" % self.calls
        fig = {"job": job + "-default"}
        saver = Worker("restore_saver", self.argv(job, RESTORE_SAVER_ARENA) + ["--resident"],
                       os.path.join(self.run_dir, "restore_saver_%s.log" % tag), env=self.env)
        ckpt_dir = None
        try:
            try:
                sready = saver.ready()
                if not sready["clients"]["default"].get("resident"):
                    raise BenchError("restore saver: its client did not connect with CKPT_CONNECT_RESIDENT")
                saved = saver.cmd("save default keep")
                ckpt_dir = os.path.join(self.daemon.data, saved["name"])
            finally:
                # kill -9 of the trainer, committed or not: SIGKILL to its
                # group, reaped before anything else runs.
                saver.kill()
                saver.log.close()
            fig["saver_exit"] = saver.proc.returncode
            if saver.proc.returncode != -signal.SIGKILL:
                raise BenchError("restore saver: exit status %s, not SIGKILL's" % saver.proc.returncode)
            fig["name"] = saved["name"]
            fig["save"] = {k: saved.get(k) for k in ("staged_ms", "committed_ms")}

            t0 = time.monotonic()
            loader = Worker("restore_loader", self.argv(job, RESTORE_LOADER_ARENA),
                            os.path.join(self.run_dir, "restore_loader_%s.log" % tag), env=self.env)
            try:
                lready = loader.ready()
                fig["loader_start_s"] = round(time.monotonic() - t0, 3)
                fig["loader_connect_ms"] = lready["clients"]["default"]["connect_ms"]
                img, fig["resident_bytes"], why = self.image(job)
                fig["image_before_load"] = img if why is None else {"status_error": why}
                ld = loader.cmd("load via default from %s" % saved["name"])
            finally:
                rc = loader.close()
            if rc != 0:
                raise BenchError("restore loader exited with status %s: %s"
                                 % (rc, log_tail(loader.log_path, 3)))
        finally:
            if ckpt_dir:
                shutil.rmtree(ckpt_dir, ignore_errors=True)
        for k in ("ms", "gibps", "bytes", "bytes_read", "bytes_resident", "files_resident", "reads",
                  "verify_ms", "cost", "drop"):
            fig[k] = ld.get(k)
        fig["seconds"] = ld["ms"] / 1e3
        # The claim of the figure: every byte of the one shard came from
        # the image the saver left in the daemon.
        if (ld.get("files_resident") != 1 or ld.get("bytes_resident") != ld.get("bytes_read")
                or ld.get("bytes") != self.ram["bytes"]):
            raise BenchError("restore: the load took %s of %s file(s) and %s of its %s bytes read from ckptd's "
                             "memory (want 1 file and every byte; %s bytes wanted of %d): not a load from memory. "
                             "The daemon's image of job '%s' before the load: %s"
                             % (ld.get("files_resident"), self.ram["ranks"], ld.get("bytes_resident"),
                                ld.get("bytes_read"), ld.get("bytes"), self.ram["bytes"], fig["job"],
                                json.dumps(fig["image_before_load"])))
        return fig


def daemon_load(worker, line, daemon):
    """One load through the daemon (ckpt_bench "load ... via default":
    ckpt_load_set_client inside the timed part), with ckptd's CPU time
    around it ("daemon_cpu_ms"; nothing else talks to the daemon while a
    measurement runs).  Its figure must be what it claims: every byte the
    load read was read by ckptd (bytes_daemon) or, never here, copied from
    an image (bytes_resident); no file came from an image (the job that
    saved the checkpoint did not connect resident).  Anything else raises
    (a failed ckptd measurement fails the run), so the figure is not kept."""
    pid = daemon.proc.pid if daemon.proc else None
    d0 = daemon_disk(daemon, pid)
    c0 = proc_cpu_s(pid) if pid else None
    f = worker.cmd(line)
    c1 = proc_cpu_s(pid) if pid else None
    d1 = daemon_disk(daemon, pid)
    f["daemon_cpu_ms"] = round((c1 - c0) * 1e3, 1) if c0 is not None and c1 is not None else None
    # What ckptd read from storage for the load, by its own count
    # (status loads.disk_bytes) and by the kernel's (/proc/PID/io
    # read_bytes: what the process had the block layer read).
    for k, i in (("daemon_disk_bytes", 0), ("daemon_proc_read_bytes", 1)):
        f[k] = d1[i] - d0[i] if d0[i] is not None and d1[i] is not None else None
    br, bd, bres, fres = (f.get(k) for k in ("bytes_read", "bytes_daemon", "bytes_resident", "files_resident"))
    if f.get("via") is None or None in (br, bd, bres, fres) or fres != 0 or bd + bres != br:
        raise BenchError("'%s' was not a load through ckptd: of the %s bytes it read, ckptd read %s into the "
                         "client's arena and its images served %s (%s file(s)); a load through the daemon has "
                         "bytes_daemon + bytes_resident == bytes_read and, with no image of this checkpoint, "
                         "files_resident == 0. Its figure is not kept" % (line, br, bd, bres, fres))
    return f


def standalone_load(worker, line):
    """One load by the library alone (no client: buffered preadv on its
    load threads), checked to be that: nothing from ckptd."""
    f = worker.cmd(line)
    if f.get("via") is not None or f.get("bytes_daemon") or f.get("bytes_resident") or f.get("files_resident"):
        raise BenchError("'%s' was meant to load without ckptd, but ckptd read %s bytes and its images served "
                         "%s (via %s). Its figure is not kept" % (line, f.get("bytes_daemon"),
                                                                  f.get("bytes_resident"), f.get("via")))
    return f


# The loads measured in load_scenario: item -> (ckpt_bench's load command,
# through the daemon).  Each is measured both ways in every round.
LOAD_ITEMS = {
    "ckptd": ("load via default", True),
    "ckptd_standalone": ("load", False),
    "ckptd_reshard": ("load reshard via default", True),
    "ckptd_reshard_standalone": ("load reshard", False),
    "ckptd_reshard_wide": ("load one reshard via default", True),
    "ckptd_reshard_wide_standalone": ("load one reshard", False),
}


def load_scenario(name, sc, daemon, py, run_dir, failures, rsc):
    """load-2g and, with rsc, reshard-8to3 and reshard-8to3-wide, and with
    sc["restore"] restore-ram-2g, in the same rounds: ckptd's loads of kept
    checkpoints (made before round 1), the read limit of the same files
    (the built-in reader and fio, O_DIRECT, at the daemon's depth and twice
    it), DCP's load of the same state and a restarted trainer's load from
    the daemon's memory (RestoreCycles).  Returns {scenario name: result}."""
    nbytes, tensors = sc["bytes"], sc["tensors"]
    ram = sc.get("restore")
    gib = nbytes / GIB
    notes, rnotes = [], []
    detail = {}
    uring_depth = find_key(daemon.status(), "uring_depth")
    if not isinstance(uring_depth, int) or uring_depth < 1:
        raise BenchError("cannot read the daemon's uring_depth from its status")
    depths = (uring_depth, 2 * uring_depth)

    plan = load_memory_plan(sc, rsc, uring_depth, ram)
    avail = meminfo("MemAvailable")
    want_dcp = bool(py) and not SKIP_DCP
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    detail["mem_available_gib_at_start"] = round(avail / GIB, 2) if avail is not None else None
    if avail is not None:
        base = sum(v for k, v in plan.items() if k != "dcp")
        if want_dcp and avail < base + plan["dcp"]:
            want_dcp = False
            notes.append("DCP left out: %.1f GiB of memory available, the scenario with DCP wants ~%.1f GiB"
                         % (avail / GIB, (base + plan["dcp"]) / GIB))
        if avail < base:
            notes.append("only %.1f GiB of memory available, ckpt_bench and fio want ~%.1f GiB"
                         % (avail / GIB, base / GIB))

    progress("%s: starting ckpt_bench%s%s%s" % (name, ", ckpt_bench for reshard-8to3" if rsc else "",
                                                ", DCP" if want_dcp else "",
                                                " (restore-ram-2g starts its own in every measurement)"
                                                if ram else ""))
    ckpt = start_worker("ckpt_bench", ckpt_argv(daemon, nbytes, tensors, 1, ["default:0"], LOAD_ARENA),
                        run_dir, worker_env(1), notes)
    ckpt8 = None
    if rsc:
        ckpt8 = start_worker("ckpt_bench_reshard",
                             ckpt_argv(daemon, rsc["bytes"], rsc["tensors"], rsc["ranks"], ["default:0"],
                                       RESHARD_ARENA) + ["--cols", str(rsc["cols"]),
                                                         "--reshard", str(rsc["loaders"]),
                                                         "--loader-arena", str(RESHARD_LOADER_ARENA)],
                             run_dir, worker_env(rsc["ranks"]), notes)
    peers = None
    if want_dcp:
        peers = start_worker("peers", [py, os.path.join(REPO, "bench", "baselines", "peers.py"), "--dir",
                                       daemon.data, "--bytes", str(nbytes), "--tensors", str(tensors),
                                       "--procs", "1"], run_dir, worker_env(1), notes)
    workers = [w for w in (ckpt, ckpt8, peers) if w]
    warm = {}
    try:
        ready = await_ready(ckpt, notes, "ckpt_bench")
        if ready is None:
            raise BenchError("ckpt_bench did not start: %s" % notes[-1])
        ready8 = None
        if rsc:
            ready8 = await_ready(ckpt8, notes, "ckpt_bench for reshard-8to3")
            if ready8 is None:
                raise BenchError("ckpt_bench for reshard-8to3 did not start: %s" % notes[-1])
        peers_ready = await_ready(peers, notes, "the DCP worker")
        have_dcp = want_dcp and peers_ready is not None
        if have_dcp and peers_ready.get("no_dcp"):
            notes.append("DCP: %s" % peers_ready["no_dcp"])
            have_dcp = False
        detail["ckpt_bench"] = ready
        if ready8 is not None:
            detail["ckpt_bench_reshard"] = ready8
        detail["peers"] = {"ready": peers_ready}
        detail["uring_depth"] = uring_depth
        for who, rd in (("ckpt_bench", ready), ("ckpt_bench_reshard", ready8)):
            if rd is not None and not rd["limit_buffer"]["registered"]:
                notes.append("%s: built-in reader's buffers not registered (%s)"
                             % (who, rd["limit_buffer"].get("not_registered")))
        # The loaders' arenas, which the loads through the daemon read into.
        for who, rd, key, want in (("ckpt_bench", ready, "arena_bytes", LOAD_ARENA),
                                   ("ckpt_bench_reshard", ready8, "loader_arena_bytes", RESHARD_LOADER_ARENA)):
            got = rd["clients"]["default"].get(key) if rd is not None else None
            if rd is not None and (got is None or got < want):
                notes.append("%s: its loaders' arena is %s bytes, %d asked for: reads through ckptd are capped "
                             "at half of it" % (who, got, want))

        # The checkpoints the loads read, made once (not measured).
        progress("%s: saving the checkpoints to load" % name)
        made = {"ckptd": ckpt.cmd("save default keep")}
        files = shard_files(daemon.data, made["ckptd"]["name"])
        if rsc:
            made["ckptd_reshard"] = ckpt8.cmd("save default keep")
            made["ckptd_reshard_wide"] = ckpt8.cmd("save default one keep")
            files8 = shard_files(daemon.data, made["ckptd_reshard"]["name"])
        if have_dcp:
            for t in DCP_LOAD_THREADS:
                try:
                    made["dcp_t%d" % t] = peers.cmd("dcp_keep %d" % t)
                except BenchError as e:
                    notes.append("DCP: its checkpoint with thread_count %d could not be saved: %s" % (t, e))
                    have_dcp = False
                    break
        detail["checkpoints"] = made

        # Warm-ups: each program's first load, each way (checked as the
        # rounds' are: first_load_ms is printed).
        def load_fn(item, w):
            line, via = LOAD_ITEMS[item]
            return (lambda: daemon_load(w, line, daemon)) if via else (lambda: standalone_load(w, line))

        progress("%s: warm-up loads" % name)
        load_items = [("ckptd", ckpt), ("ckptd_standalone", ckpt)]
        if rsc:
            load_items += [(i, ckpt8) for i in ("ckptd_reshard", "ckptd_reshard_standalone", "ckptd_reshard_wide",
                                                "ckptd_reshard_wide_standalone")]
        for item, w in load_items:
            warm[item] = load_fn(item, w)()
        if have_dcp:
            for t in DCP_LOAD_THREADS:
                try:
                    warm["dcp_t%d" % t] = peers.cmd("dcp_load %d" % t)
                except BenchError as e:
                    notes.append("DCP load warm-up: %s" % e)
                    have_dcp = False
                    break

        # load-2g's two loads next to each other and to the read limits
        # their ratios divide by.
        items = [("ckptd", load_fn("ckptd", ckpt), ckpt),
                 ("ckptd_standalone", load_fn("ckptd_standalone", ckpt), ckpt)]
        blocks = [["ckptd", "ckptd_standalone"]]
        if ram:
            # Next to load-2g's load, which its ratio divides.
            items.append(("ckptd_ram", RestoreCycles(daemon, ram, run_dir), None))
            blocks[0].append("ckptd_ram")
        for d in depths:
            items.append(("read_builtin_d%d" % d, (lambda d=d: ckpt.cmd("read %d" % d)), ckpt))
            items.append(("read_fio_d%d" % d, (lambda d=d: fio_read(files, d)), None))
            blocks[0] += ["read_builtin_d%d" % d, "read_fio_d%d" % d]
        if rsc:
            r_items = ["ckptd_reshard", "ckptd_reshard_standalone", "ckptd_reshard_wide",
                       "ckptd_reshard_wide_standalone"]
            items += [(i, load_fn(i, ckpt8), ckpt8) for i in r_items]
            blocks.append(list(r_items))
            for d in depths:
                items.append(("read8_builtin_d%d" % d, (lambda d=d: ckpt8.cmd("read %d" % d)), ckpt8))
                items.append(("read8_fio_d%d" % d, (lambda d=d: fio_read(files8, d)), None))
                blocks[1] += ["read8_builtin_d%d" % d, "read8_fio_d%d" % d]
        if have_dcp:
            for t in DCP_LOAD_THREADS:
                items.append(("dcp_t%d" % t, (lambda t=t: peers.cmd("dcp_load %d" % t)), peers))
        rounds = Rounds(name, items, daemon.data, blocks)
        rounds.run(ROUNDS, failures, notes)
        rounds.note_settling(notes)
        # The daemon made the checkpoints and serves the loads through
        # it; its figures are kept like every scenario's.
        detail["max_loop_stall_ms"], st = loop_stall(daemon, notes)
        detail["max_loop_cpu_ms"] = find_key(st, "max_loop_cpu_ms") if st else None
    finally:
        close_workers(workers, notes)

    read_items = ["read_builtin_d%d" % d for d in depths] + ["read_fio_d%d" % d for d in depths]
    res = {name: analyse_load(name, sc, rounds, warm, read_items, have_dcp, py, list(notes), detail,
                              uring_depth)}
    if rsc:
        load_r = rounds.series("ckptd", "ms")
        read8 = ["read8_builtin_d%d" % d for d in depths] + ["read8_fio_d%d" % d for d in depths]
        for item, sname, view in (("ckptd_reshard", "reshard-8to3", "many"),
                                  ("ckptd_reshard_wide", WIDE, "one")):
            # item through the daemon; item + "_standalone" the library alone.
            res[sname] = analyse_reshard(sname, rsc, rounds, warm, item, view, load_r, gib, read8,
                                         list(notes), detail, made, res[name])
    if ram:
        res[RESTORE] = analyse_restore(RESTORE, ram, rounds, list(notes), detail)
    return res


def load_cost(rounds, item):
    """Medians of a load's CPU figures over the rounds (ckpt_bench's
    struct cost: the loaders' own CPU time, the machine's busy time, minor
    faults; and, for a load through the daemon, ckptd's CPU time around
    it: daemon_cpu_ms)."""
    per_round = [c for c in (rd["figures"].get(item, {}).get("cost") for rd in rounds.rounds) if c]
    out = {f: median([c.get(f) for c in per_round if c.get(f) is not None])
           for f in ("cpu_ms", "sys_busy_ms", "sys_idle_ms", "sys_steal_ms", "minflt", "nivcsw")}
    out["daemon_cpu_ms"] = median(rounds.series(item, "daemon_cpu_ms"))
    return out


def standalone_figures(rounds, warm, item, gib, read_r, prefix):
    """The library-alone load `item` (measured next to the load through
    the daemon, in the same rounds): its median ms, GiB/s, first load and
    what it read, and the per-round ratios standalone_vs_read_limit and
    daemon_vs_standalone (its time over the daemon load's: above 1, the
    load through the daemon was the faster)."""
    sa = item + "_standalone"
    ms_r = rounds.series(sa, "ms")
    via_r = rounds.series(item, "ms")
    r = {prefix + "standalone_ms" if prefix else "standalone_load_ms": median(ms_r)}
    ms = median(ms_r)
    r[prefix + "standalone_gibps"] = ratio(gib, ms / 1e3 if ms else None)
    if not prefix:
        r["first_standalone_load_ms"] = warm.get(sa, {}).get("ms")
    last = next((rd["figures"][sa] for rd in reversed(rounds.rounds) if sa in rd["figures"]), {})
    for k in ("bytes_read", "reads"):
        r[(prefix or "load_") + "standalone_" + k] = last.get(k)
    per_lim, per_vs = [], []
    for i in range(len(rounds.rounds)):
        per_lim.append(ratio(ratio(gib, ms_r[i] / 1e3 if ms_r[i] else None), read_r[i]))
        per_vs.append(ratio(ms_r[i], via_r[i]))
    return r, {"standalone_vs_read_limit": per_lim, "daemon_vs_standalone": per_vs}


def resident_note(rounds, warm, items, notes):
    """A note on how much of the checkpoint stayed in the page cache after
    the drop (mincore), and the caveat no guest can remove."""
    res = [f.get("drop", {}).get("resident_bytes") for rd in rounds.rounds for i in items
           for f in [rd["figures"].get(i, {})]] + [warm.get(i, {}).get("drop", {}).get("resident_bytes")
                                                   for i in items]
    res = [x for x in res if x is not None]
    worst = max(res) if res else None
    notes.append("page cache: before every load and read, each file of the checkpoint was dropped "
                 "(posix_fadvise DONTNEED); at most %s stayed resident (mincore)%s. The VM's virtual disk may "
                 "still be cached by the host, which no guest can drop: these figures may include host "
                 "cache hits, for ckptd, the read limit and DCP alike"
                 % ("%d KiB" % (worst // 1024) if worst is not None else "n/a",
                    "" if worst is None or worst < 16 * MIB else ": NOT a cold read"))
    return worst


def analyse_load(name, sc, rounds, warm, read_items, have_dcp, py, notes, detail, uring_depth):
    """load-2g's JSON from the rounds."""
    gib = sc["bytes"] / GIB
    r = {"bytes": sc["bytes"], "tensors": sc["tensors"], "ranks": 1, "rounds": len(rounds.rounds)}
    load_r = rounds.series("ckptd", "ms")
    r["load_ms"] = median(load_r)
    r["first_load_ms"] = warm.get("ckptd", {}).get("ms")
    r["load_gibps"] = ratio(gib, r["load_ms"] / 1e3 if r["load_ms"] else None)
    last = next((rd["figures"]["ckptd"] for rd in reversed(rounds.rounds) if "ckptd" in rd["figures"]), {})
    for k in ("bytes_read", "bytes_wanted", "reads", "floor_bytes", "bytes_daemon", "bytes_resident",
              "files_resident"):
        r["load_" + k] = last.get(k)
    read_best, r["read_limit_gibps"], read_r, read_meds = best_of(rounds, read_items, "gibps")
    sa, sa_per = standalone_figures(rounds, warm, "ckptd", gib, read_r, "")
    r.update(sa)
    dcp_items = ["dcp_t%d" % t for t in DCP_LOAD_THREADS]
    dcp_best, r["dcp_load_s"], dcp_r, dcp_meds = best_of(rounds, dcp_items, "seconds", higher=False)
    r["dcp_load_thread_count"] = int(dcp_best[len("dcp_t"):]) if dcp_best else None
    r["first_dcp_load_s"] = warm.get(dcp_best, {}).get("seconds") if dcp_best else None

    per = {"load_vs_read_limit": [], "load_speedup_vs_dcp": []}
    ceil = []
    round_ratios = []
    for i, rd in enumerate(rounds.rounds):
        load_s = load_r[i] / 1e3 if load_r[i] else None
        x = {"load_vs_read_limit": ratio(ratio(gib, load_s), read_r[i]),
             "load_speedup_vs_dcp": ratio(dcp_r[i], load_s)}
        # A perfect load reads the state's bytes at the read limit.
        c = ratio(dcp_r[i], ratio(gib, read_r[i]))
        for k, v in x.items():
            per[k].append(v)
        if c is not None:
            ceil.append(c)
        round_ratios.append({"ratios": x, "ceilings": {"load_speedup_vs_dcp": c}})
    for i, rr in enumerate(round_ratios):
        rr["ratios"].update({k: v[i] for k, v in sa_per.items()})
    r["ratios"] = {"load_vs_read_limit": spread(per["load_vs_read_limit"], ceiling=1.0),
                   "load_speedup_vs_dcp": spread(per["load_speedup_vs_dcp"], ceilings=ceil),
                   "standalone_vs_read_limit": spread(sa_per["standalone_vs_read_limit"], ceiling=1.0),
                   "daemon_vs_standalone": spread(sa_per["daemon_vs_standalone"])}
    notes.append("the load figures (load_ms, load_gibps, first_load_ms) and the ratios load_vs_read_limit and "
                 "load_speedup_vs_dcp are the load THROUGH ckptd: ckpt_load_set_client, called inside the timed "
                 "part, lends the shard file to the daemon, which reads it with io_uring and O_DIRECT into the "
                 "loader's arena (%d MiB; a read at most half of it), where the library checks the CRCs and "
                 "scatters; every round checks bytes_daemon + bytes_resident == bytes_read and files_resident "
                 "== 0 (the saving job is not resident: no image). standalone_* and standalone_vs_read_limit are "
                 "the library alone (no client: buffered preadv on its load threads), measured next to it in the "
                 "same rounds, informational (no target); daemon_vs_standalone = standalone time / time through "
                 "ckptd, per round" % (LOAD_ARENA // MIB))
    sv = r["ratios"]["standalone_vs_read_limit"]
    if sv["median"] is not None and sv["median"] > 1.0:
        notes.append("standalone_vs_read_limit: median %.2f is above 1.0: the buffered load beat the O_DIRECT read "
                     "limit, so the page cache (or the host's cache of the virtual disk) served some of it; "
                     "suspect the limit or the drop first (BENCH.md)" % sv["median"])

    if r["read_limit_gibps"] is None:
        notes.append("read_limit_gibps: neither fio nor the built-in reader succeeded")
    if r["dcp_load_s"] is None:
        notes.append("dcp_load_s: %s" % ("skipped (BENCH_SKIP_DCP)" if SKIP_DCP else
                                         "no bench Python environment" if not py else
                                         "DCP did not run (see notes)" if not have_dcp
                                         else "no DCP load succeeded"))
    v = r["ratios"]["load_vs_read_limit"]
    above = sum(1 for x in per["load_vs_read_limit"] if x is not None and x > 1.0)
    if v["median"] is not None and v["median"] > 1.0:
        notes.append("load_vs_read_limit: median %.2f is above 1.0: ckptd beat the limit, so the limit is not the "
                     "limit on this machine; suspect the limit first (BENCH.md)" % v["median"])
    elif above:
        notes.append("load_vs_read_limit: above 1.0 in %d of %d rounds (max %.2f), median below: the machine's "
                     "noise between the measurements of one round, or a limit that is sometimes weak "
                     "(detail.rounds)" % (above, len(per["load_vs_read_limit"]), v["max"]))
    r["resident_after_drop_bytes"] = resident_note(rounds, warm, ["ckptd", "ckptd_standalone"] + read_items,
                                                   notes)
    r["max_loop_stall_ms"] = detail.get("max_loop_stall_ms")
    r["max_loop_cpu_ms"] = detail.get("max_loop_cpu_ms")
    cost = load_cost(rounds, "ckptd")
    sa_cost = load_cost(rounds, "ckptd_standalone")
    r["load_cpu_ms"] = cost.get("cpu_ms")
    r["load_daemon_cpu_ms"] = cost.get("daemon_cpu_ms")
    r["standalone_cpu_ms"] = sa_cost.get("cpu_ms")
    r["bound"] = load_bound(r, read_best, cost, sa_cost)
    notes.append("bound: " + r["bound"])

    d = dict(detail)
    d["read_limit"] = {"method": read_best, "medians_gibps": read_meds, "uring_depth": uring_depth,
                       "builtin": "ckpt_bench: each shard file of the kept checkpoint read whole with O_DIRECT "
                                  "io_uring, 8 MiB reads, depth %d and %d, into the registered memfd of the "
                                  "state's size (wrapping), timed from open to the last completion"
                                  % (uring_depth, 2 * uring_depth),
                       "fio": "io_uring, direct, rw=read, bs=8m, iodepth=%d and %d, fixedbufs, registerfiles, "
                              "invalidate, one job per shard file, group_reporting" % (uring_depth, 2 * uring_depth),
                       "stat": "best median of the methods; per round, the best method's figure"}
    d["dcp_load"] = {"thread_count": r["dcp_load_thread_count"], "median_s_by_layout": dcp_meds,
                     "tried": list(DCP_LOAD_THREADS),
                     "what": "dcp.load of the same state dict in place (FileSystemReader) from a checkpoint "
                             "saved once by dcp.save with FileSystemWriter(thread_count=N, sync_files=True) "
                             "(N files per rank), its files dropped from the page cache first, the tensors "
                             "overwritten with NaN first and checked (CRC32) after",
                     "stat": "the layout with the best median seconds"}
    d["cpu"] = {"ckptd": cost, "ckptd_standalone": sa_cost}
    d["loads"] = {"ckptd": "ckpt_bench 'load via default' (arena %d bytes): through the daemon" % LOAD_ARENA,
                  "ckptd_standalone": "ckpt_bench 'load': the library alone"}
    d["warmup"] = warm
    d["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                    "settle_ms": rd.get("settle_ms", {}), "ratios": rr["ratios"], "ceilings": rr["ceilings"]}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return r


def load_bound(r, read_best, cost, sa_cost):
    """One line: what bounds load-2g's figures, from its own figures, and
    which path each figure is."""
    load_s = r["load_ms"] / 1e3 if r.get("load_ms") else None
    sa_s = r["standalone_load_ms"] / 1e3 if r.get("standalone_load_ms") else None
    parts = []
    if r.get("read_limit_gibps") and (load_s or sa_s):
        parts.append("the disk's read speed: the read limit is %.2f GiB/s (%s); through ckptd (load_ms, "
                     "load_gibps: the headline figures and targets) %s; the library alone (standalone_load_ms, "
                     "standalone_gibps: informational) %s"
                     % (r["read_limit_gibps"], read_best,
                        "%.2f GiB/s (%.2f of it)" % (r["load_gibps"], r["load_gibps"] / r["read_limit_gibps"])
                        if load_s else "n/a (no load through ckptd succeeded)",
                        "%.2f GiB/s (%.2f of it)" % (r["standalone_gibps"],
                                                    r["standalone_gibps"] / r["read_limit_gibps"])
                        if sa_s else "n/a (no standalone load succeeded)"))
    else:
        parts.append("the disk's read speed (no read limit or load figure in this run)")

    def cpu(c, s):
        return "%.0f ms of the loader's CPU in %.0f ms (%.2f cores of %d), %s minor faults" % (
            c["cpu_ms"], s * 1e3, c["cpu_ms"] / (s * 1e3), cpus(),
            "%.0f" % c["minflt"] if c.get("minflt") is not None else "n/a")
    if load_s and cost.get("cpu_ms") is not None:
        parts.append("through ckptd, ckptd reads the shard file with io_uring and O_DIRECT into the loader's "
                     "%d MiB arena (%.0f of the %.0f MiB read, in %s reads), where the library checks each 1 MiB "
                     "piece's CRC32C and copies it into the state: %s; ckptd's own CPU %s ms"
                     % (LOAD_ARENA // MIB, (r.get("load_bytes_daemon") or 0) / MIB,
                        (r.get("load_bytes_read") or 0) / MIB, r.get("load_reads"), cpu(cost, load_s),
                        "%.0f" % cost["daemon_cpu_ms"] if cost.get("daemon_cpu_ms") is not None else "n/a"))
    if sa_s and sa_cost.get("cpu_ms") is not None:
        parts.append("the library alone reads with buffered preadv on its load threads (%s reads of the %.0f "
                     "MiB), each 1 MiB piece's CRC32C checked in place: %s"
                     % (r.get("load_standalone_reads"), (r.get("load_standalone_bytes_read") or 0) / MIB,
                        cpu(sa_cost, sa_s)))
    if r.get("dcp_load_s"):
        parts.append("DCP %.2f s (layout of %d file(s) per rank): FileSystemReader reads the files one after "
                     "the other on the rank's thread, torch.load per tensor into new memory, then a copy into "
                     "place" % (r["dcp_load_s"], r["dcp_load_thread_count"]))
    return "; ".join(parts)


def analyse_reshard(sname, rsc, rounds, warm, item, view, load_r, load_gib, read_items, notes, detail, made,
                    load_res):
    """reshard-8to3 (view "many") or its wide-row variant (view "one")
    from the rounds: the loaders' throughput over load-2g's in the same
    round, and what they read over what they wanted."""
    total = rsc["bytes"] * rsc["ranks"]
    n = total // 4
    cols = rsc["cols"] if view == "many" else n // rsc["ranks"]
    tensors = rsc["tensors"] if view == "many" else 1
    rows = n // cols // tensors
    r = {"bytes": total, "bytes_per_rank": rsc["bytes"], "tensors": tensors, "ranks": rsc["ranks"],
         "loaders": rsc["loaders"], "rounds": len(rounds.rounds),
         "global_shape": "%d x [%d, %d] fp32" % (tensors, rows, cols),
         "chunk_shape": "[%d, %d]" % (rows // rsc["ranks"], cols),
         "band_columns": cols // rsc["loaders"]}
    ms_r = rounds.series(item, "ms")
    r["reshard_ms"] = median(ms_r)
    r["first_reshard_ms"] = warm.get(item, {}).get("ms")
    last = next((rd["figures"][item] for rd in reversed(rounds.rounds) if item in rd["figures"]), {})
    r["reshard_gibps"] = ratio((last.get("bytes_wanted") or total) / GIB,
                               r["reshard_ms"] / 1e3 if r["reshard_ms"] else None)
    for k in ("bytes_read", "bytes_wanted", "reads", "floor_bytes", "bytes_daemon", "bytes_resident",
              "files_resident", "bytes_shared", "daemon_disk_bytes", "daemon_proc_read_bytes"):
        r["reshard_" + k] = last.get(k)
    read_best, r["read_limit_gibps"], read_r, read_meds = best_of(rounds, read_items, "gibps")
    r["load_2g_gibps"] = load_res.get("load_gibps")
    # The library alone, in the same rounds (GiB/s of the bytes wanted).
    sa_last = next((rd["figures"][item + "_standalone"] for rd in reversed(rounds.rounds)
                    if item + "_standalone" in rd["figures"]), {})
    sa, sa_per = standalone_figures(rounds, warm, item, (sa_last.get("bytes_wanted") or total) / GIB, read_r,
                                    "reshard_")
    r.update(sa)
    r["first_reshard_standalone_ms"] = warm.get(item + "_standalone", {}).get("ms")
    r["reshard_standalone_amplification"] = ratio(sa_last.get("bytes_read"), sa_last.get("bytes_wanted"))

    per = {"read_amplification": [], "vs_load_2g": [], "reshard_vs_read_limit": [],
           "loaders_read_amplification": []}
    floors = []
    round_ratios = []
    for i, rd in enumerate(rounds.rounds):
        f = rd["figures"].get(item, {})
        s = f.get("ms") / 1e3 if f.get("ms") else None
        wanted = f.get("bytes_wanted")
        gib_w = wanted / GIB if wanted else None
        # What the storage was asked for: ckptd's own count of what it
        # read for the loads (all of them go through it), not what the
        # loaders say they got, which counts a piece shared through
        # ckptd's pool once per loader.
        disk = f.get("daemon_disk_bytes")
        x = {"read_amplification": ratio(disk if disk is not None else f.get("bytes_read"), wanted),
             "loaders_read_amplification": ratio(f.get("bytes_read"), wanted),
             "vs_load_2g": ratio(ratio(gib_w, s), ratio(load_gib, load_r[i] / 1e3 if load_r[i] else None)),
             "reshard_vs_read_limit": ratio(ratio(gib_w, s), read_r[i])}
        fl = f.get("floor_amplification")
        for k, v in x.items():
            per[k].append(v)
        if fl is not None:
            floors.append(fl)
        x.update({k: v[i] for k, v in sa_per.items()})
        round_ratios.append({"ratios": x, "ceilings": {"loaders_read_amplification": fl}})
    # The floor is per loader (each verifies whole pieces); shared
    # through ckptd's pool, the node reads each piece once, so it bounds
    # what the loaders use, not what the disk reads.
    r["ratios"] = {"read_amplification": spread(per["read_amplification"]),
                   "loaders_read_amplification": spread(per["loaders_read_amplification"], ceilings=floors),
                   "vs_load_2g": spread(per["vs_load_2g"]),
                   "reshard_vs_read_limit": spread(per["reshard_vs_read_limit"]),
                   "standalone_vs_read_limit": spread(sa_per["standalone_vs_read_limit"]),
                   "daemon_vs_standalone": spread(sa_per["daemon_vs_standalone"])}
    notes.append("read_amplification (through ckptd) divides what ckptd read from storage for the loads (its "
                 "status loads.disk_bytes, before and after each load; the kernel's /proc/PID/io read_bytes of "
                 "ckptd is kept beside it as reshard_daemon_proc_read_bytes) by the bytes the loaders wanted; "
                 "loaders_read_amplification divides what the loaders got (bytes_read, a piece shared through "
                 "ckptd's pool counted once per loader that used it; bytes_shared of them came from another "
                 "loader's read)")
    notes.append("reshard_ms, reshard_gibps, read_amplification, vs_load_2g and reshard_vs_read_limit are the "
                 "loads THROUGH ckptd (each loader's client, a %d MiB arena: ckpt_load_set_client inside the "
                 "timed part, ckptd reads with O_DIRECT into the arena; checked every round: bytes_daemon + "
                 "bytes_resident == bytes_read, files_resident == 0), and vs_load_2g divides by load-2g's load "
                 "through ckptd of the same round; reshard_standalone_* and standalone_vs_read_limit (bytes "
                 "wanted per second over the read limit) are the library alone (buffered preadv), in the same "
                 "rounds, informational; daemon_vs_standalone = standalone time / time through ckptd"
                 % (RESHARD_LOADER_ARENA // MIB))
    fl = r["ratios"]["loaders_read_amplification"]["ceiling"]
    amp = r["ratios"]["read_amplification"]["median"]
    lamp = r["ratios"]["loaders_read_amplification"]["median"]
    piece = 1 << 20  # format/layout.h LAYOUT_CRC_BLOCK
    row_bytes = cols * 4
    band_bytes = row_bytes // rsc["loaders"]
    if fl is not None:
        notes.append("loaders_read_amplification: its floor (the \"ceiling\" printed with it: what a loader that uses only "
                     "verified bytes must read) is %.3f here: the bytes of the 1 MiB CRC pieces each loader's "
                     "band touches, since a piece is verified whole. A row is %s and a loader's band of it %s, so "
                     "%s" % (fl, fmt_bytes(row_bytes), fmt_bytes(band_bytes),
                             "every piece holds rows of every band and every loader must read every piece: no "
                             "loader can get below %d x" % rsc["loaders"] if row_bytes <= piece else
                             "each band is one run per row, widened by up to a piece at each end"))
    if lamp is not None and fl is not None:
        amp_l = lamp
        extra = (r["reshard_bytes_read"] or 0) - (r["reshard_floor_bytes"] or 0)
        notes.append("loaders_read_amplification: the loaders used %.3f x what they wanted against a floor of "
                     "%.3f: %s"
                     % (amp_l, fl, "the planner reads no more than the format makes it" if amp_l <= fl * 1.005 else
                        "%.1f%% above the floor, %s more than the pieces the bands touch, in %s reads: bytes "
                        "read by two reads (a piece where a band is cut into reads of at most the planner's "
                        "largest read is read by both) or gaps read with their neighbours"
                        % (100 * (amp_l / fl - 1), fmt_bytes(extra), r["reshard_reads"])))
    r["resident_after_drop_bytes"] = resident_note(rounds, warm, [item, item + "_standalone"], notes)
    r["max_loop_stall_ms"] = detail.get("max_loop_stall_ms")
    r["max_loop_cpu_ms"] = detail.get("max_loop_cpu_ms")
    cost = load_cost(rounds, item)
    sa_cost = load_cost(rounds, item + "_standalone")
    r["reshard_cpu_ms"] = cost.get("cpu_ms")
    r["reshard_daemon_cpu_ms"] = cost.get("daemon_cpu_ms")
    r["reshard_standalone_cpu_ms"] = sa_cost.get("cpu_ms")
    r["bound"] = reshard_bound(r, read_best, cost, amp)
    notes.append("bound: " + r["bound"])
    if view == "one":
        notes.append("the same bytes as reshard-8to3, saved as one tensor per rank (rows of %s), loaded by the "
                     "same loaders in the same rounds: where rows are long, the floor of read_amplification is "
                     "near 1 and the figure shows the loader's own overhead; no target is judged on it"
                     % fmt_bytes(row_bytes))

    d = dict(detail)
    d["checkpoint"] = made.get(item)
    d["read_limit"] = {"method": read_best, "medians_gibps": read_meds,
                       "what": "the same as load-2g's, over the reshard checkpoint's %d shard files (one reader "
                               "per rank at once: the built-in reader; one fio job per file)" % rsc["ranks"],
                       "stat": "best median of the methods; per round, the best method's figure"}
    d["cpu"] = {item: cost, item + "_standalone": sa_cost}
    d["loads"] = {item: "ckpt_bench '%s' (loaders' arenas %d bytes): through the daemon"
                        % (LOAD_ITEMS[item][0], RESHARD_LOADER_ARENA),
                  item + "_standalone": "ckpt_bench '%s': the library alone" % LOAD_ITEMS[item + "_standalone"][0]}
    d["warmup"] = {k: warm.get(k) for k in (item, item + "_standalone")}
    d["rounds"] = [{"order": rd["order"], "figures": {k: v for k, v in rd["figures"].items()
                                                      if k in (item, item + "_standalone", "ckptd")
                                                      or k in read_items},
                    "errors": rd["errors"], "ratios": rr["ratios"], "ceilings": rr["ceilings"]}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return r


def analyse_restore(name, sc, rounds, notes, detail):
    """restore-ram-2g's JSON from the rounds: the restarted trainer's load
    from the daemon's memory against load-2g's load through the daemon
    (item "ckptd", its headline figure) in the same round."""
    item = "ckptd_ram"
    gib = sc["bytes"] / GIB
    r = {"bytes": sc["bytes"], "tensors": sc["tensors"], "ranks": 1, "rounds": len(rounds.rounds)}
    ram_r = rounds.series(item, "ms")
    load_r = rounds.series("ckptd", "ms")
    ms = median(ram_r)
    r["ram_load_ms"] = ms
    r["ram_load_s"] = ms / 1e3 if ms else None
    r["ram_gibps"] = ratio(gib, r["ram_load_s"])
    first = rounds.rounds[0]["warmup"].get(item) if rounds.rounds else None
    r["first_ram_load_s"] = first["seconds"] if first else None
    lm = median(load_r)
    r["load_2g_load_s"] = lm / 1e3 if lm else None
    last = next((rd["figures"][item] for rd in reversed(rounds.rounds) if item in rd["figures"]), {})
    r["ram_bytes_read"] = last.get("bytes_read")
    r["ram_bytes_resident"] = last.get("bytes_resident")
    r["ram_files_resident"] = last.get("files_resident")
    r["ram_reads"] = last.get("reads")

    per = []
    round_ratios = []
    for i in range(len(rounds.rounds)):
        x = ratio(load_r[i], ram_r[i])
        per.append(x)
        round_ratios.append({"ram_vs_load_2g": x})
    r["ratios"] = {"ram_vs_load_2g": spread(per)}
    if r["ram_load_ms"] is None:
        notes.append("ram_vs_load_2g: no restore from memory succeeded (see the rounds' errors)")
    elif not any(x is not None for x in per):
        notes.append("ram_vs_load_2g: load-2g's load did not succeed in any round that restored")
    notes.append("ram_vs_load_2g = load-2g's load time through ckptd (its item 'ckptd': the daemon reads the "
                 "shard file from the disk with O_DIRECT into the loader's arena; not its standalone load) / this "
                 "load's, per round")
    notes.append("every measurement is one trainer's two lives: a ckpt_bench connected with "
                 "CKPT_CONNECT_RESIDENT saves the state (committed; not timed) and is killed with SIGKILL, "
                 "then a new ckpt_bench of the same job connects and loads that checkpoint through its "
                 "client (ckpt_load_set_client), timed from ckpt_reader_open to the done future as load-2g's "
                 "load is, its files dropped from the page cache first; a load that took any file or byte "
                 "from storage fails the run. A save per measurement (two per round with the warm-up) "
                 "rather than one before the rounds: the scenario is a kill after a save and a load by a "
                 "process that has never loaded, and the save is the one step that makes the image. So "
                 "every figure is a new process's first load, while load-2g's are a long-lived process's")
    r["resident_after_drop_bytes"] = resident_note(rounds, {}, [item], notes)
    r["max_loop_stall_ms"] = detail.get("max_loop_stall_ms")
    r["max_loop_cpu_ms"] = detail.get("max_loop_cpu_ms")
    cost = load_cost(rounds, item)
    r["ram_cpu_ms"] = cost.get("cpu_ms")
    r["bound"] = restore_bound(r, cost)
    notes.append("bound: " + r["bound"])

    d = dict(detail)
    d["restore"] = {"saver": "ckpt_bench --job J --no-limits --resident --arena %d: 'save default keep'"
                             % RESTORE_SAVER_ARENA,
                    "loader": "ckpt_bench --job J --no-limits --arena %d: 'load via default from NAME'"
                              % RESTORE_LOADER_ARENA,
                    "job": "a job of its own per measurement (see RestoreCycles)"}
    d["cpu"] = {item: cost}
    d["rounds"] = [{"order": rd["order"],
                    "figures": {k: v for k, v in rd["figures"].items() if k in (item, "ckptd")},
                    "warmup": {k: v for k, v in rd.get("warmup", {}).items() if k == item},
                    "errors": rd["errors"], "ratios": rr}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return r


def restore_bound(r, cost):
    """One line: what bounds restore-ram-2g's figures."""
    s = r.get("ram_load_s")
    if not s:
        return "n/a (no restore from memory succeeded)"
    parts = ["the load copies %.0f MiB from the daemon's image (a read-only mapping of its memfd, the "
             "pages mapped afresh by every new process) into the state and checks every 1 MiB block's "
             "CRC32C: %.2f GiB/s" % ((r.get("ram_bytes_resident") or 0) / MIB, r["ram_gibps"])]
    if cost.get("cpu_ms") is not None:
        parts.append("%.0f ms of CPU in %.0f ms (%.2f cores of %d), %s minor faults"
                     % (cost["cpu_ms"], s * 1e3, cost["cpu_ms"] / (s * 1e3), cpus(),
                        "%.0f" % cost["minflt"] if cost.get("minflt") is not None else "n/a"))
    if r.get("load_2g_load_s"):
        parts.append("load-2g reads the same bytes from the disk through ckptd in %.2f s" % r["load_2g_load_s"])
    return "; ".join(parts)


def fmt_bytes(n):
    return "%.0f MiB" % (n / MIB) if n >= MIB else "%.0f KiB" % (n / 1024)


def reshard_bound(r, read_best, cost, amp):
    """One line: what bounds a reshard's figures."""
    s = r["reshard_ms"] / 1e3 if r.get("reshard_ms") else None
    if not s:
        return "n/a (no reshard measurement)"
    read = (r.get("reshard_bytes_read") or 0) / GIB
    disk = r.get("reshard_daemon_disk_bytes")
    disk_gib = disk / GIB if disk is not None else read
    parts = ["through ckptd (reshard_ms, reshard_gibps), %d loaders used %.2f GiB of checked pieces (%.2f GiB "
             "of them shared: read from the disk for another loader and served from ckptd's pool) to fill "
             "the %.2f GiB they wanted; ckptd read %.2f GiB from the disk (%.2f x what they wanted; the kernel "
             "counted %s GiB read by ckptd) in %.2f s: %.2f GiB/s from the disk, against a read limit of %s "
             "GiB/s for the checkpoint's files (%s)"
             % (r["loaders"], read, (r.get("reshard_bytes_shared") or 0) / GIB,
                (r.get("reshard_bytes_wanted") or 0) / GIB, disk_gib, amp or 0,
                "%.2f" % (r["reshard_daemon_proc_read_bytes"] / GIB)
                if r.get("reshard_daemon_proc_read_bytes") is not None else "n/a", s, disk_gib / s,
                "%.2f" % r["read_limit_gibps"] if r.get("read_limit_gibps") else "n/a", read_best)]
    if cost.get("cpu_ms") is not None:
        parts.append("CPU: %.0f ms of the loaders' in %.0f ms (%.2f cores of %d busy with the loads; every byte "
                     "read is CRC-checked, and a band not contiguous in its read is copied out of the arena), "
                     "ckptd's own %s ms, %s minor faults in the timed part (the bands' memory was touched "
                     "before: these are the library's own buffers)"
                     % (cost["cpu_ms"], s * 1e3, cost["cpu_ms"] / (s * 1e3), cpus(),
                        "%.0f" % cost["daemon_cpu_ms"] if cost.get("daemon_cpu_ms") is not None else "n/a",
                        "%.0f" % cost["minflt"] if cost.get("minflt") is not None else "n/a"))
    sa = r.get("reshard_standalone_ms")
    if sa:
        parts.append("the library alone (reshard_standalone_ms: informational) %.2f s, %.2f GiB/s of the bytes "
                     "wanted: buffered preadv, so bytes one loader just read may come to another from the page "
                     "cache rather than the disk" % (sa / 1e3, r.get("reshard_standalone_gibps") or 0))
    return "; ".join(parts)


# ---- S3 ---------------------------------------------------------------------

S3_BUCKET = "ckpt-bench"
S3_PREFIX = "bench"          # ckptd's root: s3://S3_BUCKET/S3_PREFIX
AWSCLI_PREFIX = "awscli"     # where `aws s3 cp` puts its copies
SERVER_START_TIMEOUT = 60
# `aws s3 cp` settings tried in every round (the `s3 =` section of a private
# AWS_CONFIG_FILE): max_concurrent_requests {10 (awscli's default), 16, 32}
# x multipart_chunksize {8 MiB (the default), 64 MiB}.  The one with the
# best median time is the peer's figure (BENCH.md: peers at the best
# settings found in the run).
AWSCLI_CONFIGS = [("default", {}),
                  ("mcr16", {"max_concurrent_requests": 16}),
                  ("mcr32", {"max_concurrent_requests": 32}),
                  ("chunk64m", {"multipart_chunksize": "64MB"}),
                  ("mcr16-chunk64m", {"max_concurrent_requests": 16, "multipart_chunksize": "64MB"}),
                  ("mcr32-chunk64m", {"max_concurrent_requests": 32, "multipart_chunksize": "64MB"})]
AWSCLI_DEFAULTS = "max_concurrent_requests 10, multipart_chunksize 8MB, multipart_threshold 8MB (awscli's defaults)"

_TEST_PY = []


def test_python():
    """(the test environment's python, None) or (None, why): it runs the S3
    servers and the bucket housekeeper (moto, boto3, crc32c)."""
    if _TEST_PY:
        return _TEST_PY[0]
    script = os.path.join(REPO, "scripts", "pyenv.sh")
    res = (None, "scripts/pyenv.sh is missing")
    if os.access(script, os.X_OK):
        progress("test Python environment (scripts/pyenv.sh test)")
        try:
            p = subprocess.run([script, "test"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=3600, cwd=REPO)
            py = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
            if p.returncode == 0 and os.access(py, os.X_OK):
                q = subprocess.run([py, "-c", "import moto, boto3, crc32c; print(moto.__version__)"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
                res = ((py, None) if q.returncode == 0 else
                       (None, "the test Python lacks moto/boto3/crc32c: %s" % q.stderr.strip()[-200:]))
            else:
                res = (None, "scripts/pyenv.sh test failed (exit %d): %s"
                       % (p.returncode, " ".join(p.stderr.strip().splitlines()[-3:])))
        except (OSError, subprocess.TimeoutExpired) as e:
            res = (None, "scripts/pyenv.sh test failed: %s" % e)
    _TEST_PY.append(res)
    return res


# ckptd's default load_share (daemon/config.c): the pool of one uid's loads.
LOAD_SHARE_DEFAULT = 512 * MIB


def daemon_disk(daemon, pid):
    """(ckptd's status loads.disk_bytes, its /proc/PID/io read_bytes), each
    None where unknown."""
    try:
        st = daemon.status()
        disk = st.get("loads", {}).get("disk_bytes")
    except BenchError:
        disk = None
    io = None
    try:
        with open("/proc/%d/io" % pid) as f:
            for ln in f:
                if ln.startswith("read_bytes:"):
                    io = int(ln.split()[1])
    except (OSError, ValueError, TypeError):
        pass
    return disk, io


def proc_cpu_s(pid):
    """utime + stime of a process (all its threads), in seconds, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def clean_env(base=None):
    """The caller's environment without AWS settings of its own (profiles,
    endpoints, session tokens) and with loopback never sent to a proxy."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("AWS_")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


class S3Server:
    """moto (tests/tools/s3_fixture.py: signatures checked) or
    tests/tools/s3_proxy.py --sink (signatures and checksums checked,
    nothing stored), on 127.0.0.1, with its own bucket and credentials.
    stop() is always called and stops it by its PID."""

    def __init__(self, kind, sdir, py):
        self.kind = kind
        self.sdir = sdir
        self.py = py
        self.dir = os.path.join(sdir, kind)
        self.label = ("moto (tests/tools/s3_fixture.py)" if kind == "moto"
                      else "tests/tools/s3_proxy.py --sink")
        self.endpoint = None
        self.pid = None
        self.proc = None
        self.creds = None
        self.version = None
        self.root = "s3://%s/%s" % (S3_BUCKET, S3_PREFIX)

    def env(self, daemon=False, base=None):
        """Environment for a client of this server (the daemon: credentials
        only; the rest: endpoint and bucket too)."""
        env = clean_env(base)
        env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = self.creds
        env["AWS_REGION"] = "us-east-1"
        if not daemon:
            env["S3_ENDPOINT"] = self.endpoint
            env["S3_BUCKET"] = S3_BUCKET
        return env

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        if self.kind == "moto":
            self._start_moto()
        else:
            self._start_sink()

    def _start_moto(self):
        fixture = os.path.join(REPO, "tests", "tools", "s3_fixture.py")
        tmp = os.path.join(self.dir, "tmp")  # where moto spills object bodies
        os.makedirs(tmp, exist_ok=True)
        env = clean_env()
        env["TMPDIR"] = tmp
        try:
            p = subprocess.run([self.py, fixture, "start", "--dir", self.dir, "--bucket", S3_BUCKET],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               timeout=SERVER_START_TIMEOUT + 60)
        except subprocess.TimeoutExpired:
            raise BenchError("s3_fixture.py start timed out")
        if p.returncode != 0:
            raise BenchError("moto did not start: %s" % p.stderr.strip()[-400:])
        try:
            with open(os.path.join(self.dir, "s3.json")) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise BenchError("moto: %s/s3.json: %s" % (self.dir, e))
        self.endpoint = d["S3_ENDPOINT"]
        self.pid = int(d["MOTO_PID"])
        self.creds = (d["AWS_ACCESS_KEY_ID"], d["AWS_SECRET_ACCESS_KEY"])
        q = subprocess.run([self.py, "-c", "import moto; print(moto.__version__)"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=120)
        self.version = "moto " + q.stdout.strip()

    def _start_sink(self):
        proxy = os.path.join(REPO, "tests", "tools", "s3_proxy.py")
        port_file = os.path.join(self.dir, "port")
        key = "AKIA" + os.urandom(8).hex().upper()
        secret = os.urandom(20).hex()
        self.creds = (key, secret)
        self.log = open(os.path.join(self.dir, "proxy.log"), "w")
        try:
            self.proc = subprocess.Popen([self.py, proxy, "--listen-port-file", port_file, "--sink",
                                          "--access-key", key, "--secret-key", secret],
                                         stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                         env=clean_env(), preexec_fn=die_with_parent)
        except OSError as e:
            raise BenchError("s3_proxy.py: %s" % e)
        self.pid = self.proc.pid
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:
                raise BenchError("s3_proxy.py exited with status %d: %s"
                                 % (self.proc.returncode, log_tail(self.log.name, 5)))
            if time.monotonic() > deadline:
                raise BenchError("s3_proxy.py did not listen within %d s" % SERVER_START_TIMEOUT)
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read().strip())
        self.endpoint = "http://127.0.0.1:%d" % self.port
        self.version = "s3_proxy.py --sink (SigV4 and checksums checked)"
        self.control("POST", "/__proxy/config", {"reset": True})

    def control(self, method, path, body=None):
        """The sink's control API (JSON)."""
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = json.dumps(body).encode() if body is not None else None
            c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            r = c.getresponse()
            out = r.read()
            if r.status != 200:
                raise BenchError("s3_proxy %s %s: %d %s" % (method, path, r.status, out[:200]))
            return json.loads(out)
        except (OSError, ValueError) as e:
            raise BenchError("s3_proxy %s %s: %s" % (method, path, e))
        finally:
            c.close()

    def cpu_s(self):
        return proc_cpu_s(self.pid) if self.pid else None

    def stop(self):
        if self.kind == "moto":
            if os.path.exists(os.path.join(self.dir, "moto.pid")):
                try:
                    p = subprocess.run([self.py, os.path.join(REPO, "tests", "tools", "s3_fixture.py"), "stop",
                                        "--dir", self.dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, timeout=60)
                    if p.returncode != 0:
                        progress("moto stop: %s" % p.stderr.strip()[-300:])
                except subprocess.TimeoutExpired:
                    progress("moto stop timed out (pid %s)" % self.pid)
            shutil.rmtree(os.path.join(self.dir, "tmp"), ignore_errors=True)
        elif self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
            self.log.close()


def awscli_path():
    """Debian's awscli (what deps.sh installs), else an `aws` on PATH."""
    if os.access("/usr/bin/aws", os.X_OK):
        return "/usr/bin/aws"
    return shutil.which("aws")


def awscli_config_text(settings):
    if not settings:
        return ""  # awscli's defaults (an empty `s3 =` section is an error in awscli 2.9)
    return "[default]\ns3 =\n" + "".join("    %s = %s\n" % kv for kv in settings.items())


def make_source_file(path, nbytes):
    """The file `aws s3 cp` uploads: nbytes, a 64 MiB random block repeated
    (no compression anywhere on the path; the contents do not matter), read
    from the page cache like ckptd's arena is from memory."""
    block = os.urandom(min(64 * MIB, nbytes))
    with open(path, "wb") as f:
        left = nbytes
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def s3_scenario(name, sc, daemon, server, run_dir, data, failures):
    """save-s3-1g (moto) and s3-sink-2g (the sink): a ckptd save to S3
    against `aws s3 cp` of a file of the same size to the same server, each
    awscli setting in every round, and the client's copy limit next to the
    save; the server's CPU time around every run.  Returns {name: result}."""
    nbytes, tensors = sc["bytes"], sc["tensors"]
    gib = nbytes / GIB
    sink = server.kind == "sink"
    ratio_key = "s3_client_vs_awscli" if sink else "s3_vs_awscli"
    notes = []
    detail = {"server": {"kind": server.kind, "what": server.version, "endpoint": server.endpoint,
                         "pid": server.pid, "bucket": S3_BUCKET, "root": server.root}}
    env = server.env(base=worker_env(1))
    arena = arena_for(nbytes, tensors)

    # What runs at once: ckpt_bench (state, limit memfd, arena), the server
    # (moto holds the parts and concatenates them at the Complete: ~5x the
    # object measured with 1 GiB; the sink a body buffer per connection),
    # and awscli (chunk x requests in flight at worst).
    plan = {"ckpt_bench": 2 * nbytes + arena + 64 * MIB,
            "server": (5 * nbytes if not sink else 32 * 64 * MIB) + 200 * MIB,
            "awscli": 32 * 64 * MIB + 200 * MIB, "margin": GIB}
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    avail = meminfo("MemAvailable")
    detail["mem_available_gib_at_start"] = round(avail / GIB, 2) if avail is not None else None
    if avail is not None and avail < sum(plan.values()):
        notes.append("only %.1f GiB of memory available, the scenario wants ~%.1f GiB"
                     % (avail / GIB, sum(plan.values()) / GIB))

    aws = awscli_path()
    src = os.path.join(data, "awscli-source-%d" % os.getpid())
    aws_configs = {}
    if aws is None:
        notes.append("awscli_s: null: awscli is not installed (/usr/bin/aws or aws on PATH; "
                      "scripts/deps.sh installs Debian's awscli)")
    else:
        for cname, settings in AWSCLI_CONFIGS:
            path = os.path.join(run_dir, "aws-config-%s" % cname)
            with open(path, "w") as f:
                f.write(awscli_config_text(settings))
            aws_configs[cname] = path
        detail["awscli"] = {"path": aws, "version": tool_version([aws, "--version"]),
                            "defaults": AWSCLI_DEFAULTS,
                            "configs": {c: (s or "awscli's defaults") for c, s in AWSCLI_CONFIGS},
                            "config_files": {c: awscli_config_text(s) for c, s in AWSCLI_CONFIGS},
                            "how": "aws --endpoint-url ENDPOINT s3 cp --only-show-errors --no-progress FILE "
                                   "s3://%s/%s/CONFIG/N, with AWS_CONFIG_FILE the config's private file, "
                                   "credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                                   "AWS_SHARED_CREDENTIALS_FILE pointing nowhere; timed from the "
                                   "process's start to its exit (start-up included)" % (S3_BUCKET,
                                                                                        AWSCLI_PREFIX)}

    progress("%s: starting ckpt_bench (root %s)%s" % (name, server.root, "" if sink else ", bucket housekeeper"))
    ckpt = start_worker("ckpt_bench", ckpt_argv(daemon, nbytes, tensors, 1, ["default:0"], arena),
                        run_dir, env, notes)
    objs = None
    if not sink:
        objs = start_worker("s3_objects", [server.py, os.path.join(REPO, "bench", "baselines", "s3_objects.py")],
                            run_dir, env, notes)
    workers = [w for w in (ckpt, objs) if w]
    warm = {}
    counter = [0]
    try:
        ready = await_ready(ckpt, notes, "ckpt_bench")
        if ready is None:
            raise BenchError("ckpt_bench did not start: %s" % notes[-1])
        if not sink and await_ready(objs, notes, "the bucket housekeeper (s3_objects.py)") is None:
            raise BenchError("the bucket housekeeper did not start: %s" % notes[-1])
        detail["ckpt_bench"] = ready
        cl = ready["clients"]["default"]
        if aws:
            progress("%s: writing the %d MiB file awscli uploads" % (name, nbytes // MIB))
            make_source_file(src, nbytes)

        def check_upload(res, what, prefix, want_key):
            """After a run: what the server got.  moto: the objects under
            prefix (then removed); the sink: its counters, reset before the
            run (every part accepted: no BadDigest, no invalid checksum)."""
            if sink:
                st = server.control("GET", "/__proxy/stats")
                log = server.control("GET", "/__proxy/log")
                parts = [e for e in log if "partNumber=" in e["path"] and e["method"] == "PUT"]
                # Not failures by themselves: ckptd asks for what must not
                # exist yet (manifest, attempt), and the sink has nothing.
                non_2xx = [e for e in log if e["status"] is None or e["status"] >= 300]
                res["server_stats"] = {k: st[k] for k in ("requests", "forwarded", "baddigest", "invalid",
                                                         "bytes_in", "upstream_errors")}
                res["server_stats"]["parts"] = len(parts)
                res["server_stats"]["non_2xx"] = [(e["method"], e["path"][:80], e["status"]) for e in non_2xx][:5]
                bad = []
                if st["baddigest"] or st["invalid"]:
                    bad.append("%d BadDigest and %d invalid-checksum answers" % (st["baddigest"], st["invalid"]))
                bad_parts = [e for e in parts if e["status"] != 200]
                if bad_parts:
                    bad.append("%d of %d parts not accepted (first: %s %s)" % (
                        len(bad_parts), len(parts), bad_parts[0]["status"], bad_parts[0]["path"][:80]))
                if st["bytes_in"] < nbytes:
                    bad.append("the sink received %d bytes, fewer than the %d uploaded" % (st["bytes_in"], nbytes))
                if bad:
                    raise BenchError("%s: the sink refused the upload: %s" % (what, "; ".join(bad)))
            else:
                out = objs.cmd("clean %s/" % prefix)
                res["server_objects"] = {"objects": out["objects"], "bytes": out["bytes"],
                                         "open_uploads": out["uploads"]}
                if want_key not in out["sizes"]:
                    raise BenchError("%s: no %s in the bucket after the upload (found: %s)"
                                     % (what, want_key, ", ".join(list(out["sizes"])[:5]) or "nothing"))
                if out["bytes"] < nbytes:
                    raise BenchError("%s: %d bytes in the bucket, fewer than %d" % (what, out["bytes"], nbytes))
                if out["uploads"]:
                    raise BenchError("%s: %d multipart upload(s) left open" % (what, out["uploads"]))

        def measured(fn, what, prefix, key_of, client_pid=None):
            """fn() with the server's CPU seconds around it (and the
            client's: the daemon's, or awscli's from its rusage), then the
            check of what the server got."""
            if sink:
                server.control("POST", "/__proxy/config", {"reset": True})
            s0 = server.cpu_s()
            c0 = proc_cpu_s(client_pid) if client_pid else None
            ok = False
            res = None
            try:
                res = fn()
                s1 = server.cpu_s()
                c1 = proc_cpu_s(client_pid) if client_pid else None
                wall = res["committed_ms"] / 1e3 if "committed_ms" in res else res["seconds"]
                res["server_cpu_s"] = round(s1 - s0, 3) if s0 is not None and s1 is not None else None
                res["server_cores_busy"] = round((s1 - s0) / wall, 3) if res["server_cpu_s"] is not None else None
                if c0 is not None and c1 is not None:
                    res["client_cpu_s"] = round(c1 - c0, 3)
                ok = True
            finally:
                if not ok and not sink and not objs.dead:
                    # Whatever a failed run left: gone before the next one.
                    try:
                        objs.cmd("clean %s/" % prefix)
                    except BenchError:
                        pass
            check_upload(res, what, prefix, key_of(res))
            return res

        def ckptd_save():
            return measured(lambda: ckpt.cmd("save default"), "ckptd", S3_PREFIX,
                            lambda r: "%s/%s/manifest.json" % (S3_PREFIX, r["name"]), daemon.proc.pid)

        def awscli_cp(cname):
            counter[0] += 1
            key = "%s/%s/%d" % (AWSCLI_PREFIX, cname, counter[0])
            aenv = server.env(base=worker_env(1))
            aenv["AWS_CONFIG_FILE"] = aws_configs[cname]
            aenv["AWS_SHARED_CREDENTIALS_FILE"] = os.path.join(run_dir, "no-aws-credentials")
            argv = [aws, "--endpoint-url", server.endpoint, "s3", "cp", "--only-show-errors", "--no-progress",
                    src, "s3://%s/%s" % (S3_BUCKET, key)]

            def run():
                import resource
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.monotonic()
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=aenv, preexec_fn=die_with_parent)
                try:
                    out, err = p.communicate(timeout=CMD_TIMEOUT)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()
                    raise BenchError("aws s3 cp (%s) timed out after %d s" % (cname, CMD_TIMEOUT))
                secs = time.monotonic() - t0
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if p.returncode != 0:
                    raise BenchError("aws s3 cp (%s) exited with status %d: %s"
                                     % (cname, p.returncode, (err or out).strip()[-300:]))
                return {"seconds": round(secs, 4), "config": cname, "key": key,
                        "awscli_cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3)}

            res = measured(run, "aws s3 cp (%s)" % cname, AWSCLI_PREFIX, lambda r: r["key"])
            res["client_cpu_s"] = res.pop("awscli_cpu_s")
            return res

        # Warm-ups (before round 1, not in the medians): the first save,
        # the copies, one `aws s3 cp` per setting (which also proves each
        # setting runs: one that fails is left out with a note).
        progress("%s: warm-up runs" % name)
        warm["ckptd"] = ckptd_save()
        for method in ("memcpy", "stream"):
            ckpt.cmd("copy %s default" % method)
        have_aws = []
        for cname in aws_configs:
            try:
                warm["awscli_" + cname] = awscli_cp(cname)
                have_aws.append(cname)
            except BenchError as e:
                notes.append("awscli setting %s left out: its warm-up failed: %s" % (cname, e))
        if aws and not have_aws:
            notes.append("awscli_s: null: no awscli setting ran (see notes)")
        stall_before, _ = loop_stall(daemon, [])

        items = [("ckptd", ckptd_save, ckpt),
                 ("copy_memcpy", lambda: ckpt.cmd("copy memcpy default"), ckpt),
                 ("copy_stream", lambda: ckpt.cmd("copy stream default"), ckpt)]
        for cname in have_aws:
            items.append(("awscli_" + cname, (lambda c=cname: awscli_cp(c)), None))
        rounds = Rounds(name, items, None, [["ckptd", "copy_memcpy", "copy_stream"]])
        rounds.run(ROUNDS, failures, notes)
        stall, status = loop_stall(daemon, notes)
        detail["max_loop_stall_ms_after_warmup"] = stall_before
        detail["status_totals"] = (status or {}).get("totals")
        detail["min_mem_available_gib"] = (round(rounds.min_mem_available / GIB, 2)
                                           if rounds.min_mem_available is not None else None)
    finally:
        close_workers(workers, notes)
        try:
            os.unlink(src)
        except FileNotFoundError:
            pass

    # The daemon's S3 settings, as it logged them at start.
    s3_line = None
    try:
        with open(daemon.log_path, errors="replace") as f:
            s3_line = next((ln.strip() for ln in f if "S3: endpoint" in ln), None)
    except OSError:
        pass
    detail["ckptd_s3"] = {"log": s3_line, "part_bytes": cl["slot_bytes"],
                          "parts": "the arena's extents (slot size), each with x-amz-checksum-crc32c, "
                                   "UNSIGNED-PAYLOAD; s3_parts_in_flight: the daemon's default",
                          "config": [ln for ln in daemon.extra_conf]}

    r = {"bytes": nbytes, "tensors": tensors, "ranks": 1, "rounds": len(rounds.rounds), "server": server.version}
    for k in ("call_ms", "staged_ms", "committed_ms"):
        r[k] = median(rounds.series("ckptd", k))
        r["first_" + k] = warm.get("ckptd", {}).get(k)
    r["connect_ms"] = cl["connect_ms"]
    r["copy_threads"] = cl["copy_threads"]
    r["slot_bytes"] = cl["slot_bytes"]
    copy_best, r["copy_limit_gibps"], copy_r, copy_meds = best_of(rounds, ["copy_memcpy", "copy_stream"], "gibps")
    aws_items = ["awscli_" + c for c in have_aws]
    aws_best, r["awscli_s"], aws_r, aws_meds = best_of(rounds, aws_items, "seconds", higher=False)
    r["awscli_config"] = aws_best[len("awscli_"):] if aws_best else None
    r["first_awscli_s"] = warm.get(aws_best, {}).get("seconds") if aws_best else None
    r["awscli_gibps"] = ratio(gib, r["awscli_s"])
    r["committed_gibps"] = ratio(gib, r["committed_ms"] / 1e3 if r["committed_ms"] else None)
    for who, item in (("ckptd", "ckptd"), ("awscli", aws_best)):
        r["server_cpu_s_" + who] = median(rounds.series(item, "server_cpu_s")) if item else None
        r["server_cores_busy_" + who] = median(rounds.series(item, "server_cores_busy")) if item else None
        r["client_cpu_s_" + who] = median(rounds.series(item, "client_cpu_s")) if item else None
    r["max_loop_stall_ms"] = stall
    r["max_loop_cpu_ms"] = find_key(status, "max_loop_cpu_ms") if status else None

    per = {ratio_key: [], "staging_vs_copy_limit": []}
    round_ratios = []
    for i, rd in enumerate(rounds.rounds):
        f = rd["figures"].get("ckptd", {})
        comm_s = f.get("committed_ms") / 1e3 if f.get("committed_ms") else None
        staged_s = f.get("staged_ms") / 1e3 if f.get("staged_ms") else None
        x = {ratio_key: ratio(aws_r[i], comm_s),
             "staging_vs_copy_limit": ratio(ratio(gib, staged_s), copy_r[i])}
        for k, v in x.items():
            per[k].append(v)
        round_ratios.append(x)
    r["ratios"] = {ratio_key: spread(per[ratio_key]),
                   "staging_vs_copy_limit": spread(per["staging_vs_copy_limit"], ceiling=1.0)}

    if r["copy_limit_gibps"] is None:
        notes.append("copy_limit_gibps: no copy-limit measurement succeeded")
    if aws and have_aws and r["awscli_s"] is None:
        notes.append("awscli_s: null: no `aws s3 cp` run succeeded in the rounds")
    v = r["ratios"]["staging_vs_copy_limit"]
    above = sum(1 for x in per["staging_vs_copy_limit"] if x is not None and x > 1.0)
    if v["median"] is not None and v["median"] > 1.0:
        notes.append("staging_vs_copy_limit: median %.2f is above 1.0: ckptd beat the limit, so the limit is "
                     "not the limit on this machine; suspect the limit first (BENCH.md)" % v["median"])
    elif above:
        notes.append("staging_vs_copy_limit: above 1.0 in %d of %d rounds (max %.2f), median below: the "
                     "machine's noise between the measurements of one round (detail.rounds)"
                     % (above, len(per["staging_vs_copy_limit"]), v["max"]))
    r["bound"] = s3_bound(r, server, sink, ratio_key)
    notes.append("bound: " + r["bound"])

    detail["copy_limit"] = {"method": copy_best, "medians_gibps": copy_meds, "threads_per_rank": cl["copy_threads"],
                            "piece_bytes": cl["slot_bytes"],
                            "stat": "best median of the methods; per round, the best method's figure"}
    if aws:
        detail["awscli"].update({"best": r["awscli_config"], "medians_s": aws_meds, "ran": have_aws,
                                 "median_server_cpu_s": {i: median(rounds.series(i, "server_cpu_s"))
                                                         for i in aws_items},
                                 "stat": "the setting with the best median seconds; per round, its figure"})
    detail["cpu"] = {
        "what": "server_cpu_s: the server process's utime+stime (all threads, /proc/PID/stat) from just "
                "before a run to its end (for ckptd: until the committed future); client_cpu_s: the "
                "daemon's (ckptd) or the aws process tree's (rusage) over the same window; "
                "server_cores_busy = server_cpu_s / the run's seconds",
        "cpus": cpus()}
    detail["warmup"] = warm
    detail["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                         "ratios": rr} for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = detail
    return {name: r}


def s3_bound(r, server, sink, ratio_key):
    """One line: what bounds the scenario's figures, from its own CPU
    figures (the server is one Python process: its GIL lets it use about
    one core, and this machine has cpus() of them for everything)."""
    n = cpus()

    def side(who, label):
        cpu, busy = r.get("server_cpu_s_" + who), r.get("server_cores_busy_" + who)
        cli = r.get("client_cpu_s_" + who)
        wall = (r["committed_ms"] / 1e3 if who == "ckptd" and r.get("committed_ms") else
                r.get("awscli_s") if who == "awscli" else None)
        if cpu is None or wall is None:
            return "%s: n/a" % label
        return ("%s %.2f s: server %.2f CPU-s (%.2f cores busy), client %s CPU-s"
                % (label, wall, cpu, busy, "%.2f" % cli if cli is not None else "n/a"))

    what = "moto" if not sink else "the sink proxy (Python)"
    figs = "%s; %s" % (side("ckptd", "ckptd committed"),
                       side("awscli", "awscli (%s)" % (r.get("awscli_config") or "n/a")))
    busy = r.get("server_cores_busy_ckptd")
    if not sink:
        verdict = ("moto's CPU on %d cores: moto is one Python process (its request handling holds the GIL), "
                   "so it can use about one core, and it spends most of it on moto's own work (parsing each part, "
                   "concatenating them at CompleteMultipartUpload); %s therefore compares how much moto work "
                   "and waiting each client's requests cause, not the clients' own speed" % (n, ratio_key))
        if busy is not None and busy < 0.7:
            verdict += ("; in this run moto was busy only %.2f cores during ckptd's save, so part of ckptd's time "
                        "was not moto's (see client CPU)" % busy)
    else:
        verdict = ("the %d cores shared by client and sink: the proxy (Python) reads every part, checks its "
                   "CRC32C and SigV4 (and the payload's SHA-256 where the client signed it: awscli over http "
                   "does, ckptd sends UNSIGNED-PAYLOAD), while the client computes its checksums and sends; "
                   "parts go up once their checksum pass ran, which waits until the rank is staged "
                   "unless the arena runs short of slots, so the sink's CPU (which a remote S3 would "
                   "not take) mostly follows staging rather than competing with it" % n)
    return "%s (%s; %s)" % (verdict, what, figs)


def empty_result(name, sc, why):
    r = {"bytes": sc["bytes"] * sc["ranks"], "tensors": sc["tensors"], "ranks": sc["ranks"], "rounds": 0,
         "ratios": {}, "notes": [why], "detail": {}}
    return r


def gpu_probe():
    """(devices, why not, fake) through libckpt's own CUDA loader
    (bench/gpu_probe); fake: the runtime found is the tests' fake, however
    it was named (BENCH_FAKE_CUDA or a CKPT_CUDART of the caller's)."""
    if FAKE_CUDA and not os.access(FAKE_CUDART, os.R_OK):
        return 0, "BENCH_FAKE_CUDA: %s is missing (make tests-build makes it)" % FAKE_CUDART, True
    try:
        out = subprocess.run([os.path.join(BUILD, "bench", "gpu_probe")], capture_output=True, text=True,
                             timeout=60, preexec_fn=die_with_parent, env=worker_env(1, gpu=True)).stdout
        d = json.loads(out)
        return d["devices"], d["error"], bool(d.get("fake"))
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        return 0, "bench/gpu_probe failed: %s" % e, False


def scale_scenario(name, sc, run_dir, failures):
    """bench/ckpt_scale at the scenario's world sizes, ROUNDS rounds (its own
    warm-up first): no daemon, no disk.  Its summary's targets are this
    scenario's: the worst world size's merge_vs_parse and plan_one_vs_open,
    and the log-log slopes over the world sizes (median over rounds)."""
    exe = os.path.join(BUILD, "bench", "ckpt_scale")
    sdir = os.path.join(run_dir, name)
    os.makedirs(sdir, exist_ok=True)
    err_path = os.path.join(sdir, "ckpt_scale.err")
    argv = [exe, "--ranks", sc["worlds"], "--tensors", str(sc["tensors"]), "--reps", str(ROUNDS)]
    progress("%s: %s" % (name, " ".join(argv[1:])))
    with open(err_path, "w") as err:
        try:
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, timeout=3600,
                                 check=False, text=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            failures.append("%s: %s" % (name, e))
            return empty_result(name, sc, "not run: %s" % e)
    recs = []
    for line in out.stdout.splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    worlds = [x for x in recs if x.get("record") == "ranks"]
    summ = next((x for x in recs if x.get("record") == "summary"), None)
    if out.returncode != 0 or summ is None or not worlds:
        why = "ckpt_scale exited %d: %s" % (out.returncode, log_tail(err_path, 3))
        failures.append("%s: %s" % (name, why))
        return empty_result(name, sc, "not run: %s" % why)
    top = max(worlds, key=lambda x: x["ranks"])

    def worst(key):
        have = [x["ratios"][key] for x in worlds if key in x.get("ratios", {})]
        return max(have, key=lambda r: r["median"]) if have else None
    r = {"bytes": 0, "tensors": sc["tensors"], "ranks": top["ranks"], "rounds": ROUNDS, "ratios": {},
         "notes": [], "detail": {"worlds": worlds, "summary": summ, "stderr": err_path}}
    for key in ("merge_vs_parse", "plan_one_vs_open"):
        w = worst(key)
        if w is not None:
            r["ratios"][key] = dict(w)
    r["scaling_exponent_merge"] = summ.get("scaling_exponent_merge")
    r["scaling_exponent_plan_all"] = summ.get("scaling_exponent_plan_all")
    r["scale_chunks"] = top.get("chunks")
    r["scale_manifest_bytes"] = top.get("manifest_bytes")
    r["scale_merge_ms"] = top.get("merge_ms")
    r["scale_open_ms"] = top.get("open_ms")
    r["scale_plan_one_ms"] = top.get("plan_one_rank_ms")
    r["scale_plan_all_ms"] = top.get("plan_all_ranks_ms")
    mem = top.get("memory", {})
    r["scale_merge_peak_bytes"] = mem.get("merge_peak_bytes")
    r["scale_open_peak_bytes"] = mem.get("open_peak_bytes")
    r["notes"].append("bound: CPU (jansson parsing of the index and manifest texts); the new job "
                      "planned has 1000 ranks, each tensor cut along its saved dimension "
                      "(bench/ckpt_scale.c); ratios are the worst world size's")
    return r


# ---- prune-1000 -------------------------------------------------------------

PRUNE_S3_PREFIX = "prune"   # the S3 root pruned: s3://S3_BUCKET/PRUNE_S3_PREFIX
PRUNE_S3_THREADS = 32       # PUTs at once while an S3 root is made (not timed)
PRUNE_POLL_S = 0.002        # how often "during" looks whether the prune is under way
# store/remove.h's STORE_TRASH_PREFIX: what a local removal renames to.
TRASH_PREFIX = ".ckpt-trash-"


def ckptctl_path():
    ctl = os.path.join(BUILD, "ckptctl")
    if not os.access(ctl, os.X_OK):
        raise BenchError("%s is missing" % ctl)
    return ctl


def committed_in(root, env=None):
    """The committed checkpoints `ckptctl list ROOT --json` finds, as a
    sorted list of their paths below ROOT (at any depth; work areas, trash
    and incomplete ones are not)."""
    try:
        p = subprocess.run([ckptctl_path(), "list", root, "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, timeout=CMD_TIMEOUT,
                           preexec_fn=die_with_parent)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BenchError("ckptctl list %s: %s" % (root, e))
    if p.returncode != 0:
        raise BenchError("ckptctl list %s failed (exit %d): %s" % (root, p.returncode, p.stderr.strip()[-300:]))
    names = []
    for line in p.stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("state") == "committed":
            names.append(obj.get("path"))
    return sorted(names)


def check_root(root, want, when, env=None):
    """BenchError unless the committed checkpoints of root are exactly
    the names in want."""
    have = committed_in(root, env)
    if have != sorted(want):
        extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
        raise BenchError("%s %s: ckptctl list finds %d committed checkpoints, want %d (not wanted: %s; "
                         "missing: %s)" % (when, root, len(have), len(want), ", ".join(extra[:3]) or "none",
                                           ", ".join(missing[:3]) or "none"))


class PruneRun:
    """`ckptctl prune ROOT --keep-last KEEP --json`, started at once and
    reaped by a thread of its own, so that its end (and its CPU time, from
    wait4) is known while the caller does something else, such as a save.
    Times are CLOCK_MONOTONIC ns, as ckpt_bench's t_*_ns.  kill() or
    result() is always called; kill() stops it by its PID (its own
    process group)."""

    def __init__(self, root, keep, out_dir, env=None):
        self.root = root
        self.t_end = None
        self.rusage = None
        self.out_path = os.path.join(out_dir, "prune.out")
        self.err_path = os.path.join(out_dir, "prune.err")
        argv = [ckptctl_path(), "prune", root, "--keep-last", str(keep), "--json"]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.t_start = time.monotonic_ns()
            try:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                             preexec_fn=die_with_parent)
            except OSError as e:
                raise BenchError("ckptctl prune: %s" % e)
        self.thread = threading.Thread(target=self._reap, daemon=True)
        self.thread.start()

    def _reap(self):
        _, status, self.rusage = os.wait4(self.proc.pid, 0)
        self.t_end = time.monotonic_ns()
        self.proc.returncode = os.waitstatus_to_exitcode(status)

    def running(self):
        return self.thread.is_alive()

    def kill(self):
        if self.thread.is_alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.thread.join()

    def result(self, n, keep):
        """Waits for the prune: its figures, or BenchError unless it
        found n checkpoints and removed n - keep of them."""
        self.thread.join(CMD_TIMEOUT)
        if self.thread.is_alive():
            self.kill()
            raise BenchError("ckptctl prune %s did not end within %d s" % (self.root, CMD_TIMEOUT))
        summ = None
        with open(self.out_path, errors="replace") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("summary"), dict):
                    summ = obj["summary"]
        if self.proc.returncode != 0 or summ is None:
            raise BenchError("ckptctl prune %s exited with status %s: %s" % (
                self.root, self.proc.returncode, log_tail(self.err_path, 3) or "(no summary line)"))
        if (summ.get("checkpoints") != n or summ.get("removed") != n - keep or summ.get("failed")
                or summ.get("in_use")):
            raise BenchError("ckptctl prune %s: %s checkpoints found and %s removed (want %d of %d; failed %s, "
                             "in use %s)" % (self.root, summ.get("checkpoints"), summ.get("removed"), n - keep, n,
                                             summ.get("failed"), summ.get("in_use")))
        return {"seconds": round((self.t_end - self.t_start) / 1e9, 4), "checkpoints": summ["checkpoints"],
                "removed": summ["removed"],
                "cpu_s": round(self.rusage.ru_utime + self.rusage.ru_stime, 3),
                "t_start_ns": self.t_start, "t_end_ns": self.t_end}


def build_local_root(root, tpl, n):
    """A fresh ROOT holding prune_root.copies(n) of the checkpoint directory
    tpl (its files copied, the manifest rewritten), all of it on the disk
    (sync) before it returns: no writeback of the copies may run in a
    measurement.  Returns the seconds it took."""
    t0 = time.monotonic()
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with open(os.path.join(tpl, "manifest.json")) as f:
        manifest = json.load(f)
    files = [x for x in sorted(os.listdir(tpl)) if x != "manifest.json"]
    for cname, step, when in prune_root.copies(n):
        d = os.path.join(root, cname)
        os.mkdir(d)
        for x in files:
            shutil.copyfile(os.path.join(tpl, x), os.path.join(d, x))
        # The manifest last, as a commit writes it.
        with open(os.path.join(d, "manifest.json"), "wb") as f:
            f.write(prune_root.manifest_for(manifest, cname, step, when))
    os.sync()
    return round(time.monotonic() - t0, 3)


def prune_under_way(root, n):
    """How a running prune of a root of n checkpoints shows it removes:
    "trash" (a checkpoint renamed to a trash directory), "fewer" (fewer
    than n left: one was removed between two looks), or None (not yet)."""
    left = 0
    with os.scandir(root) as it:
        for e in it:
            if e.name.startswith(TRASH_PREFIX):
                return "trash"
            left += not e.name.startswith(".")
    return "fewer" if left < n else None


def overlap(a0, a1, b0, b1):
    """The share of [a0, a1] that [b0, b1] covers (0..1), or None."""
    if a1 is None or a0 is None or b0 is None or b1 is None or a1 <= a0:
        return None
    return round(max(0, min(a1, b1) - max(a0, b0)) / (a1 - a0), 4)


def prune_scenario(name, sc, daemon, server, s3_why, run_dir, failures):
    """prune-1000: `ckptctl prune --keep-last K` of a root of N committed
    checkpoints, local and (with server) on moto, and the staged_ms of a
    save-2g save started while a local prune runs against the same save
    alone, in rounds.  Every measurement starts from a fresh root made
    outside its timed part.  Returns {name: result}."""
    n, keep = sc["checkpoints"], sc["keep"]
    nbytes, tensors = sc["bytes"], sc["tensors"]
    notes, detail = [], {}
    env = worker_env(1)
    local_root = os.path.join(daemon.data, "prune-root")
    tpl_root = os.path.join(daemon.data, "prune-template")
    tpl_copy = os.path.join(run_dir, "prune-template")
    s3_root = "s3://%s/%s" % (S3_BUCKET, PRUNE_S3_PREFIX) if server else None
    ctl_env = None
    if server:
        ctl_env = server.env(base=env)
        ctl_env["AWS_ENDPOINT_URL_S3"] = server.endpoint
    if " " in run_dir:
        raise BenchError("the run directory '%s' has a space: prune_root.py's commands are words" % run_dir)

    # What runs at once: the saver (state and arena, no limits' memfd), the
    # root's copies in the page cache (clean: reclaimable), moto holding
    # an S3 root (~2x its bytes).
    root_bytes = n * (sc["ckpt_bytes"] + 64 * 1024)
    plan = {"ckpt_bench": nbytes + arena_for(nbytes, tensors) + 64 * MIB,
            "moto": (2 * root_bytes + 200 * MIB) if server else 0, "margin": GIB}
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    avail = meminfo("MemAvailable")
    detail["mem_available_gib_at_start"] = round(avail / GIB, 2) if avail is not None else None
    if avail is not None and avail < sum(plan.values()):
        notes.append("only %.1f GiB of memory available, the scenario wants ~%.1f GiB"
                     % (avail / GIB, sum(plan.values()) / GIB))

    # The checkpoint every copy is made from: one real save through this
    # ckptd, kept, then copied aside (quit removes it).
    tb, tt = sc["ckpt_bytes"], sc["ckpt_tensors"]
    progress("%s: the checkpoint to copy (%d MiB in %d tensors, saved through ckptd)" % (name, tb // MIB, tt))
    os.makedirs(tpl_root, exist_ok=True)
    tw = start_worker("template", ckpt_argv(daemon, tb, tt, 1, ["default:0"], max(64 * MIB, arena_for(tb, tt)),
                                            root=tpl_root) + ["--no-limits"], run_dir, env, notes)
    if tw is None:
        raise BenchError("the template's ckpt_bench did not start: %s" % notes[-1])
    try:
        if await_ready(tw, notes, "the template's ckpt_bench") is None:
            raise BenchError("the template's ckpt_bench did not start: %s" % notes[-1])
        saved = tw.cmd("save default keep")
        tpl = os.path.join(tpl_copy, saved["name"])
        shutil.rmtree(tpl_copy, ignore_errors=True)
        shutil.copytree(os.path.join(tpl_root, saved["name"]), tpl)
    finally:
        close_workers([tw], notes)
        shutil.rmtree(tpl_root, ignore_errors=True)
    tpl_files = {x: os.path.getsize(os.path.join(tpl, x)) for x in sorted(os.listdir(tpl))}
    detail["checkpoint"] = {"files": tpl_files, "saved": saved}
    ckpt_bytes = sum(tpl_files.values())

    progress("%s: starting ckpt_bench (%d MiB)%s" % (name, nbytes // MIB, ", the S3 root's maker" if server else ""))
    saver = start_worker("ckpt_bench", ckpt_argv(daemon, nbytes, tensors, 1, ["default:0"],
                                                 arena_for(nbytes, tensors)) + ["--no-limits"], run_dir, env, notes)
    objs = None
    if server:
        objs = start_worker("prune_root", [server.py, os.path.join(REPO, "bench", "baselines", "prune_root.py")],
                            run_dir, server.env(base=env), notes)
    workers = [w for w in (saver, objs) if w]
    mdir = os.path.join(run_dir, "prune-runs")
    # What a root holds before the prune, and what keep_last leaves.
    every = [c[0] for c in prune_root.copies(n)]
    newest = every[n - keep:]
    os.makedirs(mdir, exist_ok=True)
    warm = {}
    try:
        ready = await_ready(saver, notes, "ckpt_bench")
        if ready is None:
            raise BenchError("ckpt_bench did not start: %s" % notes[-1])
        detail["ckpt_bench"] = ready
        if server and await_ready(objs, notes, "the S3 root's maker (prune_root.py)") is None:
            raise BenchError("the S3 root's maker did not start: %s" % notes[-1])

        def local_root_ready():
            build_s = build_local_root(local_root, tpl, n)
            check_root(local_root, every, "before the prune")
            return build_s

        def prune_local():
            try:
                build_s = local_root_ready()
                res = PruneRun(local_root, keep, mdir).result(n, keep)
                check_root(local_root, newest, "after the prune")
            finally:
                shutil.rmtree(local_root, ignore_errors=True)
            res["build_s"] = build_s
            return res

        def prune_s3():
            try:
                made = objs.cmd("fill %s %s %d %d" % (PRUNE_S3_PREFIX, tpl, n, PRUNE_S3_THREADS))
                check_root(s3_root, every, "before the prune", ctl_env)
                c0 = server.cpu_s()
                res = PruneRun(s3_root, keep, mdir, ctl_env).result(n, keep)
                c1 = server.cpu_s()
                check_root(s3_root, newest, "after the prune", ctl_env)
            finally:
                # Whatever a failed run left goes too (a leftover would
                # fail the next one's count).
                try:
                    objs.cmd("clean %s" % PRUNE_S3_PREFIX)
                except BenchError as e:
                    notes.append("%s: cleaning %s: %s" % (name, s3_root, e))
            res["server_cpu_s"] = round(c1 - c0, 3) if c0 is not None and c1 is not None else None
            res["fill_s"], res["fill_objects"], res["fill_bytes"] = made["seconds"], made["objects"], made["bytes"]
            return res

        def save_alone():
            # The same as during, without the prune: the same root made,
            # synced and listed first.
            try:
                build_s = local_root_ready()
                res = saver.cmd("save default")
            finally:
                shutil.rmtree(local_root, ignore_errors=True)
            res["build_s"] = build_s
            return res

        def save_during():
            try:
                build_s = local_root_ready()
                run = PruneRun(local_root, keep, mdir)
                try:
                    how = None
                    while how is None:
                        if not run.running():
                            raise BenchError("the prune ended before it was seen removing (no trash directory, "
                                             "no checkpoint gone)")
                        how = prune_under_way(local_root, n)
                        if how is None:
                            time.sleep(PRUNE_POLL_S)
                    t_seen = time.monotonic_ns()
                    res = saver.cmd("save default")
                except BaseException:
                    run.kill()
                    raise
                pr = run.result(n, keep)
                check_root(local_root, newest, "after the prune")
            finally:
                shutil.rmtree(local_root, ignore_errors=True)
            t0, ts, tc = res.get("t_start_ns"), res.get("t_staged_ns"), res.get("t_committed_ns")
            res.update({"build_s": build_s, "prune_s": pr["seconds"], "prune_cpu_s": pr["cpu_s"],
                        "under_way": how, "seen_ms_after_prune_start": round((t_seen - pr["t_start_ns"]) / 1e6, 2),
                        "save_started_ms_after_prune_start": round((t0 - pr["t_start_ns"]) / 1e6, 2) if t0 else None,
                        "prune_ended_ms_after_committed": round((pr["t_end_ns"] - tc) / 1e6, 2) if tc else None,
                        "staged_overlap": overlap(t0, ts, pr["t_start_ns"], pr["t_end_ns"]),
                        "committed_overlap": overlap(t0, tc, pr["t_start_ns"], pr["t_end_ns"])})
            return res

        # Warm-ups before round 1: the saver's first save, and one full
        # prune of each kind (first_prune_*: the prunes get no untimed
        # run inside the rounds, see no_warmup below).
        progress("%s: warm-up (a save, a local prune of %d of %d%s)" % (name, n - keep, n,
                                                                         ", an S3 prune" if server else ""))
        warm["save"] = saver.cmd("save default")
        warm["prune_local"] = prune_local()
        if server:
            try:
                warm["prune_s3"] = prune_s3()
            except BenchError as e:
                failures.append("%s: the S3 prune's warm-up: %s" % (name, e))
                notes.append("prune_s3_s: null: its warm-up failed: %s" % e)
                server = None
        stall_before, _ = loop_stall(daemon, [])

        items = [("ckptd_prune_local", prune_local, None),
                 ("ckptd_alone", save_alone, saver), ("ckptd_during", save_during, saver)]
        if server:
            items.append(("ckptd_prune_s3", prune_s3, objs))
        # A prune passes over no large buffer of this process (the host's
        # taking back of idle memory, which the untimed run is for, does
        # not reach it) and each is a new ckptctl process; an untimed
        # run would only double the scenario's longest parts.  The saves
        # get theirs: the one during the prune comes with a whole prune.
        rounds = Rounds(name, items, daemon.data, [["ckptd_alone", "ckptd_during"]],
                        no_warmup=("ckptd_prune_local", "ckptd_prune_s3"))
        rounds.run(ROUNDS, failures, notes)
        rounds.note_settling(notes)
        stall, status = loop_stall(daemon, notes)
        detail["max_loop_stall_ms_after_warmup"] = stall_before
        detail["min_mem_available_gib"] = (round(rounds.min_mem_available / GIB, 2)
                                           if rounds.min_mem_available is not None else None)
    finally:
        close_workers(workers, notes)
        shutil.rmtree(local_root, ignore_errors=True)

    ser = rounds.series
    r = {"bytes": nbytes, "tensors": tensors, "ranks": 1, "rounds": len(rounds.rounds),
         "checkpoints": n, "keep": keep, "removed": n - keep, "checkpoint_bytes": ckpt_bytes,
         "checkpoint_files": len(tpl_files), "policy": "keep_last %d" % keep,
         "prune_local_s": median(ser("ckptd_prune_local", "seconds")),
         "prune_local_cpu_s": median(ser("ckptd_prune_local", "cpu_s")),
         "first_prune_local_s": warm.get("prune_local", {}).get("seconds"),
         "prune_s3_s": median(ser("ckptd_prune_s3", "seconds")) if server else None,
         "prune_s3_cpu_s": median(ser("ckptd_prune_s3", "cpu_s")) if server else None,
         "prune_s3_server_cpu_s": median(ser("ckptd_prune_s3", "server_cpu_s")) if server else None,
         "first_prune_s3_s": warm.get("prune_s3", {}).get("seconds") if server else None,
         "save_alone_staged_ms": median(ser("ckptd_alone", "staged_ms")),
         "save_during_prune_staged_ms": median(ser("ckptd_during", "staged_ms")),
         "save_alone_committed_ms": median(ser("ckptd_alone", "committed_ms")),
         "save_during_prune_committed_ms": median(ser("ckptd_during", "committed_ms")),
         "prune_during_save_s": median(ser("ckptd_during", "prune_s")),
         "staged_overlap": median(ser("ckptd_during", "staged_overlap")),
         "first_committed_ms": warm.get("save", {}).get("committed_ms"),
         "connect_ms": ready["clients"]["default"]["connect_ms"],
         "copy_threads": ready["clients"]["default"]["copy_threads"],
         "max_loop_stall_ms": stall,
         "max_loop_cpu_ms": find_key(status, "max_loop_cpu_ms") if status else None}
    alone_r, during_r = ser("ckptd_alone", "staged_ms"), ser("ckptd_during", "staged_ms")
    per = [ratio(d, a) for d, a in zip(during_r, alone_r)]
    per_c = [ratio(d, a) for d, a in zip(ser("ckptd_during", "committed_ms"), ser("ckptd_alone", "committed_ms"))]
    r["ratios"] = {"stall_during_prune": spread(per, ceiling=1.0)}

    notes.append("the roots: %d committed checkpoints, each a copy of one checkpoint saved through this ckptd "
                 "(%d tensors, %.1f MiB in %d files: %s), with the manifest's name, step (%d apart) and time (a "
                 "minute apart) rewritten; policy %s removes %d. A fresh root for every measurement, made "
                 "outside its timed part (locally copied and synced: median %s s; %s), and checked with "
                 "`ckptctl list --json` (the %d committed) before the prune and (the %d newest) after" % (
                     n, tt, ckpt_bytes / MIB, len(tpl_files), ", ".join(tpl_files), prune_root.STEP_GAP,
                     r["policy"], n - keep, fmt_s(median(ser("ckptd_prune_local", "build_s"))),
                     "on moto uploaded by boto3 with %d threads: median %s s" % (
                         PRUNE_S3_THREADS, fmt_s(median(ser("ckptd_prune_s3", "fill_s")))) if server
                     else "no S3 root: see prune_s3_s", n, keep))
    notes.append("prune_local_s, prune_s3_s: wall time of `ckptctl prune ROOT --keep-last %d --json` from its "
                 "start to its exit, one per round with no untimed run before it (one full prune of each kind "
                 "ran before round 1: first_prune_*_s); its CPU time (wait4) median %s s locally%s"
                 % (keep, fmt_s(r["prune_local_cpu_s"]),
                    ", %s s on S3, moto's %s s" % (fmt_s(r["prune_s3_cpu_s"]), fmt_s(r["prune_s3_server_cpu_s"]))
                    if server else ""))
    seen = [rd["figures"].get("ckptd_during", {}) for rd in rounds.rounds]
    seen = [f for f in seen if f]
    ov = [f.get("staged_overlap") for f in seen if f.get("staged_overlap") is not None]
    full = sum(1 for v in ov if v >= 1.0)
    notes.append("stall_during_prune = save_during_prune_staged_ms / save_alone_staged_ms per round (%d MiB in "
                 "%d tensors, save-2g's save, through this ckptd), alone and during next to each other in an "
                 "order that alternates. The save started a median %s ms after the prune (once the prune was "
                 "seen removing: %s), and its staging lay inside the prune in %d of %d rounds (staged_overlap "
                 "median %s); the prune ran %s s with the save inside it (staged %s ms, committed %s ms)"
                 % (nbytes // MIB, tensors, fmt_s(median([f.get("save_started_ms_after_prune_start") for f in seen])),
                    ", ".join(sorted(set(str(f.get("under_way")) for f in seen))) or "n/a", full, len(ov),
                    fmt_s(r["staged_overlap"]), fmt_s(r["prune_during_save_s"]),
                    fmt_s(r["save_during_prune_staged_ms"]), fmt_s(r["save_during_prune_committed_ms"])))
    if len(ov) > full:
        notes.append("stall_during_prune: the overlap was partial in %d of %d rounds (staged_overlap min %.2f): "
                     "the prune ended before the save was staged, so those rounds measured part of the staging "
                     "beside no prune" % (len(ov) - full, len(ov), min(ov)))
    fs, opts = mount_of(daemon.data)
    detail["data_mount"] = {"fs": fs, "options": opts}
    wall, cpu = r["prune_local_s"], r["prune_local_cpu_s"]
    if wall and cpu is not None:
        notes.append("bound (local prune): ckptctl used %s s of CPU in %s s: the rest it waited on the file "
                     "system (%s, mounted %s), where each removal renames the checkpoint to the trash, fsyncs "
                     "the root once per batch and the trash directory once per checkpoint, and unlinks its "
                     "files" % (fmt_s(cpu), fmt_s(wall), fs or "?", opts or "?"))
    c = spread(per_c)
    notes.append("committed_ms (not a target): alone %s, during the prune %s, ratio median %s [%s-%s]" % (
        fmt_s(r["save_alone_committed_ms"]), fmt_s(r["save_during_prune_committed_ms"]), fmt_s(c["median"]),
        fmt_s(c["min"]), fmt_s(c["max"])))
    if not server:
        notes.append("prune_s3_s: null: %s" % (s3_why or "the S3 prune did not run (see notes)"))
    detail["committed_during_vs_alone"] = c
    detail["warmup"] = warm
    detail["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                         "settle_ms": rd.get("settle_ms", {}), "ratios": {"stall_during_prune": p}}
                        for rd, p in zip(rounds.rounds, per)]
    detail["how"] = {
        "prune": "ckptctl prune ROOT --keep-last %d --json; exit 0, summary.checkpoints %d, removed %d, failed "
                 "and in_use 0 required" % (keep, n, n - keep),
        "during": "the prune started, the root looked at every %g ms until a trash directory (%s*) appears or "
                  "a checkpoint is gone, then `save default` (ckpt_bench); staged_overlap: the share of the "
                  "save's start-to-staged the prune was running" % (PRUNE_POLL_S * 1e3, TRASH_PREFIX),
        "s3_root": s3_root}
    r["notes"] = notes
    r["detail"] = detail
    return {name: r}


# ---- the Python package (issue 31): py-save-2g, py-load-2g, train-overhead --

# These three scenarios follow protocol v3 (BENCH.md, 2026-11-29) where the
# harness above is still v2: at least V3_ROUNDS rounds, `sync` before every
# timed save and load (and drop_caches where this process may write it),
# every ratio per round with min/max, targets judged by judge_v3(): a peer
# ratio raw against its raw target, "not judgeable here" where the
# machine's ceiling is below the target, a ratio above its ceiling counted
# as a broken limit, and a bootstrap 90 % interval for a target whose
# per-round values straddle it.  Their Python side runs in the bench
# environment's python with this tree's package (PYTHONPATH=python) on
# this build's libckpt (CKPTD_LIBCKPT), against the scenario's private
# ckptd.
V3_ROUNDS = 7
# v3: a run refuses to record itself when other processes used more than
# this share of the CPUs during it.
OTHER_CPU_LIMIT = 0.10
PY_KINDS = ("pysave", "pyload", "train")
# (scenario, key, op, bound, kind): "value" judges the median of the
# scenario's per-round key; "ratio" the median of a per-round ratio;
# "peer" the same, with the ratio's ceiling judged as v3 says (beyond it: a
# broken limit; below the target: not judgeable); "floor" a "<=" ratio
# whose floor is a model, not a measured limit (train-overhead: a saver
# that costs nothing, or only its copy): not judgeable where the floor is
# above the target, and no verdict of a broken limit (the run without
# saves has noise of its own).
V3_TARGETS = [
    ("py-save-2g", "call_ms", "<=", 2.0, "value"),
    ("py-save-2g", "py_vs_c_staged", "<=", 1.1, "ratio"),
    ("py-save-2g", "staged_speedup_vs_dcp", ">=", 1.5, "peer"),
    ("py-save-2g", "durable_speedup_vs_dcp", ">=", 3.0, "peer"),
    ("py-load-2g", "load_speedup_vs_dcp", ">=", 2.0, "peer"),
    ("train-overhead", "slowdown_ckptd", "<=", 1.10, "floor"),
    ("train-overhead", "slowdown_vs_dcp", "<=", 0.8, "floor"),
]
report.RATIOS += ["py_vs_c_staged", "py_vs_c_call", "py_vs_c_load", "slowdown_ckptd", "slowdown_dcp",
                  "slowdown_vs_dcp", "overhead_vs_dcp"]
_at = next(i for i, row in enumerate(report.ROWS) if row[0] == "max_loop_stall_ms")
report.ROWS[_at:_at] = [
    ("C client call/staged/committed_ms", lambda s: "%s / %s / %s" % (
        report.fmt(s.get("c_call_ms"), 3), report.fmt(s.get("c_staged_ms"), 1), report.fmt(s.get("c_committed_ms"), 1))
     if "c_staged_ms" in s else "-"),
    ("DCP config (call / staged / committed)", lambda s: "%s / %s / %s" % (
        s.get("dcp_config_call"), s.get("dcp_config_staged"), s.get("dcp_config_committed"))
     if "dcp_config_staged" in s else "-"),
    ("py load_ms (ckptd.torch.load)", report._val("py_load_ms", 1)),
    ("C load_ms (ckpt_bench, through ckptd)", report._val("c_load_ms", 1)),
    ("binding: call ms, 1 / 256 / 10k tensors", lambda s: "%s / %s / %s" % tuple(
        report.fmt(s["binding"]["sizes"][k]["call_ms"], 3) for k in ("1", "256", "10000"))
     if s.get("binding") else "-"),
    ("binding: us per tensor (call / py / ctypes)", lambda s: "%s / %s / %s" % (
        report.fmt(s["binding"]["per_tensor_us"], 2), report.fmt(s["binding"]["per_tensor_prepare_us"], 2),
        report.fmt(s["binding"]["per_tensor_add_us"], 2)) if s.get("binding") else "-"),
    ("binding: bare ctypes call ns", lambda s: report.fmt(s["binding"]["ctypes_call_ns"], 0)
     if s.get("binding") else "-"),
    ("train: state MiB, batch, step ms / staged ms", lambda s: "%.0f, %d, %s / %s" % (
        s["state_bytes"] / MIB, s["batch"], report.fmt(s.get("step_ms_calibrated"), 1),
        report.fmt(s.get("staged_ms_calibrated"), 1)) if "batch" in s else "-"),
    ("train: steps, save every", lambda s: "%d, %d" % (s["steps"], s["every"]) if "every" in s else "-"),
    ("train: loop s none / ckptd / dcp", lambda s: "%s / %s / %s" % (
        report.fmt(s.get("none_s"), 2), report.fmt(s.get("ckptd_s"), 2), report.fmt(s.get("dcp_s"), 2))
     if "none_s" in s else "-"),
    ("other processes' CPU share (v3: <= 0.10)", lambda s: report.fmt(s.get("other_cpu_share"), 3)
     if "other_cpu_share" in s else "-"),
]


def py_rounds(sc=None):
    """Rounds for a v3 scenario: its own "rounds" (more than V3_ROUNDS where
    its ratios are noisy), else V3_ROUNDS; QUICK: 2; BENCH_ROUNDS when it
    was set."""
    if os.environ.get("BENCH_ROUNDS"):
        return ROUNDS
    if QUICK:
        return 2
    return max(ROUNDS, V3_ROUNDS, (sc or {}).get("rounds", 0))


def py_env(ranks=1):
    """A worker environment for the package: worker_env's, plus this tree's
    package and this build's libckpt."""
    env = worker_env(ranks)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + (os.pathsep + env["PYTHONPATH"]
                                                        if env.get("PYTHONPATH") else "")
    env["CKPTD_LIBCKPT"] = os.path.join(BUILD, "libckpt.so")
    for k in ("CKPTD_SOCKET", "CKPTD_JOB", "CKPTD_ARENA", "CKPTD_RESIDENT"):
        env.pop(k, None)
    return env


class Caches:
    """v3: `sync` and drop caches before every timed save and load.  drop
    caches needs a writable /proc/sys/vm/drop_caches (root outside a
    container); where it is not, each load drops its own checkpoint's
    files (posix_fadvise DONTNEED) and that is recorded."""

    def __init__(self):
        self.syncs = 0
        self.drops = 0
        self.why_not = None

    def settle(self):
        os.sync()
        self.syncs += 1
        if self.why_not is None:
            try:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
                self.drops += 1
            except OSError as e:
                self.why_not = "/proc/sys/vm/drop_caches: %s" % (e.strerror or e)

    def wrap(self, fn):
        def run():
            self.settle()
            return fn()
        return run

    def record(self):
        return {"sync_before_every_save_and_load": self.syncs,
                "drop_caches": self.drops if self.why_not is None else 0,
                "drop_caches_not_done": self.why_not}


class CpuWatch:
    """What other processes took of the machine's CPUs between start() and
    stop(): the machine's busy time (/proc/stat: user, nice, system, irq,
    softirq; not steal, which is the hypervisor's) less this process's and
    its reaped children's (os.times(): the daemon, the workers and what
    they reaped, fio), over the wall time x the online CPUs.  Read at
    stop(), after every child of the measurement was reaped."""

    def __init__(self):
        self.t0 = None

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                parts = f.readline().split()
            v = [int(x) for x in parts[1:]]
            return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _ours():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self):
        self.t0 = (time.monotonic(), self._busy(), self._ours())
        return self

    def stop(self):
        w0, b0, o0 = self.t0
        wall, b1, o1 = time.monotonic() - w0, self._busy(), self._ours()
        if b0 is None or b1 is None or wall <= 0:
            return None
        cpus_online = os.cpu_count() or 1
        others = max(0.0, (b1 - b0) - (o1 - o0))
        return {"share": round(others / (wall * cpus_online), 4), "others_cpu_s": round(others, 2),
                "ours_cpu_s": round(o1 - o0, 2), "busy_cpu_s": round(b1 - b0, 2), "wall_s": round(wall, 1),
                "cpus_online": cpus_online}


def bootstrap_median(vals, reps=2000, seed=31):
    """A 90 % bootstrap interval of the median of vals (the rounds resampled
    with replacement; a fixed seed: the interval is a function of the
    figures alone)."""
    import random

    rnd = random.Random(seed)
    n = len(vals)
    meds = sorted(median([vals[rnd.randrange(n)] for _ in range(n)]) for _ in range(reps))
    return meds[int(0.05 * reps)], meds[int(0.95 * reps) - 1]


def judge_v3(scenarios):
    """The v3 targets of the scenarios in this run (see V3_TARGETS)."""
    out = []
    for name, key, op, bound, kind in V3_TARGETS:
        if name not in scenarios:
            continue
        s = scenarios[name]
        t = {"scenario": name, "key": key, "target": "%s %s %g" % (key, op, bound), "value": None,
             "ceiling": None, "rule": "median %s %g (v3)" % (op, bound), "met": None}
        if kind == "value":
            per = [v for v in (s.get("per_round") or {}).get(key, []) if v is not None]
            t["value"] = s.get(key)
        else:
            rat = (s.get("ratios") or {}).get(key) or {}
            per = [v for v in rat.get("per_round", []) if v is not None]
            t["value"] = rat.get("median")
            t["ceiling"] = rat.get("ceiling")
        v, c = t["value"], t["ceiling"]
        if v is None:
            notes = s.get("notes", [])
            t["why_null"] = "; ".join([n for n in notes if key in n] or notes[:1]) or "not measured"
            out.append(t)
            continue
        if kind in ("peer", "floor") and c is not None:
            # For ">=" the ceiling is the most a perfect implementation
            # gets; for "<=" (a slowdown) the least: its floor.  Beyond it
            # is judged per round (each value over its own round's
            # ceiling, median): a median of values against a median of
            # ceilings from other rounds contradicts the limit ratio.
            word = "ceiling" if op == ">=" else "floor"
            rel = rat.get("of_ceiling") if kind == "peer" else None
            if rel is not None and ((op == ">=" and rel > 1.0) or (op == "<=" and rel < 1.0)):
                t["rule"] = ("per round %.3f of its %s (median; %s %.2f): beyond it, a broken limit (v3), not met"
                             % (rel, word, word, c))
                t["met"] = False
                out.append(t)
                continue
            if not _cmp(c, op, bound):
                t["rule"] = "not judgeable here (%s %.3f %s %g): %s (v3)" % (
                    word, c, "<" if op == ">=" else ">", bound,
                    "the limit ratio covers it" if kind == "peer" else
                    "a saver of that floor would not meet it on this machine")
                t["why_null"] = t["rule"]
                out.append(t)
                continue
        met = _cmp(v, op, bound)
        if per and min(per) < bound < max(per) and len(per) >= 2:
            lo, hi = bootstrap_median(per)
            t["interval90"] = [round(lo, 4), round(hi, 4)]
            clears = _cmp(lo, op, bound) and _cmp(hi, op, bound)
            t["rule"] += "; rounds straddle it: bootstrap 90%% interval [%.3f, %.3f] %s" % (
                lo, hi, "clears it" if clears else "does not clear it")
            met = met and clears
        t["met"] = met
        out.append(t)
    return out


def _cmp(v, op, bound):
    return v <= bound if op == "<=" else v >= bound


def spread_v3(per_round, ceilings=None, ceiling=None):
    """spread(), with the per-round values kept (judge_v3 bootstraps them)
    and, with per-round ceilings, those and each round's value over its
    own ceiling ("of_ceiling": where the peer's time cancels, the limit
    ratio of that round)."""
    r = spread(per_round, ceilings=[c for c in (ceilings or []) if c is not None] if ceilings is not None else None,
               ceiling=ceiling)
    r["per_round"] = [round(v, 4) if v is not None else None for v in per_round]
    if ceilings is not None:
        r["ceiling_per_round"] = [round(c, 4) if c is not None else None for c in ceilings]
        r["of_ceiling"] = median([ratio(v, c) for v, c in zip(per_round, ceilings)])
    return r


def limit_note(key, per, notes):
    """v3: a ratio above 1.0 against a limit means the limit is not the
    limit."""
    vals = [v for v in per if v is not None]
    m = median(vals)
    if m is not None and m > 1.0:
        notes.append("%s: median %.2f is above 1.0: the limit is not the limit on this machine; suspect the "
                     "limit first (BENCH.md)" % (key, m))
    elif any(v > 1.0 for v in vals):
        notes.append("%s: above 1.0 in %d of %d rounds (max %.2f), median below: noise between the measurements "
                     "of a round, or a limit that is sometimes weak (detail.rounds)"
                     % (key, sum(1 for v in vals if v > 1.0), len(vals), max(vals)))


def py_and_c_workers(name, mode, daemon, sc, py, run_dir, nbytes, tensors, arena, notes, want_dcp):
    """The Python worker (bench/baselines/pyckptd.py in `mode`, with DCP when
    want_dcp) and ckpt_bench, one client of `arena` bytes each, started side
    by side.  Returns (the Python worker, ckpt_bench, the list of those that
    started)."""
    progress("%s: starting the Python worker (ckptd.torch%s) and ckpt_bench" % (name, ", DCP" if want_dcp else ""))
    pyw = py_worker("pyckptd", mode, daemon, sc, py, run_dir, arena, notes, not want_dcp)
    ckpt = start_worker("ckpt_bench", ckpt_argv(daemon, nbytes, tensors, 1, ["default:0"], arena), run_dir,
                        worker_env(1), notes)
    return pyw, ckpt, [w for w in (pyw, ckpt) if w]


def await_py_and_c(pyw, ckpt, arena, small_arena_costs, want_dcp, notes):
    """The ready messages of py_and_c_workers' two workers (BenchError if
    either did not start).  Notes why DCP cannot run, and a client whose
    arena is smaller than asked with what that costs."""
    pready = await_ready(pyw, notes, "the Python worker")
    if pready is None:
        raise BenchError("the Python worker did not start: %s" % notes[-1])
    ready = await_ready(ckpt, notes, "ckpt_bench")
    if ready is None:
        raise BenchError("ckpt_bench did not start: %s" % notes[-1])
    if want_dcp and pready.get("no_dcp"):
        notes.append("DCP: %s" % pready["no_dcp"])
    for who, got in (("the Python client", pready.get("arena_bytes")),
                     ("the C client", ready["clients"]["default"].get("arena_bytes"))):
        if got is None or got < arena:
            notes.append("%s's arena is %s bytes, %d asked for: %s" % (who, got, arena, small_arena_costs))
    return pready, ready


def py_worker(name, mode, daemon, sc, py, run_dir, arena, notes, no_dcp):
    argv = [py, os.path.join(REPO, "bench", "baselines", "pyckptd.py"), "--mode", mode, "--dir", daemon.data,
            "--socket", daemon.socket, "--bytes", str(sc["bytes"]), "--tensors", str(sc["tensors"]),
            "--arena", str(arena), "--timeout", str(CMD_TIMEOUT)] + (["--no-dcp"] if no_dcp else [])
    return start_worker(name, argv, run_dir, py_env(), notes)


def dcp_best(rounds, items, key):
    """Of DCP's configurations, the one with the best (least) median `key`:
    (its item, its per-round series, {config: median})."""
    best, _, per, meds = best_of(rounds, items, key, higher=False)
    return best, per, meds


def pysave_scenario(name, sc, daemon, py, run_dir, failures):
    """py-save-2g: ckptd.torch.async_save of a dict of torch CPU tensors
    against DCP async_save of the same tensors (every configuration in
    every round) and the C client (ckpt_bench) on the same shapes, with
    the copy and disk limits beside them, in rounds."""
    nbytes, tensors = sc["bytes"], sc["tensors"]
    gib = nbytes / GIB
    notes, detail = [], {}
    caches = Caches()
    uring_depth = find_key(daemon.status(), "uring_depth")
    if not isinstance(uring_depth, int) or uring_depth < 1:
        raise BenchError("cannot read the daemon's uring_depth from its status")
    arena = arena_for(nbytes, tensors)
    # Memory: the Python worker holds the state, its arena, DCP's two
    # cached shared-memory stagers (async and sync staging: one copy each)
    # and torch; DCP's checkpoint process (its own torch); ckpt_bench the
    # state, the limits' memfd and its arena; fio its buffers.
    plan = {"python": nbytes + arena + 400 * MIB, "dcp_async": nbytes + 400 * MIB, "dcp_sync": nbytes,
            "ckpt_bench": 2 * nbytes + arena + 64 * MIB, "fio": 2 * uring_depth * 8 * MIB, "margin": GIB}
    avail = meminfo("MemAvailable")
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    detail["mem_available_gib_at_start"] = round(avail / GIB, 2) if avail is not None else None
    want_dcp = not SKIP_DCP
    dcp_modes = ("async", "sync")
    if avail is not None and want_dcp:
        base = plan["python"] + plan["ckpt_bench"] + plan["fio"] + plan["margin"]
        if avail < base + plan["dcp_async"] + plan["dcp_sync"]:
            dcp_modes = ("async",)
            notes.append("DCP's sync-staging configurations left out: %.1f GiB of memory available, they want "
                         "~%.1f GiB more" % (avail / GIB, plan["dcp_sync"] / GIB))
        if avail < base + plan["dcp_async"]:
            want_dcp = False
            notes.append("DCP left out: %.1f GiB of memory available, the scenario with DCP wants ~%.1f GiB"
                         % (avail / GIB, (base + plan["dcp_async"]) / GIB))
    pyw, ckpt, workers = py_and_c_workers(name, "save", daemon, sc, py, run_dir, nbytes, tensors, arena,
                                          notes, want_dcp)
    warm = {}
    try:
        pready, ready = await_py_and_c(pyw, ckpt, arena, "its staging may wait for the disk", want_dcp,
                                       notes)
        configs = [c for c in pready.get("dcp_configs", []) if c.split("-")[0] in dcp_modes] if want_dcp else []
        detail.update({"python_worker": pready, "ckpt_bench": ready, "uring_depth": uring_depth,
                       "arena_bytes": arena})
        progress("%s: warm-up saves" % name)
        warm["ckptd_py"] = pyw.cmd("ckptd")
        warm["ckptd_c"] = ckpt.cmd("save default")
        for method in ("memcpy", "stream"):
            ckpt.cmd("copy %s default" % method)
        for c in list(configs):
            try:
                warm["dcp_" + c] = pyw.cmd("dcp %s" % c)
            except BenchError as e:
                notes.append("DCP %s warm-up: %s" % (c, e))
                configs.remove(c)
        warm["overhead"] = pyw.cmd("overhead")
        stall_before, _ = loop_stall(daemon, [])

        w = caches.wrap
        items = [("ckptd_py", w(lambda: pyw.cmd("ckptd")), pyw),
                 ("ckptd_c", w(lambda: ckpt.cmd("save default")), ckpt)]
        blocks = [["ckptd_py", "ckptd_c"]]
        for method in ("memcpy", "stream"):
            items.append(("copy_" + method, (lambda m=method: ckpt.cmd("copy %s default" % m)), ckpt))
            blocks[0].append("copy_" + method)
        # v3: the limits run beside what they judge, in the same block.
        items.append(("disk_builtin", w(lambda: ckpt.cmd("write %s %d" % (daemon.data, uring_depth))), ckpt))
        blocks[0].append("disk_builtin")
        for mult in (1, 2):
            items.append(("disk_fio_d%d" % (uring_depth * mult),
                          w(lambda d=uring_depth * mult: fio_write(daemon.data, nbytes, 1, d)), None))
            blocks[0].append("disk_fio_d%d" % (uring_depth * mult))
        for c in configs:
            items.append(("dcp_" + c, w(lambda c=c: pyw.cmd("dcp %s" % c)), pyw))
        items.append(("overhead", lambda: pyw.cmd("overhead"), pyw))
        rounds = Rounds(name, items, daemon.data, blocks, no_warmup=["overhead"], flip_blocks=True)
        rounds.run(py_rounds(sc), failures, notes)
        rounds.note_settling(notes)
        stall, status = loop_stall(daemon, notes)
        detail["max_loop_stall_ms_after_warmup"] = stall_before
        detail["max_loop_cpu_ms"] = find_key(status, "max_loop_cpu_ms") if status else None
        detail["min_mem_available_gib"] = (round(rounds.min_mem_available / GIB, 2)
                                           if rounds.min_mem_available is not None else None)
    finally:
        close_workers(workers, notes)

    r = {"bytes": nbytes, "tensors": tensors, "ranks": 1, "rounds": len(rounds.rounds)}
    per_round = {}
    for k in ("call_ms", "staged_ms", "committed_ms"):
        per_round[k] = rounds.series("ckptd_py", k)
        r[k] = median(per_round[k])
        r["first_" + k] = warm.get("ckptd_py", {}).get(k)
        r["c_" + k] = median(rounds.series("ckptd_c", k))
    r["per_round"] = per_round
    # What users feel besides time (v3): the memory each keeps for staging.
    r["staging_bytes"] = pready.get("arena_bytes")
    r["dcp_staging_bytes"] = nbytes if configs else None
    r["connect_ms"] = pready.get("connect_ms")
    r["c_connect_ms"] = ready["clients"]["default"]["connect_ms"]
    r["copy_threads"] = ready["clients"]["default"]["copy_threads"]
    copy_best, r["copy_limit_gibps"], copy_r, copy_meds = best_of(rounds, ["copy_memcpy", "copy_stream"], "gibps")
    disk_items = ["disk_builtin", "disk_fio_d%d" % uring_depth, "disk_fio_d%d" % (2 * uring_depth)]
    disk_best, r["disk_limit_gibps"], disk_r, disk_meds = best_of(rounds, disk_items, "gibps")
    dcp_items = ["dcp_" + c for c in configs]
    dcp = {}
    dcp_meds = {}
    for k in ("call_ms", "staged_ms", "committed_ms"):
        best, per, meds = dcp_best(rounds, dcp_items, k)
        dcp[k] = per
        dcp_meds[k] = meds
        r["dcp_async_" + k] = median(per) if best else None
        r["dcp_config_" + k.split("_")[0]] = best[len("dcp_"):] if best else None
        r["first_dcp_async_" + k] = warm.get(best, {}).get(k) if best else None
    r["max_loop_stall_ms"] = stall
    r["max_loop_cpu_ms"] = detail.get("max_loop_cpu_ms")

    keys = ("py_vs_c_staged", "py_vs_c_call", "staged_speedup_vs_dcp", "durable_speedup_vs_dcp",
            "blocking_speedup_vs_dcp", "staging_vs_copy_limit", "commit_vs_disk_limit")
    per = {k: [] for k in keys}
    ceil = {"staged_speedup_vs_dcp": [], "durable_speedup_vs_dcp": []}
    round_ratios = []
    for i, rd in enumerate(rounds.rounds):
        f = rd["figures"].get("ckptd_py", {})
        c = rd["figures"].get("ckptd_c", {})
        staged_s = f["staged_ms"] / 1e3 if f.get("staged_ms") else None
        comm_s = f["committed_ms"] / 1e3 if f.get("committed_ms") else None
        x = {"py_vs_c_staged": ratio(f.get("staged_ms"), c.get("staged_ms")),
             "py_vs_c_call": ratio(f.get("call_ms"), c.get("call_ms")),
             "staged_speedup_vs_dcp": ratio(dcp["staged_ms"][i], f.get("staged_ms")),
             "durable_speedup_vs_dcp": ratio(dcp["committed_ms"][i], f.get("committed_ms")),
             "blocking_speedup_vs_dcp": ratio(dcp["call_ms"][i], f.get("call_ms")),
             "staging_vs_copy_limit": ratio(ratio(gib, staged_s), copy_r[i]),
             "commit_vs_disk_limit": ratio(ratio(gib, comm_s), disk_r[i])}
        cl = {"staged_speedup_vs_dcp": ratio(dcp["staged_ms"][i] / 1e3 if dcp["staged_ms"][i] else None,
                                             ratio(gib, copy_r[i])),
              "durable_speedup_vs_dcp": ratio(dcp["committed_ms"][i] / 1e3 if dcp["committed_ms"][i] else None,
                                              ratio(gib, disk_r[i]))}
        for k, v in x.items():
            per[k].append(v)
        for k, v in cl.items():
            ceil[k].append(v)
        round_ratios.append({"ratios": x, "ceilings": cl})
    ratios = {}
    for k in keys:
        if k in ceil:
            ratios[k] = spread_v3(per[k], ceilings=ceil[k])
        elif k in ("staging_vs_copy_limit", "commit_vs_disk_limit"):
            ratios[k] = spread_v3(per[k], ceiling=1.0)
            limit_note(k, per[k], notes)
        else:
            ratios[k] = spread_v3(per[k])
    r["ratios"] = ratios
    for k in ("staged_speedup_vs_dcp", "durable_speedup_vs_dcp"):
        v = ratios[k]
        if v["median"] is not None and v["ceiling"] is not None and v["ceiling"] < dict(
                (t[1], t[3]) for t in V3_TARGETS if t[0] == "py-save-2g")[k]:
            notes.append("%s: the machine's ceiling %.2f is below the target: not judgeable here; %s (median "
                         "%.2f) covers it (v3)" % (k, v["ceiling"], "staging_vs_copy_limit"
                                                   if k.startswith("staged") else "commit_vs_disk_limit",
                                                   ratios["staging_vs_copy_limit" if k.startswith("staged")
                                                          else "commit_vs_disk_limit"]["median"] or 0))
    # The binding's cost: medians over the rounds of each figure.
    ov = [rd["figures"].get("overhead") for rd in rounds.rounds if rd["figures"].get("overhead")]
    if ov:
        b = {"sizes": {}}
        for n in ov[0]["sizes"]:
            b["sizes"][n] = {k: median([o["sizes"][n][k] for o in ov]) for k in ov[0]["sizes"][n]
                             if isinstance(ov[0]["sizes"][n][k], (int, float))}
        for k in ("ctypes_call_ns", "per_tensor_us", "per_tensor_prepare_us", "per_tensor_add_us", "per_call_ms"):
            b[k] = median([o[k] for o in ov])
        b["what"] = ("medians over the rounds (each round: every count saved several times, each call timed once "
                     "the last save's thread is idle). call_ms: async_save's call of n tensors of 16 fp32; "
                     "prepare_ms: ckptd.torch's flattening and torch introspection alone (Python); add_ms: handing "
                     "the n prepared tensors to libckpt through ctypes (their array of structs packed, the last "
                     "save's not reused, and one ckpt_save_add_tensors call, in a save begun and freed; "
                     "call_ms saves the same tensors each time and so reuses it); per_tensor_*: (n=10000 - n=1) / "
                     "9999; ctypes_call_ns: one bare ctypes call (ckpt_dtype_size). The C client's own call for "
                     "the 256 tensors of this scenario: c_call_ms")
        r["binding"] = b
    if r["dcp_async_committed_ms"] is None:
        notes.append("dcp_async_*: %s" % ("skipped (BENCH_SKIP_DCP)" if SKIP_DCP else
                                          "DCP did not run (see notes)" if not configs
                                          else "no DCP measurement succeeded"))
    notes.append("ckptd.torch.async_save in the bench environment's python (torch %s, this tree's package, "
                 "libckpt %s), timed in its own thread: call until it returns, staged until "
                 "staging_completion.result() returns, committed until upload_completion.result() returns; "
                 "the C client (ckpt_bench 'save default', the same shapes, its own copy of the state) in the "
                 "same rounds, next to it: py_vs_c_staged = the Python save's staged_ms / the C client's, per "
                 "round. Both clients: arena %d MiB, the library's default copy threads"
                 % (pready.get("torch"), pready.get("libckpt"), arena // MIB))
    notes.append("DCP: every configuration in every round (%s: async or sync staging into a cached "
                 "shared-memory DefaultStager, process executor, FileSystemWriter thread_count 1/2/4, "
                 "sync_files=True), in the Python worker's process on the same tensors; each figure is the "
                 "configuration with the best median of that figure (dcp_config_*)"
                 % ", ".join(configs or ["none"]))
    d = dict(detail)
    d["caches"] = caches.record()
    d["copy_limit"] = {"method": copy_best, "medians_gibps": copy_meds,
                       "what": "ckpt_bench: the C client's copy threads copying its state into a pre-faulted "
                               "memfd, memcpy and streaming stores, the better median"}
    d["disk_limit"] = {"method": disk_best, "medians_gibps": disk_meds, "uring_depth": uring_depth,
                       "what": "the built-in writer and fio at the daemon's depth and twice it, as in save-2g"}
    d["dcp"] = {"configs": configs, "medians_by_config": dcp_meds,
                "settings": pready.get("dcp_settings"),
                "stat": "per figure, the configuration with the best median of it"}
    d["warmup"] = warm
    d["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                    "settle_ms": rd.get("settle_ms", {}), "ratios": rr["ratios"], "ceilings": rr["ceilings"]}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return {name: r}


def pyload_scenario(name, sc, daemon, py, run_dir, failures):
    """py-load-2g: ckptd.torch.load of its own checkpoint of the state
    (through the daemon) against DCP load of DCP's checkpoints of it (1 and
    4 files), the read limit of the Python checkpoint's shard file (fio)
    and of ckpt_bench's own checkpoint of the same shapes (its reader), and
    ckpt_bench's load through the daemon, in rounds."""
    nbytes, tensors = sc["bytes"], sc["tensors"]
    gib = nbytes / GIB
    notes, detail = [], {}
    caches = Caches()
    uring_depth = find_key(daemon.status(), "uring_depth")
    if not isinstance(uring_depth, int) or uring_depth < 1:
        raise BenchError("cannot read the daemon's uring_depth from its status")
    depths = (uring_depth, 2 * uring_depth)
    plan = {"python": nbytes + LOAD_ARENA + 400 * MIB, "ckpt_bench": 2 * nbytes + LOAD_ARENA + 64 * MIB,
            "fio": 2 * uring_depth * 8 * MIB, "margin": GIB}
    avail = meminfo("MemAvailable")
    detail["memory_plan_gib"] = {k: round(v / GIB, 2) for k, v in plan.items()}
    detail["mem_available_gib_at_start"] = round(avail / GIB, 2) if avail is not None else None
    if avail is not None and avail < sum(plan.values()):
        notes.append("only %.1f GiB of memory available, the scenario wants ~%.1f GiB"
                     % (avail / GIB, sum(plan.values()) / GIB))
    want_dcp = not SKIP_DCP
    pyw, ckpt, workers = py_and_c_workers(name, "load", daemon, sc, py, run_dir, nbytes, tensors, LOAD_ARENA,
                                          notes, want_dcp)
    warm = {}
    try:
        pready, ready = await_py_and_c(pyw, ckpt, LOAD_ARENA, "reads through ckptd are capped at half of it",
                                       want_dcp, notes)
        have_dcp = want_dcp and not pready.get("no_dcp")
        detail.update({"python_worker": pready, "ckpt_bench": ready, "uring_depth": uring_depth})
        progress("%s: saving the checkpoints to load" % name)
        made = {"ckptd_py": pyw.cmd("keep_ckptd"), "ckptd_c": ckpt.cmd("save default keep")}
        files = made["ckptd_py"]["files"]
        if have_dcp:
            for t in DCP_LOAD_THREADS:
                try:
                    made["dcp_t%d" % t] = pyw.cmd("keep_dcp %d" % t)
                except BenchError as e:
                    notes.append("DCP: its checkpoint with thread_count %d could not be saved: %s" % (t, e))
                    have_dcp = False
                    break
        detail["checkpoints"] = made
        progress("%s: warm-up loads" % name)
        warm["ckptd_py"] = pyw.cmd("load_ckptd")
        warm["ckptd_c"] = daemon_load(ckpt, "load via default", daemon)
        if have_dcp:
            for t in DCP_LOAD_THREADS:
                warm["dcp_t%d" % t] = pyw.cmd("load_dcp %d" % t)
        w = caches.wrap
        items = [("ckptd_py", w(lambda: pyw.cmd("load_ckptd")), pyw),
                 ("ckptd_c", w(lambda: daemon_load(ckpt, "load via default", daemon)), ckpt)]
        blocks = [["ckptd_py", "ckptd_c"]]
        for d in depths:
            items.append(("read_builtin_d%d" % d, w(lambda d=d: ckpt.cmd("read %d" % d)), ckpt))
            items.append(("read_fio_d%d" % d, w(lambda d=d: fio_read(files, d)), None))
            blocks[0] += ["read_builtin_d%d" % d, "read_fio_d%d" % d]
        if have_dcp:
            for t in DCP_LOAD_THREADS:
                items.append(("dcp_t%d" % t, w(lambda t=t: pyw.cmd("load_dcp %d" % t)), pyw))
        rounds = Rounds(name, items, daemon.data, blocks, flip_blocks=True)
        rounds.run(py_rounds(sc), failures, notes)
        rounds.note_settling(notes)
        stall, status = loop_stall(daemon, notes)
        detail["max_loop_cpu_ms"] = find_key(status, "max_loop_cpu_ms") if status else None
    finally:
        for w in workers:
            w.pause(False)
        close_workers(workers, notes)

    r = {"bytes": nbytes, "tensors": tensors, "ranks": 1, "rounds": len(rounds.rounds)}
    py_r = rounds.series("ckptd_py", "seconds")
    c_r = rounds.series("ckptd_c", "ms")
    r["py_load_ms"] = median([v * 1e3 for v in py_r if v is not None])
    r["first_py_load_ms"] = warm["ckptd_py"]["ms"]
    r["py_load_gibps"] = ratio(gib, r["py_load_ms"] / 1e3 if r["py_load_ms"] else None)
    r["c_load_ms"] = median(c_r)
    r["connect_ms"] = pready.get("connect_ms")
    last = next((rd["figures"]["ckptd_py"] for rd in reversed(rounds.rounds) if "ckptd_py" in rd["figures"]), {})
    r["py_load_stats"] = last.get("stats")
    read_items = ["read_builtin_d%d" % d for d in depths] + ["read_fio_d%d" % d for d in depths]
    read_best, r["read_limit_gibps"], read_r, read_meds = best_of(rounds, read_items, "gibps")
    dcp_items = ["dcp_t%d" % t for t in DCP_LOAD_THREADS] if have_dcp else []
    dcp_b, r["dcp_load_s"], dcp_r, dcp_meds = best_of(rounds, dcp_items, "seconds", higher=False)
    r["dcp_load_thread_count"] = int(dcp_b[len("dcp_t"):]) if dcp_b else None
    r["first_dcp_load_s"] = warm.get(dcp_b, {}).get("seconds") if dcp_b else None
    r["max_loop_stall_ms"] = stall
    r["max_loop_cpu_ms"] = detail.get("max_loop_cpu_ms")
    per = {"load_speedup_vs_dcp": [], "load_vs_read_limit": [], "py_vs_c_load": []}
    ceil = []
    round_ratios = []
    for i in range(len(rounds.rounds)):
        x = {"load_speedup_vs_dcp": ratio(dcp_r[i], py_r[i]),
             "load_vs_read_limit": ratio(ratio(gib, py_r[i]), read_r[i]),
             "py_vs_c_load": ratio(py_r[i] * 1e3 if py_r[i] else None, c_r[i])}
        c = ratio(dcp_r[i], ratio(gib, read_r[i]))
        for k, v in x.items():
            per[k].append(v)
        ceil.append(c)
        round_ratios.append({"ratios": x, "ceilings": {"load_speedup_vs_dcp": c}})
    r["ratios"] = {"load_speedup_vs_dcp": spread_v3(per["load_speedup_vs_dcp"], ceilings=ceil),
                   "load_vs_read_limit": spread_v3(per["load_vs_read_limit"], ceiling=1.0),
                   "py_vs_c_load": spread_v3(per["py_vs_c_load"])}
    limit_note("load_vs_read_limit", per["load_vs_read_limit"], notes)
    if r["dcp_load_s"] is None:
        notes.append("dcp_load_s: %s" % ("skipped (BENCH_SKIP_DCP)" if SKIP_DCP else "no DCP load succeeded"))
    st = r.get("py_load_stats") or {}
    if st and (st.get("bytes_daemon", 0) + st.get("bytes_resident", 0) != st.get("bytes_read")):
        notes.append("ckptd.torch.load read %s of its %s bytes through ckptd: not every byte went through the "
                     "daemon" % (st.get("bytes_daemon"), st.get("bytes_read")))
    notes.append("ckptd.torch.load(state, checkpoint_id=...) in place, timed from the call to its return (it opens "
                 "the checkpoint, reads the Python metadata, plans and loads through the daemon: the process has a "
                 "client, %d MiB arena), its checkpoint made once by ckptd.torch.save; DCP: dcp.load in place "
                 "from FileSystemReader of checkpoints dcp.save made once (thread_count %s: files per rank), the "
                 "best median; before every load the state is overwritten (NaN), `sync` runs, the checkpoint's "
                 "files are dropped from the page cache (posix_fadvise DONTNEED after fdatasync) and every tensor "
                 "is checked (CRC32) after the clock stopped. py_vs_c_load: its time / ckpt_bench's load through "
                 "the daemon (its own checkpoint of the same shapes), informational. The VM's virtual disk may be "
                 "cached by the host, which no guest can drop" % (LOAD_ARENA // MIB,
                                                                  "/".join(map(str, DCP_LOAD_THREADS))))
    d = dict(detail)
    d["caches"] = caches.record()
    d["read_limit"] = {"method": read_best, "medians_gibps": read_meds,
                       "what": "fio O_DIRECT reads of the Python checkpoint's shard file and ckpt_bench's reader "
                               "of its own checkpoint of the same shapes, at the daemon's depth and twice it"}
    d["dcp_load"] = {"thread_count": r["dcp_load_thread_count"], "median_s_by_layout": dcp_meds}
    d["warmup"] = warm
    d["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                    "settle_ms": rd.get("settle_ms", {}), "ratios": rr["ratios"], "ceilings": rr["ceilings"]}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return {name: r}


def train_state_bytes(sc):
    """The bytes train.py saves: every layer's weight and bias (4 bytes
    each), Adam's two moments of the trained layers' (8 more bytes) and, with
    room to spare, Adam's steps."""
    per_layer = sc["width"] * sc["width"] + sc["width"]
    return 4 * (sc["layers"] + 2 * sc["trainable"]) * per_layer + 64 * sc["trainable"]


def train_scenario(name, sc, daemon, py, run_dir, failures):
    """train-overhead: the same training loop, N steps, without saves, with
    ckptd.torch saves every K steps and with DCP async saves every K steps,
    in rounds (train.py)."""
    notes, detail = [], {}
    caches = Caches()
    want_dcp = not SKIP_DCP
    state = train_state_bytes(sc)
    argv = [py, os.path.join(REPO, "bench", "baselines", "train.py"), "--dir", daemon.data, "--socket",
            daemon.socket, "--steps", str(sc["steps"]), "--every", str(sc["every"]), "--width", str(sc["width"]),
            "--layers", str(sc["layers"]), "--trainable", str(sc["trainable"]), "--arena", str(state + 64 * MIB), "--timeout", str(CMD_TIMEOUT)]
    # Two trainers: DCP's in a process of its own (with its checkpoint
    # process and stager), stopped (SIGSTOP to its group) while the other
    # runs, and the other, without DCP, runs the loop without saves and
    # with ckptd's.  In one process DCP's idle machinery slowed every step
    # of the loop without saves by 20-40 % on this machine (15.5 ms ->
    # 18.5-21 ms a step), which flattered every slowdown measured from it.
    progress("%s: starting the trainer (calibrates its batch size first)" % name)
    tr = start_worker("trainer", argv + ["--no-dcp"], run_dir, py_env(), notes)
    workers = [w for w in (tr,) if w]
    trd = None
    warm = {}
    try:
        ready = await_ready(tr, notes, "the trainer")
        if ready is None:
            raise BenchError("the trainer did not start: %s" % notes[-1])
        have_dcp = False
        if want_dcp:
            progress("%s: starting DCP's trainer" % name)
            trd = start_worker("trainer-dcp", argv + ["--batch", str(ready["batch"])], run_dir, py_env(),
                               notes)
            if trd:
                workers.append(trd)
            ready_d = await_ready(trd, notes, "DCP's trainer")
            if ready_d is not None:
                have_dcp = not ready_d.get("no_dcp")
                if ready_d.get("no_dcp"):
                    notes.append("DCP: %s" % ready_d["no_dcp"])
                detail["trainer_dcp"] = ready_d
        detail["trainer"] = ready
        if (ready.get("arena_bytes") or 0) < ready["state_bytes"]:
            notes.append("the trainer's arena is %s bytes, smaller than its state (%d): its staging waits for "
                         "the disk" % (ready.get("arena_bytes"), ready["state_bytes"]))
        kinds = ["none", "ckptd"] + (["dcp"] if have_dcp else [])
        owner = {"none": tr, "ckptd": tr, "dcp": trd}

        def alone(k):
            """Runs k with the other trainer stopped."""
            w = owner[k]
            other = trd if w is tr else tr
            if other is not None:
                other.pause()
            w.pause(False)
            try:
                return w.cmd("run %s" % k)
            finally:
                if other is not None:
                    other.pause(False)

        if trd is not None:
            trd.pause()  # until its first run
        progress("%s: warm-up runs" % name)
        for k in kinds:
            warm[k] = alone(k)
        items = [(k, caches.wrap(lambda k=k: alone(k)), owner[k]) for k in kinds]
        rounds = Rounds(name, items, daemon.data, [kinds])
        rounds.run(py_rounds(sc), failures, notes)
        rounds.note_settling(notes)
        stall, status = loop_stall(daemon, notes)
        detail["max_loop_cpu_ms"] = find_key(status, "max_loop_cpu_ms") if status else None
    finally:
        close_workers(workers, notes)

    r = {"bytes": ready["state_bytes"], "tensors": sc["tensors"], "ranks": 1, "rounds": len(rounds.rounds),
         "state_bytes": ready["state_bytes"], "batch": ready["batch"], "steps": ready["steps"],
         "every": ready["every"], "saves_per_run": max(0, (ready["steps"] - 1) // ready["every"]),
         "staged_ms_calibrated": ready["calibration"]["ckptd_staged_ms"],
         "step_ms_calibrated": ready["calibration"]["step_ms_by_batch"].get(str(ready["batch"]))}
    series = {k: rounds.series(k, "seconds") for k in ("none", "ckptd", "dcp")}
    for k in ("none", "ckptd", "dcp"):
        r[k + "_s"] = median(series[k])
        r[k + "_step_ms"] = median(rounds.series(k, "step_ms"))
    for k in ("ckptd", "dcp"):
        for f in ("call_ms_total", "staging_wait_ms_total", "upload_wait_ms_total", "drain_ms"):
            r["%s_%s" % (k, f)] = median(rounds.series(k, f))
    r["max_loop_stall_ms"] = stall
    r["max_loop_cpu_ms"] = detail.get("max_loop_cpu_ms")
    per = {k: [] for k in ("slowdown_ckptd", "slowdown_dcp", "slowdown_vs_dcp", "overhead_vs_dcp")}
    floor, copy_floor = [], []
    round_ratios = []
    staged_s = (r["staged_ms_calibrated"] or 0) / 1e3
    for i in range(len(rounds.rounds)):
        sc_ = ratio(series["ckptd"][i], series["none"][i])
        sd_ = ratio(series["dcp"][i], series["none"][i])
        x = {"slowdown_ckptd": sc_, "slowdown_dcp": sd_, "slowdown_vs_dcp": ratio(sc_, sd_),
             "overhead_vs_dcp": ratio(sc_ - 1 if sc_ is not None else None, sd_ - 1 if sd_ is not None else None)}
        # A save that cost nothing would make slowdown_ckptd 1.0: the least
        # slowdown_vs_dcp can be is 1 / DCP's slowdown.
        f = ratio(1.0, sd_)
        # On this CPU-only machine a save must copy the state with the
        # CPUs the loop trains with: at least its staging time alone
        # (measured before round 1, the copy threads on every CPU) per
        # save comes off the loop.  The least slowdown_ckptd a saver that
        # copies as fast as ckptd stages, and does nothing else, can get.
        cf = (1.0 + r["saves_per_run"] * staged_s / series["none"][i]) if series["none"][i] else None
        for k, v in x.items():
            per[k].append(v)
        floor.append(f)
        copy_floor.append(cf)
        round_ratios.append({"ratios": x, "floors": {"slowdown_vs_dcp": f, "slowdown_ckptd": cf}})
    r["ratios"] = {"slowdown_ckptd": spread_v3(per["slowdown_ckptd"], ceilings=copy_floor),
                   "slowdown_dcp": spread_v3(per["slowdown_dcp"], ceiling=1.0),
                   "slowdown_vs_dcp": spread_v3(per["slowdown_vs_dcp"], ceilings=floor),
                   "overhead_vs_dcp": spread_v3(per["overhead_vs_dcp"])}
    for k in ("none", "ckptd", "dcp"):
        offs = [f for f in rounds.series(k, "step_ms_by_offset") if f]
        if offs:
            r["step_ms_by_offset_" + k] = [round(median([o[j] for o in offs]), 2) for j in range(len(offs[0]))]
    if r["dcp_s"] is None:
        notes.append("slowdown_dcp, slowdown_vs_dcp: %s" % ("skipped (BENCH_SKIP_DCP)" if SKIP_DCP
                                                             else "no DCP run succeeded"))
    notes.append("the loop: %d Linear(%d, %d) layers (ReLU between), the last %d trained (the others frozen: "
                 "see bench/baselines/train.py), %s, lr 1e-5, one fixed "
                 "batch of %d, MSE, %d intra-op threads; %d steps per run, a save after the optimizer step of "
                 "every %d-th step before the last (%d saves of %.0f MiB: the model's and Adam's state from "
                 "get_state_dict); DCP's saves run in a trainer process of their own (the same model, batch and threads), "
                 "stopped while the other trainer runs the loop without saves and with ckptd's; for both savers the loop waits for a save's staging before the next optimizer "
                 "step and for the previous save's upload before a save (DCP's documented use). The batch was "
                 "chosen so that a step (%s ms) takes about as long as ckptd stages the state (%s ms), measured "
                 "before round 1. Figures: the runs' wall time (seconds); slowdown_* = run time with saves / "
                 "without, per round; slowdown_vs_dcp = slowdown_ckptd / slowdown_dcp; overhead_vs_dcp = "
                 "(slowdown_ckptd - 1) / (slowdown_dcp - 1), informational; the 'ceiling' of slowdown_vs_dcp is its "
                 "floor, 1 / slowdown_dcp (a save that cost nothing), and of slowdown_ckptd its floor on this "
                 "CPU-only machine, 1 + saves x ckptd's staging time alone / the run without saves (a saver "
                 "that only copies, as fast as ckptd stages, with the CPUs the loop trains with); "
                 "step_ms_by_offset_*: the median step at each offset from a save (0: the step after it; "
                 "%d: the step that ends with it); drain_ms (after the last step, until the last save "
                 "committed) is not in the run time"
                 % (sc["layers"], sc["width"], sc["width"], sc["trainable"], ready.get("optimizer"), r["batch"],
                    ready["threads"],
                    r["steps"], r["every"],
                    r["saves_per_run"], r["state_bytes"] / MIB, report.fmt(r["step_ms_calibrated"], 1),
                    report.fmt(r["staged_ms_calibrated"], 1), r["every"] - 1))
    d = dict(detail)
    d["caches"] = caches.record()
    d["warmup"] = warm
    d["rounds"] = [{"order": rd["order"], "figures": rd["figures"], "errors": rd["errors"],
                    "settle_ms": rd.get("settle_ms", {}), "ratios": rr["ratios"], "floors": rr["floors"]}
                   for rd, rr in zip(rounds.rounds, round_ratios)]
    r["notes"] = notes
    r["detail"] = d
    return {name: r}


def fmt_s(v):
    return "n/a" if v is None else ("%.3g" % v if abs(v) < 100 else "%.0f" % v)


def mount_of(path):
    """(file system type, mount options) of path, from /proc/self/mounts
    (longest prefix), or (None, None)."""
    best, found = "", (None, None)
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, found = mnt, (parts[2], parts[3])
    except OSError:
        pass
    return found


def run_scenario(name, sc, py, run_dir, data, failures):
    if sc["kind"] == "scale":
        return {name: scale_scenario(name, sc, run_dir, failures)}
    ranks = sc["ranks"]
    server = None
    if sc["kind"] == "s3":
        if SKIP_S3:
            return {name: empty_result(name, sc, "skipped (BENCH_SKIP_S3)")}
        tpy, why = test_python()
        if tpy is None:
            return {name: empty_result(name, sc, "not run: no S3 server here: %s" % why)}
    s3_why = None
    if sc["kind"] == "prune":
        # Its S3 prune needs moto; without it, the local figures still run.
        if SKIP_S3:
            s3_why = "skipped (BENCH_SKIP_S3)"
        else:
            tpy, s3_why = test_python()
            if tpy is None:
                s3_why = "no S3 server here: %s" % s3_why
    if sc["kind"] == "gpu":
        devices, why, fake = gpu_probe()
        if devices < 1:
            return {name: empty_result(name, sc, "no GPU, so not run: %s" % why)}
        sc = dict(sc, fake=fake or FAKE_CUDA)
    if sc["kind"] in PY_KINDS and py is None:
        return {name: empty_result(name, sc, "not run: no bench Python environment (see the run's notes): "
                                             "ckptd.torch runs in it")}
    rsc = ram = None
    images = 0
    if sc["kind"] == "pysave":
        # The Python client's arena and the C client's, each the whole state.
        arenas = [arena_for(sc["bytes"], sc["tensors"])] * 2
    elif sc["kind"] == "pyload":
        # Both loaders' arenas, and the pool of loads through ckptd.
        arenas = [LOAD_ARENA] * 2
        images += LOAD_SHARE_DEFAULT
    elif sc["kind"] == "train":
        arenas = [train_state_bytes(sc) + 64 * MIB]
    elif sc["kind"] == "two":
        arenas = [arena_for(sc["bytes"], sc["tensors"]), arena_for(sc["second_bytes"], sc["second_tensors"])]
    elif sc["kind"] == "load":
        rsc = sc.get("reshard")
        ram = sc.get("restore")
        # load-2g's loader, reshard-8to3's loaders and its other ranks.
        arenas = [LOAD_ARENA] + ([RESHARD_LOADER_ARENA] * rsc["loaders"] +
                                 [RESHARD_ARENA] * (rsc["ranks"] - rsc["loaders"]) if rsc else [])
        if ram:
            # The saver's and the loader's arenas (a killed saver's may
            # not be reaped yet when the loader connects), and room for
            # one image: arena_total counts images too, and a HELLO that
            # finds no room evicts them.
            arenas += [RESTORE_SAVER_ARENA, RESTORE_LOADER_ARENA]
            images = restore_image_bytes(ram)
        # Loads through ckptd share pieces in a pool per (uid, job) whose
        # loaders lend the same file (load_share, left at the daemon's
        # default: the reshard's), which counts in arena_total: room for it.
        images += LOAD_SHARE_DEFAULT
    elif sc["kind"] == "prune":
        # The saver's arena and, before it, the one of the client that
        # saves the checkpoint the roots are copies of.
        arenas = [arena_for(sc["bytes"], sc["tensors"]),
                  max(64 * MIB, arena_for(sc["ckpt_bytes"], sc["ckpt_tensors"]))]
    else:
        per = arena_for(sc["bytes"], sc["tensors"])
        arenas = [per] * (ranks * (2 if sc["kind"] == "ranks" else 1))
    arena_max = (max(arenas) // MIB + 64) * MIB
    arena_total = ((sum(arenas) + images) // MIB + 256) * MIB
    sdir = os.path.join(run_dir, name)
    os.makedirs(sdir, exist_ok=True)
    if sc["kind"] == "s3":
        server = S3Server(sc["server"], sdir, tpy)
        progress("%s: starting %s" % (name, server.label))
        try:
            server.start()
        except BenchError as e:
            server.stop()
            failures.append("%s: %s" % (name, e))
            progress("%s FAILED: %s" % (name, e))
            return {name: empty_result(name, sc, "not run: %s" % e)}
        daemon = Daemon(sdir, data, arena_max, arena_total, root=server.root,
                        extra_conf=["s3_endpoint = %s" % server.endpoint], env=server.env(daemon=True))
    else:
        if sc["kind"] == "prune" and s3_why is None:
            server = S3Server("moto", sdir, tpy)
            progress("%s: starting %s" % (name, server.label))
            try:
                server.start()
            except BenchError as e:
                server.stop()
                server = None
                failures.append("%s: %s" % (name, e))
                s3_why = "not run: %s" % e
        daemon = Daemon(sdir, data, arena_max, arena_total)
    progress("%s: starting ckptd (%s)" % (name, daemon.socket))
    watch = CpuWatch().start()
    try:
        daemon.start()
        if sc["kind"] == "s3":
            res = s3_scenario(name, sc, daemon, server, sdir, data, failures)
        elif sc["kind"] == "two":
            res = two_jobs_scenario(name, sc, daemon, sdir, failures)
        elif sc["kind"] == "gpu":
            res = gpu_scenario(name, sc, daemon, py, sdir, failures)
        elif sc["kind"] == "load":
            res = load_scenario(name, sc, daemon, py, sdir, failures, rsc)
        elif sc["kind"] == "prune":
            res = prune_scenario(name, sc, daemon, server, s3_why, sdir, failures)
        elif sc["kind"] == "pysave":
            res = pysave_scenario(name, sc, daemon, py, sdir, failures)
        elif sc["kind"] == "pyload":
            res = pyload_scenario(name, sc, daemon, py, sdir, failures)
        elif sc["kind"] == "train":
            res = train_scenario(name, sc, daemon, py, sdir, failures)
        else:
            res = save_scenario(name, sc, daemon, py, sdir, failures)
    except BenchError as e:
        failures.append("%s: %s" % (name, e))
        progress("%s FAILED: %s" % (name, e))
        res = {name: empty_result(name, sc, "not run: %s" % e)}
        if sc["kind"] == "ranks":
            res[TWO_THREADS] = empty_result(TWO_THREADS, sc, "not run: %s" % e)
        if rsc:
            for n in ("reshard-8to3", WIDE):
                res[n] = empty_result(n, rsc, "not run: %s" % e)
        if ram:
            res[RESTORE] = empty_result(RESTORE, ram, "not run: %s" % e)
    finally:
        alive = daemon.alive()
        rc = daemon.stop()
        if server is not None:
            server.stop()
    # v3: what other processes took of the CPUs while the scenario ran.
    cpu = watch.stop()
    for r in res.values():
        if cpu is not None:
            r["other_cpu_share"] = cpu["share"]
            r.setdefault("detail", {})["other_cpu"] = cpu
            if cpu["share"] > OTHER_CPU_LIMIT:
                r.setdefault("notes", []).append(
                    "other processes used %.0f %% of the CPUs during this scenario (%.1f of %.1f CPU-s; v3 allows "
                    "%.0f %%): not a recordable run" % (100 * cpu["share"], cpu["others_cpu_s"],
                                                         cpu["wall_s"] * cpu["cpus_online"], 100 * OTHER_CPU_LIMIT))
    for r in res.values():
        r.setdefault("detail", {})["ckptd"] = {"arena_max": arena_max, "arena_total": arena_total,
                                               "exit_status": rc, "log": daemon.log_path}
        if not alive:
            r["notes"].append("ckptd was not running at the end: %s" % log_tail(daemon.log_path, 5))
        elif rc not in (0, None):
            r["notes"].append("ckptd exited with status %s on SIGTERM" % rc)
    if not alive:
        failures.append("%s: ckptd was not running at the end of the scenario (%s)" % (name, daemon.log_path))
    return res


# ---- main -------------------------------------------------------------------

def main():
    started = datetime.datetime.now(datetime.timezone.utc)
    # Read now: the tree may move on (commits of others) while the run goes.
    commit, dirty = git_commit(), git_dirty()
    out_path = os.environ.get("BENCH_OUT") or os.path.join(REPO, "bench", "results", "latest.json")
    # Removed and made afresh: a directory of its own for every run.  One
    # that is not empty is removed only if an earlier run made it (marker).
    run_dir = os.environ.get("BENCH_RUN_DIR") or os.path.join(BUILD, "bench-run")
    marker = os.path.join(run_dir, ".ckpt-bench-run")
    if (os.environ.get("BENCH_RUN_DIR") and os.path.isdir(run_dir) and os.listdir(run_dir)
            and not os.path.exists(marker)):
        sys.exit("bench: %s is not empty and was not made by bench/run.py: not removing it "
                 "(BENCH_RUN_DIR)" % run_dir)
    notes = []
    failures = []
    global ROUNDS

    # SIGTERM (e.g. a CI timeout) must still stop the daemon and workers:
    # turn it into an exception so the finally clauses run.
    def on_term(signum, _frame):
        raise SystemExit("bench: signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)

    wanted = [s.strip() for s in os.environ.get("SCENARIOS", "").split(",") if s.strip()]
    for s in wanted:
        if s not in SCENARIOS and s not in (TWO_THREADS, WIDE):
            sys.exit("bench: unknown scenario '%s' (SCENARIOS= any of %s)" % (s, ", ".join(SCENARIOS)))
    if wanted:
        wanted = ["save-8ranks" if s == TWO_THREADS else "reshard-8to3" if s == WIDE else s for s in wanted]
        # Scenarios measured in load-2g's rounds, and what they take from it.
        why = {"reshard-8to3": "vs_load_2g divides by its figure of the same round",
               RESTORE: "ram_vs_load_2g divides its load time of the same round by restore-ram-2g's"}
        pulled = "load-2g" not in wanted
        for n in [n for n in why if n in wanted and pulled]:
            if "load-2g" not in wanted:
                wanted.append("load-2g")
            notes.append("load-2g runs with %s: %s" % (n, why[n]))
    names = [n for n in SCENARIOS if not wanted or n in wanted]
    if os.environ.get("BENCH_ROUNDS"):
        try:
            ROUNDS = int(os.environ["BENCH_ROUNDS"])
        except ValueError:
            ROUNDS = 0
        if ROUNDS < 2:
            sys.exit("bench: BENCH_ROUNDS must be a number >= 2")
    if ROUNDS < PROTOCOL_ROUNDS and not QUICK and any(SCENARIOS[n]["kind"] not in PY_KINDS for n in names):
        notes.append("%d rounds: fewer than the protocol's %d, not a recordable run" % (ROUNDS, PROTOCOL_ROUNDS))

    if not os.access(os.path.join(BUILD, "bench", "ckpt_bench"), os.X_OK):
        sys.exit("bench: %s/bench/ckpt_bench is missing: run `make bench`" % BUILD)

    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(os.path.join(run_dir, "data"))
    open(marker, "w").close()
    data = os.path.realpath(os.path.join(run_dir, "data"))

    # Memory is planned per scenario (memory_plan()), when it starts.
    free = shutil.disk_usage(data).free
    disk_need = 3 * max(SCENARIOS[n]["bytes"] * SCENARIOS[n]["ranks"] for n in names)
    # prune-1000's root of copies lies beside its saves.
    disk_need += max([SCENARIOS[n]["checkpoints"] * (SCENARIOS[n]["ckpt_bytes"] + MIB) for n in names
                      if SCENARIOS[n]["kind"] == "prune"] or [0])
    if free < disk_need:
        sys.exit("bench: %.1f GiB free in %s, need ~%.1f GiB" % (free / GIB, data, disk_need / GIB))

    machine = {"cpus": cpus(), "cpus_online": os.cpu_count(), "mem_gib": round((meminfo("MemTotal") or 0) / GIB, 1),
               "kernel": platform.release(), "fs": fs_type(data), "fio": tool_version(["fio", "--version"]),
               "torch": None, "python": platform.python_version(),
               "thp": read_text("/sys/kernel/mm/transparent_hugepage/enabled"),
               "shmem_thp": read_text("/sys/kernel/mm/transparent_hugepage/shmem_enabled")}
    progress("%s run, %d rounds: %s; %d cpus, %s GiB, kernel %s, %s on %s" % (
        "QUICK" if QUICK else "full", ROUNDS, ", ".join(names), machine["cpus"], machine["mem_gib"],
        machine["kernel"], machine["fs"], data))

    py = None
    if any(SCENARIOS[n]["kind"] in PY_KINDS for n in names) or (
            any(SCENARIOS[n]["kind"] not in ("two", "s3", "prune") for n in names) and not (
                SKIP_DCP and (SKIP_TORCH or all(SCENARIOS[n]["kind"] in ("load", "reshard", "restore")
                                                for n in names)))):
        py = bench_python(notes)
    # One group: reshard-8to3 and restore-ram-2g are measured in load-2g's
    # rounds.
    for n, key in (("reshard-8to3", "reshard"), (RESTORE, "restore")):
        if "load-2g" in names and n in names:
            names.remove(n)
            SCENARIOS["load-2g"] = dict(SCENARIOS["load-2g"], **{key: SCENARIOS[n]})
    scenarios = {}
    for n in names:
        scenarios.update(run_scenario(n, SCENARIOS[n], py, run_dir, data, failures))

    for r in scenarios.values():
        d = r.get("detail", {})
        for peer in list((d.get("peers") or {}).values()) + [d.get("python_worker"), d.get("trainer")]:
            if peer and peer.get("torch") and not machine["torch"]:
                machine["torch"] = peer["torch"]
    targets = report.check_targets(scenarios) + judge_v3(scenarios)
    v3 = [n for n in scenarios if SCENARIOS.get(n, {}).get("kind") in PY_KINDS]
    # v3: a run in which other processes took more than OTHER_CPU_LIMIT of
    # the CPUs (in any of its v3 scenarios) does not record itself.
    busy = ["%s: %.0f %%" % (n, 100 * scenarios[n]["other_cpu_share"]) for n in v3
            if (scenarios[n].get("other_cpu_share") or 0) > OTHER_CPU_LIMIT]
    if v3 and not QUICK and (busy or py_rounds() < V3_ROUNDS):
        why = (["other processes' CPU share above %.0f %% (%s)" % (100 * OTHER_CPU_LIMIT, ", ".join(busy))]
               if busy else []) + (["%d rounds (BENCH_ROUNDS), fewer than v3's %d" % (py_rounds(), V3_ROUNDS)]
                                   if py_rounds() < V3_ROUNDS else [])
        notes.append("NOT RECORDABLE (protocol v3): " + "; ".join(why))
        recordable = False
    else:
        recordable = not QUICK
    if QUICK:
        notes.append("QUICK run: smaller sizes and %d rounds, a smoke check; its ratios are not the benchmark's"
                     % ROUNDS)

    result = {
        "protocol": 3 if v3 and len(v3) == len(scenarios) else 2,
        "protocol_v3_scenarios": v3,
        "recordable": recordable,
        "machine": machine,
        "quick": QUICK,
        "commit": commit,
        "worktree_dirty": dirty,
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_s": round(time.monotonic() - T_START, 1),
        "rounds": (min(scenarios[n]["rounds"] for n in v3) if v3 and len(v3) == len(scenarios) else ROUNDS),
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

    print()
    print(report.text_table(result))
    shown = os.path.relpath(out_path, REPO)
    print("wrote %s (%.0f s)" % (out_path if shown.startswith("..") else shown, time.monotonic() - T_START))
    if not recordable and not QUICK:
        print("bench: this run is NOT RECORDABLE: %s" % next((n for n in notes if n.startswith("NOT RECORDABLE")),
                                                             "see its notes"), file=sys.stderr)
    if failures:
        print("bench: %d ckptd measurement(s) failed:" % len(failures), file=sys.stderr)
        for f in failures:
            print("  " + f.splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--markdown":
        with open(sys.argv[2]) as f:
            print(report.markdown(json.load(f)))
        sys.exit(0)
    if len(sys.argv) != 1:
        print("usage: BUILD=build QUICK= SCENARIOS= python3 bench/run.py\n"
              "       python3 bench/run.py --markdown RESULTS.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
