# SPDX-License-Identifier: MIT
"""Baseline: PyTorch DCP torch.distributed.checkpoint.async_save.

  python dcp_async.py --dir DIR --bytes B --tensors T [--saves N] [--procs K]

K processes (default 1) form a gloo group on loopback; each holds its own
state of B bytes in T fp32 tensors (distinct keys per rank, so every rank
writes its own) and they all save N times to DIR/dcp-PID-I, with the best
settings the installed torch offers for host tensors (see best_settings()).
Per save and rank: the call, the staging future and the upload future, timed
from the moment the ranks leave a barrier.  A save's figure is the slowest
rank's, relative to the earliest start; medians over saves 2..N, so the first
save's set-up (stager cache, checkpoint process start) is left out, as for
ckptd.  Prints one JSON object with "call_ms", "staged_ms", "committed_ms".
"""
import argparse
import inspect
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def best_settings(torch, dcp, executor):
    """Picks what this torch version offers.  Returns (kwargs for async_save
    minus state dict and paths, stager to close or None, description, writer
    factory)."""
    params = inspect.signature(dcp.async_save).parameters
    kwargs = {}
    desc = []
    stager = None
    cuda = torch.cuda.is_available()

    if executor == "thread":
        desc.append("thread executor")
    elif "async_checkpointer_type" in params:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        # The checkpoint process writes outside the trainer's GIL; it
        # is started once and reused by later saves.
        kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
        desc.append("process executor")
    else:
        desc.append("thread executor (no async_checkpointer_type in this torch)")

    staging = None
    try:
        from torch.distributed.checkpoint import staging
    except ImportError:
        pass
    if staging is not None and hasattr(staging, "DefaultStager") and "async_stager" in params:
        # One stager for every save: it caches the staged storages (shared
        # memory, so the checkpoint process reads them without a copy) and
        # copies into them again on later saves.  Pinning and non-blocking
        # copies need CUDA; async staging runs the copy on a thread.
        opts = staging.StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=executor != "thread",
            use_async_staging=True,
            use_non_blocking_copy=cuda,
        )
        stager = staging.DefaultStager(opts)
        kwargs["async_stager"] = stager
        desc.append("DefaultStager(%sasync staging%s)" % ("shared memory, " if executor != "thread" else "",
                                                          ", pinned" if cuda else ""))
        cache_in_writer = False
    else:
        # Older torch: FileSystemWriter is itself the (blocking) stager;
        # ask it to cache the staged copy across saves.
        cache_in_writer = True
        desc.append("FileSystemWriter staging (blocking), cache_staged_state_dict")

    def writer(path, threads):
        wparams = inspect.signature(dcp.FileSystemWriter.__init__).parameters
        wk = {"thread_count": threads, "sync_files": True}
        if cache_in_writer and "cache_staged_state_dict" in wparams:
            wk["cache_staged_state_dict"] = True
        return dcp.FileSystemWriter(path, **wk)

    return kwargs, stager, ", ".join(desc), writer


def raise_fd_limit(torch, tensors):
    """Shared-memory staging hands every storage to DCP's checkpoint process
    as a file descriptor (torch's default "file_descriptor" sharing), a few
    per tensor at once: 10,000 tensors need more than the usual limit.
    Raise it (the hard limit too where we may); else fall back to torch's
    "file_system" sharing.  Returns a note for the settings, or ""."""
    import resource

    need = 4 * tensors + 4096
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
            soft, hard = need, need
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < need:
        torch.multiprocessing.set_sharing_strategy("file_system")
        return "file_system sharing (fd limit %d < %d)" % (soft, need)
    return ""


