# SPDX-License-Identifier: MIT
"""train-overhead's trainer: a CPU training loop run for a fixed number of
steps without saves, with ckptd.torch saves every K steps, and with DCP
async saves every K steps.

  python train.py --dir DIR --socket S --steps N --every K --width W
                  --layers L [--trainable T] [--batch B] [--no-dcp]
                  [--timeout S]

Run by bench/run.py with the bench environment's python, PYTHONPATH=python
and CKPTD_LIBCKPT=$BUILD/libckpt.so.  The model is L Linear(W, W) layers
with ReLU between them, of which the last T are trained (the others are
frozen: a head fine-tuned on a deeper model) with torch.optim.Adam (fused
where this torch has it for the CPU, lr 1e-5) on one fixed random batch
with an MSE loss, on every CPU this process may use (torch's intra-op
threads).  What a save saves is the model's and the optimizer's state, as
torch.distributed.checkpoint.state_dict.get_state_dict gives it (every
layer's weight and bias; Adam's step, exp_avg and exp_avg_sq of the trained
ones), taken once after the first step: its tensors are updated in place by
every later step, so the same dict is saved every time.

Why frozen layers: on a CPU a step and staging are both bound by memory
traffic, and training a layer moves more bytes per step (its weights read
three times, its gradient written, Adam's one pass over four arrays) than
staging its share of the state (a read and a write of weight and moments):
with every layer trained, the shortest step (batch 1) took ~3x as long as
staging.  A frozen layer costs a step one read of its weights and staging
two passes, so a model of mostly frozen layers makes a step about as long
as a save stages, as the benchmark asks.

The batch size is chosen before anything is timed so that a step takes
about as long as ckptd stages the state (BENCH.md, issue 31): a few steps
are timed at each candidate size and the one whose median step is nearest
to the median staged time of a few ckptd saves (log scale) is kept
(--batch B fixes it instead).  Everything measured for the choice is in the
ready line.

Then it prints {"event": "ready", ...} and runs commands from stdin:

  run none|ckptd|dcp   N steps; with ckptd or dcp, a save after the
                       optimizer step of every K-th step before the last
                       (steps K, 2K, ... < N).  The loop does what DCP's
                       documentation asks of a trainer, for both: before
                       the optimizer step that follows a save (it changes
                       the saved tensors), wait for that save's staging;
                       before a save, wait for the previous one's upload.
                       {"seconds": the N steps, "step_ms" (median), the
                       time blocked in the save calls, in staging waits and
                       in upload waits, "drain_ms": after the last step,
                       until the last save is committed (not in
                       "seconds")}.  Saves are removed after the answer's
                       figures are taken.
  quit

bench/run.py starts two of these: one with --no-dcp for the runs without
saves and with ckptd's, and one (--batch of the first's choice) for DCP's,
each stopped while the other runs, so that DCP's checkpoint process and
stager never share the loop's CPUs with the other runs.

DCP runs with the settings save-2g found best on this kind of machine and
py-save-2g measures among others: the process executor, one cached
shared-memory DefaultStager with async staging, FileSystemWriter
(thread_count=DCP_THREADS, sync_files=True).
"""
import argparse
import os
import shutil
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DCP_THREADS = 2
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def now():
    return time.monotonic()


def median(vals):
    v = sorted(vals)
    n = len(v)
    if not n:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


class Trainer:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        nn = torch.nn
        g = torch.Generator().manual_seed(31)
        layers = []
        for i in range(args.layers):
            lin = nn.Linear(args.width, args.width)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(args.width, args.width, generator=g) / args.width ** 0.5)
                lin.bias.zero_()
            layers.append(lin)
            if i + 1 < args.layers:
                layers.append(nn.ReLU())
        self.model = nn.Sequential(*layers)
        trained = args.trainable or args.layers
        for lin in [m for m in self.model if isinstance(m, nn.Linear)][:args.layers - trained]:
            for p in lin.parameters():
                p.requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        # The fused implementation where this torch has it for the CPU (2.4
        # and later): one pass over each parameter's four arrays, so that a
        # step can be about as short as staging the state (the default,
        # foreach, makes several passes: its step alone took ~3x as long).
        try:
            self.opt = torch.optim.Adam(params, lr=1e-5, fused=True)
            self.opt_desc = "Adam(fused=True)"
        except (RuntimeError, TypeError, ValueError):
            self.opt = torch.optim.Adam(params, lr=1e-5)
            self.opt_desc = "Adam (torch's default implementation: no fused CPU Adam in this torch)"
        self.gen = g
        self.batch = None
        self.x = self.y = None

    def set_batch(self, b):
        self.batch = b
        self.x = self.torch.randn(b, self.args.width, generator=self.gen)
        self.y = self.torch.randn(b, self.args.width, generator=self.gen)

    def forward_backward(self):
        self.opt.zero_grad(set_to_none=False)
        loss = self.torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()

    def step(self):
        self.forward_backward()
        self.opt.step()


