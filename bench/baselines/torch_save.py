# SPDX-License-Identifier: MIT
"""Baseline: torch.save of a state dict of the same shapes, plus fsync.

  python torch_save.py --dir DIR --bytes B --tensors T [--repeats 3] [--procs K]

One process: saves `repeats` times to DIR/torch-save-PID-I.pt, each timed from
the call to the end of fsync (file and directory), and removes the file
after.  K processes: each builds its own state of B bytes and they all save at
once after a barrier; a repeat's time is from the earliest start to the last
fsync (what a job of K ranks waits for).  Prints one JSON object:
{"seconds": [...], "median_s": X, ...}.
"""
import argparse
import multiprocessing as mp
import os
import statistics
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


def rank_main(rank, args, barrier, queue):
    try:
        common.setup_env(1)
        import torch

        torch.set_num_threads(1)
        sd = common.make_state(args.bytes, args.tensors)
        for i in range(args.repeats):
            path = os.path.join(args.dir, "torch-save-%d-r%03d-%d.pt" % (os.getppid(), rank, i))
            barrier.wait()
            t0, t1 = one_save(sd, path)
            os.unlink(path)
            queue.put((rank, i, t0, t1, torch.__version__))
            common.mutate(sd, i)
    except Exception as e:  # reported by the parent, which exits non-zero
        queue.put((rank, -1, 0.0, 0.0, "%s: %s" % (type(e).__name__, e)))
        barrier.abort()


def run_single(args):
    common.setup_env(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    sd = common.make_state(args.bytes, args.tensors)
    secs = []
    for i in range(args.repeats):
        path = os.path.join(args.dir, "torch-save-%d-%d.pt" % (os.getpid(), i))
        t0, t1 = one_save(sd, path)
        os.unlink(path)
        secs.append(t1 - t0)
        common.log("save %d/%d: %.3f s" % (i + 1, args.repeats, t1 - t0))
        common.mutate(sd, i)
    return secs, torch.__version__


def run_procs(args):
    ctx = mp.get_context("fork")  # before torch is imported: nothing to inherit
    barrier = ctx.Barrier(args.procs)
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, barrier, queue)) for r in range(args.procs)]
    for p in procs:
        p.start()
    recs = {}
    version = None
    try:
        for _ in range(args.procs * args.repeats):
            rank, i, t0, t1, info = queue.get(timeout=args.timeout)
            if i < 0:
                raise SystemExit("torch_save rank %d failed: %s" % (rank, info))
            recs[(rank, i)] = (t0, t1)
            version = info
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    secs = []
    for i in range(args.repeats):
        start = min(recs[(r, i)][0] for r in range(args.procs))
        end = max(recs[(r, i)][1] for r in range(args.procs))
        secs.append(end - start)
        common.log("save %d/%d (%d procs): %.3f s" % (i + 1, args.repeats, args.procs, end - start))
    return secs, version


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if args.procs > 1:
        secs, version = run_procs(args)
    else:
        secs, version = run_single(args)
    common.emit({
        "baseline": "torch_save",
        "torch": version,
        "bytes": args.bytes,
        "tensors": args.tensors,
        "procs": args.procs,
        "seconds": [round(s, 6) for s in secs],
        "median_s": statistics.median(secs),
    })


if __name__ == "__main__":
    main()
