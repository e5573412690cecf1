# SPDX-License-Identifier: MIT
"""The peers: torch.save (+ fsync), PyTorch DCP async_save and DCP load, in one worker.

  python peers.py --dir DIR --bytes B --tensors T [--procs K] [--no-dcp]
                  [--device cpu|cuda]

K processes (default 1) form a gloo group on loopback, each holding its own
state of B bytes in T fp32 tensors (the shapes bench/ckpt_bench.c saves;
distinct keys per rank, so every rank writes its own; with --device cuda the
tensors are on CUDA device K % count, and each measurement starts with the
device idle).  Both peers save that
same state: one set of processes instead of two keeps the memory of the
8-rank scenario within what the test machines have.  Once every rank is
ready it prints {"event": "ready", ...} and runs commands read from stdin,
one per line, printing one JSON line for each:

  torch_save   every rank: torch.save of its state dict to
               DIR/torch-save-PID-rRRR-I.pt, then fsync of the file and of
               DIR; {"seconds"} from the earliest start to the last fsync
  dcp N        one async_save by every rank to DIR/dcp-PID-I with the best
               settings this torch offers for host tensors (best_settings())
               and FileSystemWriter(thread_count=N, sync_files=True);
               {"call_ms", "staged_ms", "committed_ms"}: until the call
               returns, until its staging future, until its upload future
  dcp_keep N   not a measurement: a (blocking) dcp.save of the state as it
               is, FileSystemWriter(thread_count=N, sync_files=True), kept in
               DIR/dcp-keep-PID-tN for dcp_load N (N files per rank: the
               layout the load reads); the CRC32 of every tensor is noted
  dcp_load N   every rank: its tensors overwritten (NaN), every file of the
               kept checkpoint N dropped from the page cache
               (posix_fadvise DONTNEED), then dcp.load of the state dict in
               place from FileSystemReader; {"seconds"} from the earliest
               start to the last rank's return; each tensor's CRC32 checked
               against the kept one afterwards (not timed)
  quit         (removes the kept checkpoints)

Every measurement starts when the ranks leave a barrier; its figures are the
slowest rank's, relative to the earliest start ("t_start"/"t_end":
time.monotonic(), CLOCK_MONOTONIC like ckpt_bench's).  What a measurement
wrote is removed before its result is printed.  DCP's checkpoint processes
and the stager's cache start with the first async_save: run.py treats each
peer's first save as warm-up.  Without DCP in this torch (or with --no-dcp),
"dcp" is refused and the ready line says why.
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
import zlib

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


def tensor_crcs(sd):
    """CRC32 of every tensor's bytes (host tensors, contiguous)."""
    return {k: zlib.crc32(t.detach().contiguous().view(-1).numpy().view("uint8")) for k, t in sd.items()}


