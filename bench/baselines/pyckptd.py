# SPDX-License-Identifier: MIT
"""The Python side of py-save-2g and py-load-2g: ckptd.torch against DCP, in
one process, on one state.

  python pyckptd.py --mode save|load --dir DIR --socket S --bytes B
                    --tensors T --arena A [--no-dcp] [--timeout S]

Run by bench/run.py with the bench environment's python, PYTHONPATH=python
(the package of this tree) and CKPTD_LIBCKPT=$BUILD/libckpt.so.  The process
holds one state of B bytes in T fp32 tensors (common.make_state: the shapes
ckpt_bench saves), joins a gloo group of one rank on loopback (DCP wants
one; ckptd.torch asks it for rank and size only), connects to the ckptd on
S with an arena of A bytes (ckptd.configure; timed: "connect_ms") and, for
DCP, makes its stagers and starts its checkpoint process with a first save
(untimed).  Then it prints {"event": "ready", ...} and runs commands from
stdin, one JSON line each.  Checkpoints go to DIR/<name>, one of the
daemon's roots; what a measurement wrote is removed before it answers.

--mode save:
  ckptd          ckptd.torch.async_save of the state after a training step's
                 worth of change (common.mutate, untimed):
                 {"call_ms", "staged_ms", "committed_ms"}, from the call to
                 its return, to staging_completion's result, to
                 upload_completion's result, each seen by this thread
  dcp CONFIG     DCP async_save of the same state, CONFIG one of DCP_CONFIGS
                 (staging mode and FileSystemWriter thread count: see
                 dcp_settings()), the same figures
  overhead       the binding's cost per call and per tensor: async_save of
                 1, 256 and 10,000 small tensors (16 fp32 each), several
                 times each, the call timed; beside it the parts of the call
                 timed apart (flatten + torch introspection, the ctypes
                 calls that hand the tensors to libckpt) and a bare ctypes
                 call (see overhead())
--mode load:
  keep_ckptd     ckptd.torch.save of the state (blocking), kept for load_ckptd;
                 {"path", "files", "seconds"}
  keep_dcp N     dcp.save with FileSystemWriter(thread_count=N,
                 sync_files=True) (N files), kept for load_dcp N
  load_ckptd     the state overwritten (NaN), the kept checkpoint's files
                 dropped from the page cache (posix_fadvise DONTNEED), then
                 ckptd.torch.load in place, timed ({"seconds", "stats":
                 ckpt_load_stats}); each tensor's CRC32 checked afterwards
  load_dcp N     the same with dcp.load from FileSystemReader
quit             removes what was kept, stops DCP's checkpoint process
"""
import argparse
import os
import shutil
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# DCP's configurations tried in every round: staging on DCP's thread
# (async) or in the call (sync), both into one cached shared-memory stager
# per mode (the checkpoint process reads it without a copy), times
# FileSystemWriter's thread counts (as save-2g tries them).
DCP_THREADS = (1, 2, 4)
DCP_CONFIGS = ["%s-t%d" % (m, t) for m in ("async", "sync") for t in DCP_THREADS]
OVERHEAD_SIZES = ((1, 15), (256, 15), (10000, 3))


def now():
    return time.monotonic()