def state_dict_of(trainer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(trainer.model, trainer.opt)
    return {"model": msd, "optim": osd}


def tensor_bytes(sd):
    import torch

    n = 0
    stack = [sd]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, torch.Tensor):
            n += v.numel() * v.element_size()
    return n


class Savers:
    """The two ways of saving, with the same call shape: start(sd, path)
    -> (staging future or None, upload future)."""

    def __init__(self, torch, args):
        import ckptd
        import ckptd.torch as ct

        self.ct = ct
        self.dcp = None
        self.no_dcp = None
        self.kwargs = {}
        self.stager = None
        self.ape = None
        self.desc = None
        ckptd.configure(socket=args.socket)
        if args.no_dcp:
            self.no_dcp = "left out (--no-dcp)"
            return
        try:
            import inspect

            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint import staging
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
            import torch.distributed.checkpoint._async_process_executor as ape
        except ImportError as e:
            self.no_dcp = "torch %s lacks what DCP async saves need here (%s)" % (torch.__version__, e)
            return
        params = inspect.signature(dcp.async_save).parameters
        if "async_stager" not in params or "async_checkpointer_type" not in params:
            self.no_dcp = "torch %s: dcp.async_save has no async_stager/async_checkpointer_type" % torch.__version__
            return
        if hasattr(ape, "_get_fq_hostname"):
            ape._get_fq_hostname = lambda: "127.0.0.1"
        self.ape = ape
        self.dcp = dcp
        self.kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
        self.stager = staging.DefaultStager(staging.StagingOptions(
            use_pinned_memory=False, use_shared_memory=True, use_async_staging=True, use_non_blocking_copy=False))
        self.desc = ("process executor, DefaultStager(shared memory, async staging, cached), "
                     "FileSystemWriter(thread_count=%d, sync_files=True)" % DCP_THREADS)

    def start(self, kind, sd, path, step):
        if kind == "ckptd":
            r = self.ct.async_save(sd, checkpoint_id=path, step=step)
            return r.staging_completion, r.upload_completion
        writer = self.dcp.FileSystemWriter(path, thread_count=DCP_THREADS, sync_files=True)
        r = self.dcp.async_save(sd, checkpoint_id=path, storage_writer=writer, async_stager=self.stager,
                                **self.kwargs)
        if hasattr(r, "staging_completion"):
            return r.staging_completion, r.upload_completion
        return None, r

    def close(self):
        if self.stager is not None:
            self.stager.close()
        ape = self.ape
        if ape is not None and getattr(ape, "_CHECKPOINT_PROCESS", None) is not None:
            proc, ape._CHECKPOINT_PROCESS = ape._CHECKPOINT_PROCESS, None
            proc.__del__()


def run(kind, trainer, savers, sd, args, tag):
    """One timed loop; returns its figures."""
    n, k = args.steps, args.every
    steps = []
    call_s = stage_wait_s = upload_wait_s = 0.0
    staging = upload = None
    paths = []
    t0 = now()
    for i in range(1, n + 1):
        ts = now()
        trainer.forward_backward()
        if staging is not None:
            tw = now()
            staging.result(timeout=args.timeout)
            stage_wait_s += now() - tw
            staging = None
        trainer.opt.step()
        if kind != "none" and i % k == 0 and i < n:
            if upload is not None:
                tw = now()
                upload.result(timeout=args.timeout)
                upload_wait_s += now() - tw
            path = os.path.join(args.dir, "train-%s-%s-%d" % (kind, tag, i))
            paths.append(path)
            tc = now()
            staging, upload = savers.start(kind, sd, path, i)
            call_s += now() - tc
        steps.append(now() - ts)
    seconds = now() - t0
    td = now()
    if staging is not None:
        staging.result(timeout=args.timeout)
    if upload is not None:
        upload.result(timeout=args.timeout)
    drain = now() - td
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    # Where the time went: the median step at each offset from a save (0:
    # the step right after one; k - 1: the step that ends with one), the
    # same offsets in a run without saves.
    # (steps[j] is step j + 1: the saves follow steps[k - 1], steps[2k - 1]...)
    by_offset = [median(steps[j::k]) * 1e3 for j in range(k)]
    return {"seconds": seconds, "steps": n, "saves": len(paths), "step_ms": median(steps) * 1e3,
            "step_ms_by_offset": [round(x, 2) for x in by_offset],
            "step_ms_max": max(steps) * 1e3, "call_ms_total": call_s * 1e3,
            "staging_wait_ms_total": stage_wait_s * 1e3, "upload_wait_ms_total": upload_wait_s * 1e3,
            "drain_ms": drain * 1e3, "t_start": t0, "t_end": t0 + seconds}