def rank_main(rank, args, store_path, cmds, results):
    """One rank: joins the group, builds its state, then runs every command
    from cmds until ("quit",)."""
    try:
        threads = max(1, common.cpus() // args.procs)
        common.setup_env(threads, gpu=args.device == "cuda")
        import torch
        import torch.distributed as dist

        dcp = ape = stager = None
        kwargs, desc, writer, no_dcp = {}, "", None, None
        device = "cpu"
        if args.device == "cuda":
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                device = "cuda:%d" % (rank % torch.cuda.device_count())
                torch.cuda.set_device(device)
            else:
                # Not an error: the scenario reports DCP null with this.
                no_dcp = ("torch %s sees no CUDA device (torch.cuda.is_available() is False; "
                          "torch.version.cuda %s)" % (str(torch.__version__), torch.version.cuda))
        if no_dcp:
            pass
        elif args.no_dcp:
            no_dcp = "left out (--no-dcp)"
        else:
            try:
                import torch.distributed.checkpoint as dcp

                if not hasattr(dcp, "async_save"):
                    no_dcp = "torch %s has no torch.distributed.checkpoint.async_save" % str(torch.__version__)
                    dcp = None
            except ImportError as e:
                no_dcp = "torch %s has no torch.distributed.checkpoint (%s)" % (str(torch.__version__), e)
        if dcp is not None:
            try:
                import torch.distributed.checkpoint._async_process_executor as ape

                if hasattr(ape, "_get_fq_hostname"):
                    ape._get_fq_hostname = lambda: "127.0.0.1"
            except ImportError:
                ape = None

        sharing_note = raise_fd_limit(torch, args.tensors) if dcp is not None and args.executor == "process" else ""
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                                world_size=args.procs)
        pg = dist.group.WORLD
        if dcp is not None:
            kwargs, stager, desc, writer = best_settings(torch, dcp, args.executor)
            if sharing_note:
                desc += ", " + sharing_note
        prefix = "rank%03d." % rank if args.procs > 1 else ""
        # No device to put it on: nothing to save (both commands refuse).
        no_state = args.device == "cuda" and device == "cpu"
        sd = {} if no_state else common.make_state(args.bytes, args.tensors, prefix)
        if device != "cpu":
            sd = {k: v.to(device) for k, v in sd.items()}
            torch.cuda.synchronize()
        # str(): torch.__version__ is a TorchVersion, and unpickling one
        # would import torch into the parent (~300 MB of a CUDA build).
        results.put(("ready", rank, {"torch": str(torch.__version__), "dcp_settings": desc or None,
                                     "no_dcp": no_dcp, "threads": threads, "device": device}))

        n = 0  # saves so far, of either kind: each gets its own paths
        kept = {}  # thread count -> (path, CRC32 per tensor): dcp_keep
        while True:
            cmd = cmds.get()
            if cmd[0] not in ("torch_save", "dcp", "dcp_keep", "dcp_load"):
                break
            if cmd[0] in ("dcp_keep", "dcp_load"):
                results.put((cmd[0], rank, dcp_kept(cmd, rank, args, dist, dcp, sd, pg, kept)))
                continue
            if n > 0:
                common.mutate(sd, n)
            if device != "cpu":
                # The update's kernels are done before the clock starts,
                # as ckpt_bench's are.
                torch.cuda.synchronize()
            if cmd[0] == "torch_save":
                path = os.path.join(args.dir, "torch-save-%d-r%03d-%d.pt" % (os.getppid(), rank, n))
                dist.barrier()
                t0 = time.monotonic()
                torch.save(sd, path)
                common.fsync_path(path)
                common.fsync_path(args.dir)
                t1 = time.monotonic()
                dist.barrier()
                os.unlink(path)
                results.put(("torch_save", rank, (t0, t1)))
            else:
                path = os.path.join(args.dir, "dcp-%d-%d" % (os.getppid(), n))
                dist.barrier()
                t0 = time.monotonic()
                res = dcp.async_save(sd, checkpoint_id=path, storage_writer=writer(path, cmd[1]),
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
                # Every rank is done before rank 0 removes the checkpoint,
                # and rank 0 reports only once it is removed.
                dist.barrier()
                if rank == 0:
                    shutil.rmtree(path, ignore_errors=True)
                results.put(("dcp", rank, (t0, t_call, t_staged, t_done)))
            n += 1
        if rank == 0:
            for path, _crcs in kept.values():
                shutil.rmtree(path, ignore_errors=True)
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


def dcp_kept(cmd, rank, args, dist, dcp, sd, pg, kept):
    """dcp_keep N and dcp_load N on one rank (see the top); returns its
    payload for the parent."""
    kind, threads = cmd
    path = os.path.join(args.dir, "dcp-keep-%d-t%d" % (os.getppid(), threads))
    if kind == "dcp_keep":
        dist.barrier()
        t0 = time.monotonic()
        dcp.save(sd, checkpoint_id=path, process_group=pg,
                 storage_writer=dcp.FileSystemWriter(path, thread_count=threads, sync_files=True))
        t1 = time.monotonic()
        dist.barrier()
        if rank == 0:
            common.fsync_tree(path)
        kept[threads] = (path, tensor_crcs(sd))
        return (t0, t1, None)
    if threads not in kept:
        raise RuntimeError("dcp_load %d: no dcp_keep %d before it" % (threads, threads))
    path, crcs = kept[threads]
    # What the load must restore is overwritten first, so a tensor it left
    # out fails the check below.
    for t in sd.values():
        t.fill_(float("nan"))
    dropped = common.drop_tree(path)
    dist.barrier()
    t0 = time.monotonic()
    dcp.load(sd, checkpoint_id=path, process_group=pg, storage_reader=dcp.FileSystemReader(path))
    t1 = time.monotonic()
    dist.barrier()
    got = tensor_crcs(sd)
    bad = [k for k in crcs if got.get(k) != crcs[k]]
    if bad:
        raise RuntimeError("dcp_load %d: %d tensors differ from what was saved (first: %s)"
                           % (threads, len(bad), bad[0]))
    return (t0, t1, {"files": dropped[0], "bytes": dropped[1], "verify_s": round(time.monotonic() - t1, 3)})


class Group:
    """The K rank processes, driven through one command queue each."""

    def __init__(self, args):
        self.args = args
        # Not fork: DCP's own checkpoint process and gloo want a clean
        # interpreter.  A fork server that has imported torch (and nothing
        # else) gives each rank one: the ranks then share torch's pages
        # instead of ~350 MB each of their own (a CUDA build of torch),
        # which the 8-rank scenario needs to fit in memory.
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed"])
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

    def torch_save(self):
        for q in self.cmds:
            q.put(("torch_save",))
        recs = self.collect("torch_save")
        start, end = min(r[0] for r in recs), max(r[1] for r in recs)
        return {"seconds": end - start, "t_start": start, "t_end": end}

    def dcp(self, thread_count):
        for q in self.cmds:
            q.put(("dcp", thread_count))
        recs = self.collect("dcp")
        start = min(r[0] for r in recs)
        return {"call_ms": (max(r[1] for r in recs) - start) * 1e3,
                "staged_ms": (max(r[2] for r in recs) - start) * 1e3,
                "committed_ms": (max(r[3] for r in recs) - start) * 1e3,
                "t_start": start, "t_end": max(r[3] for r in recs)}

    def dcp_kept(self, kind, thread_count):
        for q in self.cmds:
            q.put((kind, thread_count))
        recs = self.collect(kind)
        start, end = min(r[0] for r in recs), max(r[1] for r in recs)
        out = {"seconds": end - start, "t_start": start, "t_end": end, "thread_count": thread_count}
        if recs[0][2] is not None:
            # Every rank drops the whole checkpoint: one rank's count.
            out["drop"] = {"files": recs[0][2]["files"], "bytes": recs[0][2]["bytes"]}
            out["verify_s"] = max(r[2]["verify_s"] for r in recs)
        return out

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
    ap.add_argument("--no-dcp", action="store_true", help="torch.save only")
    ap.add_argument("--executor", choices=("process", "thread"), default="process",
                    help="DCP's upload executor (process where this torch has it)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the state lives (cuda: rank K on device K %% count)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    # Before the fork server starts: it and every rank inherit this
    # environment (CPU only unless --device cuda, thread counts, loopback
    # for gloo and for DCP's checkpoint processes).
    common.setup_env(max(1, common.cpus() // args.procs), gpu=args.device == "cuda")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"

    g = Group(args)
    clean = False
    try:
        info = g.collect("ready")[0]
        common.log("torch %s: DCP %s" % (info["torch"], info["dcp_settings"] or info["no_dcp"]))
        common.emit({"event": "ready", "torch": info["torch"], "dcp_settings": info["dcp_settings"],
                     "no_dcp": info["no_dcp"], "procs": args.procs, "threads_per_proc": info["threads"],
                     "executor": args.executor, "device": info["device"]})
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd == ["quit"]:
                break
            if cmd == ["torch_save"]:
                if args.device == "cuda" and info["device"] == "cpu":
                    common.emit({"error": "torch_save: %s" % info["no_dcp"]})
                    continue
                r = g.torch_save()
            elif len(cmd) == 2 and cmd[0] == "dcp" and cmd[1].isdigit() and int(cmd[1]) >= 1:
                if info["no_dcp"]:
                    common.emit({"error": "DCP: %s" % info["no_dcp"]})
                    continue
                r = g.dcp(int(cmd[1]))
                r["thread_count"] = int(cmd[1])
            elif len(cmd) == 2 and cmd[0] in ("dcp_keep", "dcp_load") and cmd[1].isdigit() and int(cmd[1]) >= 1:
                if info["no_dcp"]:
                    common.emit({"error": "DCP: %s" % info["no_dcp"]})
                    continue
                if args.device != "cpu":
                    common.emit({"error": "%s: host tensors only" % cmd[0]})
                    continue
                r = g.dcp_kept(cmd[0], int(cmd[1]))
            else:
                common.emit({"error": "unknown command %r (torch_save, dcp N, dcp_keep N, dcp_load N, quit)"
                                      % line.strip()})
                continue
            r["cmd"] = cmd[0]
            common.emit(r)
        clean = True
    finally:
        g.close(clean)


if __name__ == "__main__":
    main()