class Peer:
    """DCP: the process group, the stagers and the writer settings."""

    def __init__(self, torch, dist, args):
        self.torch = torch
        self.dist = dist
        self.args = args
        self.dcp = None
        self.no_dcp = None
        self.stagers = {}
        self.kwargs = {}
        self.desc = {}
        self.ape = None
        if args.no_dcp:
            self.no_dcp = "left out (--no-dcp)"
            return
        try:
            import torch.distributed.checkpoint as dcp
        except ImportError as e:
            self.no_dcp = "torch %s has no torch.distributed.checkpoint (%s)" % (torch.__version__, e)
            return
        if not hasattr(dcp, "async_save"):
            self.no_dcp = "torch %s has no torch.distributed.checkpoint.async_save" % torch.__version__
            return
        self.dcp = dcp

    def setup(self, mode):
        """Stagers and executor for saves (mode "save"); loads need none."""
        if self.dcp is None or mode != "save":
            return
        import inspect

        try:
            import torch.distributed.checkpoint._async_process_executor as ape

            if hasattr(ape, "_get_fq_hostname"):
                ape._get_fq_hostname = lambda: "127.0.0.1"  # its group on loopback
            self.ape = ape
        except ImportError:
            pass
        params = inspect.signature(self.dcp.async_save).parameters
        if "async_checkpointer_type" in params:
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            self.kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
            executor = "process executor"
        else:
            executor = "thread executor (no async_checkpointer_type in this torch)"
        try:
            from torch.distributed.checkpoint import staging
        except ImportError:
            staging = None
        if staging is None or not hasattr(staging, "DefaultStager") or "async_stager" not in params:
            self.no_dcp = ("torch %s has no DefaultStager/async_stager: not the DCP this bench compares with"
                           % self.torch.__version__)
            self.dcp = None
            return
        for m in ("async", "sync"):
            # Pinned memory and non-blocking copies need CUDA; shared memory
            # lets the checkpoint process read the staged copy in place.
            opts = staging.StagingOptions(use_pinned_memory=False, use_shared_memory=True,
                                          use_async_staging=m == "async", use_non_blocking_copy=False)
            self.stagers[m] = staging.DefaultStager(opts)
            self.desc[m] = ("%s, DefaultStager(shared memory, %s staging, cached), "
                            "FileSystemWriter(thread_count=N, sync_files=True)"
                            % (executor, "async: a thread of the stager" if m == "async" else "sync: in the call"))

    def save(self, sd, path, config):
        mode, threads = config.split("-t")
        writer = self.dcp.FileSystemWriter(path, thread_count=int(threads), sync_files=True)
        t0 = now()
        res = self.dcp.async_save(sd, checkpoint_id=path, storage_writer=writer, process_group=None,
                                  async_stager=self.stagers[mode], **self.kwargs)
        t_call = now()
        if hasattr(res, "staging_completion"):
            res.staging_completion.result()
            t_staged = now()
            res.upload_completion.result()
        else:
            # A plain future: staging was done in the call.
            t_staged = t_call
            res.result()
        t_done = now()
        return t0, t_call, t_staged, t_done

    def close(self):
        for s in self.stagers.values():
            s.close()
        # DCP's checkpoint process, stopped as its destructor does (a
        # TERMINATE message, a bounded join), so that it is reaped here.
        ape = self.ape
        if ape is not None and getattr(ape, "_CHECKPOINT_PROCESS", None) is not None:
            proc, ape._CHECKPOINT_PROCESS = ape._CHECKPOINT_PROCESS, None
            proc.__del__()


def crcs(torch, sd):
    import zlib

    return {k: zlib.crc32(t.detach().contiguous().view(-1).numpy().view("uint8")) for k, t in sd.items()}


def check(torch, sd, want, what):
    got = crcs(torch, sd)
    bad = [k for k in want if got.get(k) != want[k]]
    if bad:
        raise RuntimeError("%s: %d tensors differ from what was saved (first: %s)" % (what, len(bad), bad[0]))