def calibrate(torch, trainer, savers, sd, args):
    """The batch size whose step takes about as long as ckptd stages sd."""
    staged = []
    for i in range(4):
        path = os.path.join(args.dir, "train-calibrate-%d-%d" % (os.getpid(), i))
        t0 = now()
        st, up = savers.start("ckptd", sd, path, 0)
        st.result(timeout=args.timeout)
        staged.append((now() - t0) * 1e3)
        up.result(timeout=args.timeout)
        shutil.rmtree(path, ignore_errors=True)
    staged_ms = median(staged[1:])  # the first connects and warms up
    tried = {}
    if args.batch:
        trainer.set_batch(args.batch)
        trainer.step()
        return staged_ms, {}, args.batch
    import math

    best = None
    for b in BATCHES:
        trainer.set_batch(b)
        trainer.step()
        trainer.step()
        ts = []
        for _ in range(9):
            t = now()
            trainer.step()
            ts.append((now() - t) * 1e3)
        tried[str(b)] = median(ts)
        dist = abs(math.log(tried[str(b)] / staged_ms))
        if best is None or dist < best[0]:
            best = (dist, b)
        if tried[str(b)] > 2 * staged_ms:
            break  # larger batches only take longer
    trainer.set_batch(best[1])
    return staged_ms, tried, best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--trainable", type=int, default=0, help="layers trained, the last ones (0: all)")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--arena", type=int, default=0, help="ckptd arena bytes (0: the state's size and 64 MiB)")
    ap.add_argument("--no-dcp", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    if args.every < 1 or args.steps <= args.every:
        sys.exit("train.py: need steps > every >= 1")
    if not 0 <= args.trainable <= args.layers:
        sys.exit("train.py: need 0 <= trainable <= layers")
    threads = common.cpus()
    common.setup_env(threads)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    import ckptd

    torch.set_num_threads(threads)
    store = None
    savers = None
    try:
        store = common.gloo_alone(dist, args.dir, "train-store-")
        trainer = Trainer(torch, args)
        trainer.set_batch(1)
        trainer.step()  # Adam's state exists from the first step on
        sd = state_dict_of(trainer)
        nbytes = tensor_bytes(sd)
        ckptd.configure(arena_bytes=args.arena or nbytes + (64 << 20))
        savers = Savers(torch, args)
        staged_ms, tried, batch = calibrate(torch, trainer, savers, sd, args)
        from ckptd import _client

        arena = _client.get(0, 1, args.dir).arena_bytes
        common.emit({"event": "ready", "torch": str(torch.__version__), "threads": threads,
                     "state_bytes": nbytes, "arena_bytes": arena, "params": sum(p.numel() for p in trainer.model.parameters()),
                     "width": args.width, "layers": args.layers, "trainable": args.trainable or args.layers,
                     "batch": batch, "optimizer": trainer.opt_desc,
                     "calibration": {"ckptd_staged_ms": staged_ms, "step_ms_by_batch": tried},
                     "steps": args.steps, "every": args.every, "no_dcp": savers.no_dcp,
                     "dcp_settings": savers.desc, "libckpt": ckptd.libckpt_version()})
        n = 0
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd == ["quit"]:
                break
            try:
                if len(cmd) != 2 or cmd[0] != "run" or cmd[1] not in ("none", "ckptd", "dcp"):
                    raise RuntimeError("unknown command (run none|ckptd|dcp, quit)")
                if cmd[1] == "dcp" and savers.dcp is None:
                    raise RuntimeError("DCP: %s" % savers.no_dcp)
                r = run(cmd[1], trainer, savers, sd, args, "%d-%d" % (os.getpid(), n))
            except Exception as e:
                common.log(traceback.format_exc(limit=6))
                r = {"error": "%s: %s: %s" % (line.strip(), type(e).__name__, e)}
            n += 1
            r["cmd"] = line.strip()
            common.emit(r)
    finally:
        if savers is not None:
            savers.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
