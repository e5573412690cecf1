# SPDX-License-Identifier: MIT
"""Baseline: torch.save of a state dict of the same shapes, plus fsync.

  python torch_save.py --dir DIR --bytes B --tensors T [--procs K]

A worker: builds its state once (K processes: each its own B bytes), prints
{"event": "ready", ...} and then runs commands read from stdin, one per line,
printing one JSON line for each:

  save   every process saves once to DIR/torch-save-PID-rRRR-I.pt, each timed
         from the call to the end of the fsync of the file and of DIR, then
         removes its file.  With K processes they start together after a
         barrier, and the save's time runs from the earliest start to the last
         fsync (what a job of K ranks waits for).
  quit

The result: {"cmd": "save", "seconds": S, "t_start": T0, "t_end": T1} with
time.monotonic() values (CLOCK_MONOTONIC, as ckpt_bench's).
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def one_save(sd, path):
    import torch

    t0 = time.monotonic()
    torch.save(sd, path)
    common.fsync_path(path)
    common.fsync_path(os.path.dirname(path))
    t1 = time.monotonic()
    return t0, t1


def rank_main(rank, args, threads, barrier, cmds, results):
    """One process of K: saves on each "save" from cmds, after the barrier."""
    try:
        common.setup_env(threads)
        import torch

        torch.set_num_threads(threads)
        sd = common.make_state(args.bytes, args.tensors)
        results.put((rank, "ready", torch.__version__))
        i = 0
        while True:
            cmd = cmds.get()
            if cmd != "save":
                break
            if i > 0:
                common.mutate(sd, i)
            path = os.path.join(args.dir, "torch-save-%d-r%03d-%d.pt" % (os.getppid(), rank, i))
            barrier.wait()
            t0, t1 = one_save(sd, path)
            os.unlink(path)
            results.put((rank, "save", (t0, t1)))
            i += 1
    except Exception as e:  # reported by the parent, which exits non-zero
        results.put((rank, "error", "%s: %s" % (type(e).__name__, e)))
        barrier.abort()


class Single:
    def __init__(self, args, threads):
        common.setup_env(threads)
        import torch

        torch.set_num_threads(threads)
        self.version = torch.__version__
        self.args = args
        self.sd = common.make_state(args.bytes, args.tensors)
        self.i = 0

    def save(self):
        if self.i > 0:
            common.mutate(self.sd, self.i)
        path = os.path.join(self.args.dir, "torch-save-%d-%d.pt" % (os.getpid(), self.i))
        t0, t1 = one_save(self.sd, path)
        os.unlink(path)
        self.i += 1
        return t0, t1

    def close(self):
        pass


class Procs:
    def __init__(self, args, threads):
        self.args = args
        ctx = mp.get_context("fork")  # before torch is imported: nothing to inherit
        self.barrier = ctx.Barrier(args.procs)
        self.results = ctx.Queue()
        self.cmds = [ctx.Queue() for _ in range(args.procs)]
        self.procs = [ctx.Process(target=rank_main, args=(r, args, threads, self.barrier, self.cmds[r],
                                                          self.results))
                      for r in range(args.procs)]
        for p in self.procs:
            p.start()
        versions = self.collect("ready")
        self.version = versions[0]

    def collect(self, kind):
        got = {}
        while len(got) < self.args.procs:
            rank, k, payload = self.results.get(timeout=self.args.timeout)
            if k == "error":
                raise SystemExit("torch_save rank %d failed: %s" % (rank, payload))
            if k != kind:
                raise SystemExit("torch_save rank %d: %s, expected %s" % (rank, k, kind))
            got[rank] = payload
        return [got[r] for r in range(self.args.procs)]

    def save(self):
        for q in self.cmds:
            q.put("save")
        times = self.collect("save")
        return min(t[0] for t in times), max(t[1] for t in times)

    def close(self):
        for q in self.cmds:
            q.put("quit")
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process (0: CPUs / procs)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    threads = args.threads or max(1, common.cpus() // args.procs)
    w = Procs(args, threads) if args.procs > 1 else Single(args, threads)
    common.emit({"event": "ready", "baseline": "torch_save", "torch": w.version, "procs": args.procs,
                 "threads_per_proc": threads})
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd == ["quit"]:
                break
            if cmd != ["save"]:
                common.emit({"error": "unknown command %r (save, quit)" % line.strip()})
                continue
            t0, t1 = w.save()
            common.emit({"cmd": "save", "seconds": t1 - t0, "t_start": t0, "t_end": t1})
    finally:
        w.close()


if __name__ == "__main__":
    main()