def overhead(torch, ct, ckptd_mod, args):
    """The binding's cost, measured on small tensors (16 fp32 each), so that
    what is timed is the call and not a copy.  For each count n:
      call_ms        async_save's call (flatten, torch introspection,
                     ctypes calls, ckpt_save_commit, hand-off of the
                     futures), median and min over the repetitions; each
                     call starts once the last save's thread is idle (a
                     trainer saves every few seconds at most);
      prepare_ms     ckptd.torch's _prepare alone (flatten to names, each
                     tensor's dtype, device, layout, pointer; the metadata
                     JSON): the Python side;
      add_ms         handing the n tensors to libckpt (_engine._add_tensors:
                     packing the array of structs and one
                     ckpt_save_add_tensors call) in a save begun and then
                     freed, the reuse of the last save's array turned off
                     (what a save whose tensors changed pays): the ctypes
                     side.  The whole call (call_ms) saves the same tensors
                     each time, as a trainer does, and so reuses it.
    Beside them: one bare ctypes call (ckpt_dtype_size) in ns."""
    from ckptd import _engine, _lib, _client
    import ctypes

    lib = _lib.lib
    root = args.dir
    client = _client.get(0, 1, root)
    out = {"sizes": {}}

    def idle():
        # Every thread that completes futures is waiting for the next save.
        import threading

        end = now() + 30
        while now() < end:
            if _engine._waiters.idle == sum(1 for t in threading.enumerate() if t.name == "ckptd-save"):
                return
            time.sleep(0.001)

    k = 0
    for n, reps in OVERHEAD_SIZES:
        sd = {"layer.%06d.weight" % i: torch.ones(16) for i in range(n)}
        calls, preps, adds = [], [], []
        for rep in range(reps + 1):  # the first is warm-up
            k += 1
            path = os.path.join(root, "pyovh-%d-%d" % (os.getpid(), k))
            # The parts first, with nothing else running in this process.
            idle()
            t2 = time.perf_counter()
            items, blobs, keep = ct._prepare(sd, 0, 1, False)
            t3 = time.perf_counter()
            opts = _lib.SaveOpts()
            opts.size = ctypes.sizeof(_lib.SaveOpts)
            opts.root = root.encode()
            opts.name = b"pyovh-unused"
            h = ctypes.c_void_p()
            if lib.ckpt_save_begin_opts(client.handle, ctypes.byref(opts), ctypes.byref(h)) < 0:
                raise RuntimeError("ckpt_save_begin_opts: %s" % _lib.last_error())
            _engine._last_pack = None
            t4 = time.perf_counter()
            _engine._add_tensors(h.value, items)
            t5 = time.perf_counter()
            lib.ckpt_save_free(h.value)
            del items, blobs, keep
            # Then the whole call.
            time.sleep(0.02)
            t0 = time.perf_counter()
            resp = ct.async_save(sd, checkpoint_id=path)
            t1 = time.perf_counter()
            resp.upload_completion.result(timeout=args.timeout)
            shutil.rmtree(path, ignore_errors=True)
            if rep:
                calls.append((t1 - t0) * 1e3)
                preps.append((t3 - t2) * 1e3)
                adds.append((t5 - t4) * 1e3)
        del sd
        out["sizes"][str(n)] = {"tensors": n, "reps": reps,
                                "call_ms": common_median(calls), "call_ms_min": min(calls),
                                "call_ms_max": max(calls), "prepare_ms": common_median(preps),
                                "add_ms": common_median(adds)}
    f = lib.ckpt_dtype_size
    reps = 20000
    t0 = time.perf_counter()
    for _ in range(reps):
        f(11)
    out["ctypes_call_ns"] = (time.perf_counter() - t0) / reps * 1e9
    s1, sn = out["sizes"]["1"], out["sizes"][str(OVERHEAD_SIZES[-1][0])]
    dn = OVERHEAD_SIZES[-1][0] - 1
    out["per_tensor_us"] = (sn["call_ms"] - s1["call_ms"]) * 1e3 / dn
    out["per_tensor_prepare_us"] = (sn["prepare_ms"] - s1["prepare_ms"]) * 1e3 / dn
    out["per_tensor_add_us"] = (sn["add_ms"] - s1["add_ms"]) * 1e3 / dn
    out["per_call_ms"] = s1["call_ms"]
    return out


def common_median(vals):
    v = sorted(vals)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("save", "load"), required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--arena", type=int, required=True)
    ap.add_argument("--no-dcp", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    threads = common.cpus()
    common.setup_env(threads)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    import ckptd
    import ckptd.torch as ct
    from ckptd import _client

    torch.set_num_threads(threads)
    store = None
    peer = None
    kept = {}
    try:
        store = common.gloo_alone(dist, args.dir, "pyckptd-store-")
        peer = Peer(torch, dist, args)
        peer.setup(args.mode)
        sd = common.make_state(args.bytes, args.tensors)
        ckptd.configure(socket=args.socket, arena_bytes=args.arena)
        t0 = now()
        client = _client.get(0, 1, args.dir)
        connect_ms = (now() - t0) * 1e3
        ready = {"event": "ready", "torch": str(torch.__version__), "python": sys.version.split()[0],
                 "libckpt": ckptd.libckpt_version(), "libckpt_path": ckptd.libckpt_path(),
                 "connect_ms": connect_ms, "arena_bytes": client.arena_bytes, "threads": threads,
                 "no_dcp": peer.no_dcp, "dcp_configs": DCP_CONFIGS if peer.dcp and args.mode == "save" else [],
                 "dcp_settings": peer.desc or None}
        common.emit(ready)
        n = 0
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd == ["quit"]:
                break
            try:
                r = run_cmd(cmd, args, torch, ct, ckptd, peer, sd, kept, n)
            except Exception as e:  # the next command still runs
                common.log(traceback.format_exc(limit=6))
                r = {"error": "%s: %s: %s" % (" ".join(cmd), type(e).__name__, e)}
            n += 1
            r["cmd"] = " ".join(cmd)
            common.emit(r)
    finally:
        for path in kept.values():
            shutil.rmtree(path[0], ignore_errors=True)
        if peer is not None:
            peer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)