def rank_main(rank, args, store_path, queue):
    try:
        common.setup_env(max(1, (os.cpu_count() or 1) // args.procs))
        # Keep every socket of the group (and of DCP's checkpoint process)
        # on loopback.
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        try:
            import torch.distributed.checkpoint._async_process_executor as ape

            if hasattr(ape, "_get_fq_hostname"):
                ape._get_fq_hostname = lambda: "127.0.0.1"
        except ImportError:
            ape = None

        sharing_note = raise_fd_limit(torch, args.tensors) if args.executor == "process" else ""
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.procs))
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                                world_size=args.procs)
        pg = dist.group.WORLD
        kwargs, stager, desc, writer = best_settings(torch, dcp, args.executor)
        prefix = "rank%03d." % rank if args.procs > 1 else ""
        sd = common.make_state(args.bytes, args.tensors, prefix)
        if sharing_note:
            desc += ", " + sharing_note
        if rank == 0:
            queue.put(("info", rank, {"torch": torch.__version__, "settings": desc}))

        for i in range(args.saves):
            path = os.path.join(args.dir, "dcp-%d-%d" % (os.getppid(), i))
            if rank == 0 and i > 0:
                shutil.rmtree(os.path.join(args.dir, "dcp-%d-%d" % (os.getppid(), i - 1)),
                              ignore_errors=True)
            dist.barrier()
            t0 = time.monotonic()
            res = dcp.async_save(sd, checkpoint_id=path, storage_writer=writer(path, args.writer_threads),
                                 process_group=pg, **kwargs)
            t_call = time.monotonic()
            if hasattr(res, "staging_completion"):
                res.staging_completion.result()
                t_staged = time.monotonic()
                res.upload_completion.result()
            else:
                # A plain Future: staging finished inside the call.
                t_staged = t_call
                res.result()
            t_done = time.monotonic()
            queue.put(("save", rank, (i, t0, t_call, t_staged, t_done)))
            common.mutate(sd, i)
        dist.barrier()
        if rank == 0:
            shutil.rmtree(os.path.join(args.dir, "dcp-%d-%d" % (os.getppid(), args.saves - 1)),
                          ignore_errors=True)
        if stager is not None:
            stager.close()
        # Stop DCP's checkpoint process the way its destructor does
        # (TERMINATE, bounded join), while the group still exists.
        if ape is not None and getattr(ape, "_CHECKPOINT_PROCESS", None) is not None:
            proc, ape._CHECKPOINT_PROCESS = ape._CHECKPOINT_PROCESS, None
            proc.__del__()
        dist.destroy_process_group()
        queue.put(("done", rank, None))
    except BaseException as e:
        queue.put(("error", rank, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc(limit=4))))
    # Flush the queue's feeder thread: _exit below would drop what it holds.
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    # The checkpoint process DCP started is a child of this one; _exit
    # skips interpreter clean-up that may wait on it (it exits when its
    # parent does).
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--writer-threads", type=int, default=1)
    ap.add_argument("--executor", choices=("process", "thread"), default="process",
                    help="DCP's upload executor (process where this torch has it)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)

    # spawn, not fork: DCP's own checkpoint process and gloo want a clean
    # interpreter, and the ranks must not share the parent's torch state.
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store_dir = tempfile.mkdtemp(prefix="dcp-store-", dir=args.dir)
    store_path = os.path.join(store_dir, "store")
    procs = [ctx.Process(target=rank_main, args=(r, args, store_path, queue)) for r in range(args.procs)]
    for p in procs:
        p.start()
    recs = {}
    info = {}
    done = 0
    deadline = time.monotonic() + args.timeout
    try:
        while done < args.procs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit("dcp_async: timed out after %.0f s" % args.timeout)
            try:
                kind, rank, payload = queue.get(timeout=min(left, 5))
            except Exception:
                # Every message of a rank is queued before it exits; a rank
                # gone with nothing more in the queue died unreported.
                if any(p.exitcode is not None for p in procs) and queue.empty():
                    time.sleep(1)
                    if queue.empty():
                        codes = [p.exitcode for p in procs]
                        raise SystemExit("dcp_async: a rank died (exit codes %s)" % codes)
                continue
            if kind == "error":
                raise SystemExit("dcp_async rank %d failed: %s" % (rank, payload))
            if kind == "info":
                info = payload
                common.log("torch %s: %s" % (payload["torch"], payload["settings"]))
            elif kind == "save":
                i, t0, tc, ts, td = payload
                recs[(rank, i)] = (t0, tc, ts, td)
                if len([k for k in recs if k[1] == i]) == args.procs:
                    start = min(recs[(r, i)][0] for r in range(args.procs))
                    end = max(recs[(r, i)][3] for r in range(args.procs))
                    common.log("save %d/%d: %.3f s" % (i + 1, args.saves, end - start))
            elif kind == "done":
                done += 1
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(store_dir, ignore_errors=True)

    call, staged, committed = [], [], []
    for i in range(args.saves):
        start = min(recs[(r, i)][0] for r in range(args.procs))
        call.append(max(recs[(r, i)][1] - start for r in range(args.procs)) * 1e3)
        staged.append(max(recs[(r, i)][2] - start for r in range(args.procs)) * 1e3)
        committed.append(max(recs[(r, i)][3] - start for r in range(args.procs)) * 1e3)
    common.emit({
        "baseline": "dcp_async",
        "torch": info.get("torch"),
        "settings": info.get("settings"),
        "bytes": args.bytes,
        "tensors": args.tensors,
        "procs": args.procs,
        "saves": args.saves,
        "writer_threads": args.writer_threads,
        "executor": args.executor,
        "per_save_call_ms": [round(v, 3) for v in call],
        "per_save_staged_ms": [round(v, 3) for v in staged],
        "per_save_committed_ms": [round(v, 3) for v in committed],
        "call_ms": common.median_from_second(call),
        "staged_ms": common.median_from_second(staged),
        "committed_ms": common.median_from_second(committed),
        "first_committed_ms": committed[0],
    })


if __name__ == "__main__":
    main()
