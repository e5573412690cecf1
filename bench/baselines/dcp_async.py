# SPDX-License-Identifier: MIT
"""Baseline: PyTorch DCP torch.distributed.checkpoint.async_save.

  python dcp_async.py --dir DIR --bytes B --tensors T [--procs K]

A worker: K processes (default 1) form a gloo group on loopback, each holding
its own state of B bytes in T fp32 tensors (distinct keys per rank, so every
rank writes its own), with the best settings the installed torch offers for
host tensors (see best_settings()).  Once every rank is ready it prints
{"event": "ready", ...} and runs commands read from stdin, one per line,
printing one JSON line for each:

  save N   one async_save to DIR/dcp-PID-I by every rank, with
           FileSystemWriter(thread_count=N, sync_files=True); the checkpoint
           is removed before the result is printed
  quit

Per save and rank: the call, the staging future and the upload future, timed
from the moment the ranks leave a barrier; a save's figures are the slowest
rank's, relative to the earliest start: {"cmd": "save", "call_ms",
"staged_ms", "committed_ms", "t_start", "t_end"} (time.monotonic()).  The
process pool, the stager's cache and DCP's checkpoint process start with the
first save: run.py treats the first save as warm-up.
"""
import argparse
import inspect
import multiprocessing as mp
import os
import queue as queue_mod
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


def rank_main(rank, args, store_path, cmds, results):
    """One rank: joins the group, builds its state, then saves on every
    ("save", thread_count) from cmds until ("quit",)."""
    try:
        threads = max(1, common.cpus() // args.procs)
        common.setup_env(threads)
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
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                                world_size=args.procs)
        pg = dist.group.WORLD
        kwargs, stager, desc, writer = best_settings(torch, dcp, args.executor)
        prefix = "rank%03d." % rank if args.procs > 1 else ""
        sd = common.make_state(args.bytes, args.tensors, prefix)
        if sharing_note:
            desc += ", " + sharing_note
        results.put(("ready", rank, {"torch": torch.__version__, "settings": desc}))

        i = 0
        while True:
            cmd = cmds.get()
            if cmd[0] != "save":
                break
            thread_count = cmd[1]
            if i > 0:
                common.mutate(sd, i)
            path = os.path.join(args.dir, "dcp-%d-%d" % (os.getppid(), i))
            dist.barrier()
            t0 = time.monotonic()
            res = dcp.async_save(sd, checkpoint_id=path, storage_writer=writer(path, thread_count),
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
            # Every rank is done before rank 0 removes the checkpoint, and
            # rank 0 reports only once it is removed: nothing of this save
            # is still being deleted while the next measurement runs.
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            results.put(("save", rank, (t0, t_call, t_staged, t_done)))
            i += 1
        if stager is not None:
            stager.close()
        # Stop DCP's checkpoint process the way its destructor does
        # (TERMINATE, bounded join), while the group still exists.
        if ape is not None and getattr(ape, "_CHECKPOINT_PROCESS", None) is not None:
            proc, ape._CHECKPOINT_PROCESS = ape._CHECKPOINT_PROCESS, None
            proc.__del__()
        dist.destroy_process_group()
        results.put(("done", rank, None))
    except BaseException as e:
        results.put(("error", rank, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc(limit=4))))
    # Flush the queue's feeder thread: _exit below would drop what it holds.
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    # The checkpoint process DCP started is a child of this one; _exit
    # skips interpreter clean-up that may wait on it (it exits when its
    # parent does).
    os._exit(0)


class Group:
    """The K rank processes, driven through one command queue each."""

    def __init__(self, args):
        self.args = args
        # spawn, not fork: DCP's own checkpoint process and gloo want a
        # clean interpreter, and the ranks must not share the parent's
        # torch state.
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.cmds = [ctx.Queue() for _ in range(args.procs)]
        self.store_dir = tempfile.mkdtemp(prefix="dcp-store-", dir=args.dir)
        store_path = os.path.join(self.store_dir, "store")
        self.procs = [ctx.Process(target=rank_main, args=(r, args, store_path, self.cmds[r], self.results))
                      for r in range(args.procs)]
        for p in self.procs:
            p.start()

    def collect(self, kind):
        """Every rank's payload of the next message, which must be `kind`."""
        got = {}
        deadline = time.monotonic() + self.args.timeout
        while len(got) < self.args.procs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit("dcp_async: timed out after %.0f s waiting for %s" % (self.args.timeout, kind))
            try:
                k, rank, payload = self.results.get(timeout=min(left, 5))
            except queue_mod.Empty:
                # Every message of a rank is queued before it exits; a rank
                # gone with nothing more in the queue died unreported.
                if any(p.exitcode is not None for p in self.procs) and self.results.empty():
                    time.sleep(1)
                    if self.results.empty():
                        codes = [p.exitcode for p in self.procs]
                        raise SystemExit("dcp_async: a rank died (exit codes %s)" % codes)
                continue
            if k == "error":
                raise SystemExit("dcp_async rank %d failed: %s" % (rank, payload))
            if k != kind:
                raise SystemExit("dcp_async rank %d: %s, expected %s" % (rank, k, kind))
            got[rank] = payload
        return [got[r] for r in range(self.args.procs)]

    def save(self, thread_count):
        for q in self.cmds:
            q.put(("save", thread_count))
        recs = self.collect("save")
        start = min(r[0] for r in recs)
        return {"call_ms": (max(r[1] for r in recs) - start) * 1e3,
                "staged_ms": (max(r[2] for r in recs) - start) * 1e3,
                "committed_ms": (max(r[3] for r in recs) - start) * 1e3,
                "t_start": start, "t_end": max(r[3] for r in recs)}

    def close(self, clean):
        if clean:
            for q in self.cmds:
                q.put(("quit",))
            try:
                self.collect("done")
            except SystemExit as e:
                common.log(str(e))
        for p in self.procs:
            p.join(timeout=30 if clean else 0)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(self.store_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--executor", choices=("process", "thread"), default="process",
                    help="DCP's upload executor (process where this torch has it)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)

    g = Group(args)
    clean = False
    try:
        info = g.collect("ready")[0]
        common.log("torch %s: %s" % (info["torch"], info["settings"]))
        common.emit({"event": "ready", "baseline": "dcp_async", "torch": info["torch"],
                     "settings": info["settings"], "procs": args.procs, "executor": args.executor})
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd == ["quit"]:
                break
            if len(cmd) != 2 or cmd[0] != "save" or not cmd[1].isdigit() or int(cmd[1]) < 1:
                common.emit({"error": "unknown command %r (save THREAD_COUNT, quit)" % line.strip()})
                continue
            r = g.save(int(cmd[1]))
            r.update({"cmd": "save", "thread_count": int(cmd[1])})
            common.emit(r)
        clean = True
    finally:
        g.close(clean)


if __name__ == "__main__":
    main()