def run_cmd(cmd, args, torch, ct, ckptd, peer, sd, kept, n):
    tag = "%d-%d" % (os.getpid(), n)
    if args.mode == "save" and cmd == ["ckptd"]:
        common.mutate(sd, n + 1)
        path = os.path.join(args.dir, "pysave-" + tag)
        t0 = now()
        resp = ct.async_save(sd, checkpoint_id=path)
        t_call = now()
        resp.staging_completion.result(timeout=args.timeout)
        t_staged = now()
        resp.upload_completion.result(timeout=args.timeout)
        t_done = now()
        shutil.rmtree(path)
        return {"call_ms": (t_call - t0) * 1e3, "staged_ms": (t_staged - t0) * 1e3,
                "committed_ms": (t_done - t0) * 1e3, "t_start": t0, "t_end": t_done}
    if args.mode == "save" and len(cmd) == 2 and cmd[0] == "dcp" and cmd[1] in DCP_CONFIGS:
        if peer.dcp is None:
            raise RuntimeError("DCP: %s" % peer.no_dcp)
        common.mutate(sd, n + 1)
        path = os.path.join(args.dir, "pydcp-" + tag)
        t0, t_call, t_staged, t_done = peer.save(sd, path, cmd[1])
        shutil.rmtree(path)
        return {"call_ms": (t_call - t0) * 1e3, "staged_ms": (t_staged - t0) * 1e3,
                "committed_ms": (t_done - t0) * 1e3, "config": cmd[1], "t_start": t0, "t_end": t_done}
    if args.mode == "save" and cmd == ["overhead"]:
        return overhead(torch, ct, ckptd, args)
    if args.mode == "load" and cmd == ["keep_ckptd"]:
        path = os.path.join(args.dir, "pyload-keep-%d" % os.getpid())
        shutil.rmtree(path, ignore_errors=True)
        t0 = now()
        ct.save(sd, checkpoint_id=path)
        t1 = now()
        kept["ckptd"] = (path, crcs(torch, sd))
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        return {"path": path, "files": files, "seconds": t1 - t0}
    if args.mode == "load" and len(cmd) == 2 and cmd[0] == "keep_dcp" and cmd[1].isdigit():
        if peer.dcp is None:
            raise RuntimeError("DCP: %s" % peer.no_dcp)
        t = int(cmd[1])
        path = os.path.join(args.dir, "pyload-dcp-%d-t%d" % (os.getpid(), t))
        shutil.rmtree(path, ignore_errors=True)
        t0 = now()
        peer.dcp.save(sd, checkpoint_id=path,
                      storage_writer=peer.dcp.FileSystemWriter(path, thread_count=t, sync_files=True))
        t1 = now()
        common.fsync_tree(path)
        kept["dcp%d" % t] = (path, crcs(torch, sd))
        return {"path": path, "seconds": t1 - t0, "thread_count": t}
    if args.mode == "load" and (cmd == ["load_ckptd"] or
                                (len(cmd) == 2 and cmd[0] == "load_dcp" and cmd[1].isdigit())):
        key = "ckptd" if cmd[0] == "load_ckptd" else "dcp%s" % cmd[1]
        if key not in kept:
            raise RuntimeError("%s: nothing kept (keep_%s first)" % (cmd[0], key))
        path, want = kept[key]
        # What the load must restore is overwritten first, so a tensor it
        # left out fails the check below.
        for t in sd.values():
            t.fill_(float("nan"))
        files, size = common.drop_tree(path, flush=True)
        t0 = now()
        if key == "ckptd":
            stats = ct.load(sd, checkpoint_id=path)
        else:
            stats = None
            peer.dcp.load(sd, checkpoint_id=path, storage_reader=peer.dcp.FileSystemReader(path))
        t1 = now()
        check(torch, sd, want, " ".join(cmd))
        return {"seconds": t1 - t0, "ms": (t1 - t0) * 1e3, "stats": stats, "drop": {"files": files, "bytes": size},
                "verify_s": now() - t1, "t_start": t0, "t_end": t1}
    raise RuntimeError("unknown command for --mode %s (save: ckptd, dcp CONFIG, overhead; load: keep_ckptd, "
                       "keep_dcp N, load_ckptd, load_dcp N; quit)" % args.mode)


if __name__ == "__main__":
    main()
