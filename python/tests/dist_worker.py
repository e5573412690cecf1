# SPDX-License-Identifier: MIT
"""One rank of a multi-process test of test_dist.py:

    python dist_worker.py SCENARIO RANK WORLD PORT WORKDIR [ARG...]

joins a gloo group on 127.0.0.1:PORT, runs SCENARIO and exits 0, or
prints why it failed and exits 1.  Every rank records each call into
torch.distributed (a Python function of the package, or a method of its
C classes) made by a thread other than the main one; a scenario fails if
there was any (ranks must meet through ckptd's commit only).
"""
import datetime
import json
import os
import sys
import threading
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard, distribute_tensor)

import ckptd
import ckptd.torch as ct

SCENARIO, RANK, WORLD, PORT, WORK = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                     sys.argv[4], sys.argv[5])
ARGS = sys.argv[6:]
ROOT = os.environ["DIST_ROOT"]  # the test ckptd's root

# ---- the thread guard ----

_MAIN = threading.main_thread()
_bad = []            # (thread name, what) of calls from other threads
_main_calls = [0]    # collectives called from the main thread (the patch works)
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
                "all_to_all", "all_to_all_single", "barrier", "broadcast",
                "broadcast_object_list", "gather", "gather_object", "reduce",
                "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
                "send", "recv", "isend", "irecv", "batch_isend_irecv", "monitored_barrier",
                "new_group")


def _wrap(name, fn):
    def guarded(*a, **kw):
        if threading.current_thread() is not _MAIN:
            _bad.append((threading.current_thread().name, "dist." + name))
        else:
            _main_calls[0] += 1
        return fn(*a, **kw)
    guarded._ckptd_guard = True  # (torch's own wrappers set __wrapped__)
    return guarded


def _profile(frame, event, arg):
    # Runs in threads started after install (ckptd's save threads among
    # them): any Python function of torch.distributed, and any C function
    # of its extension module, called there is recorded.
    if event == "call":
        f = frame.f_code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in f:
            _bad.append((threading.current_thread().name, "%s:%s" % (f, frame.f_code.co_name)))
    elif event == "c_call":
        mod = getattr(arg, "__module__", None) or ""
        qual = getattr(arg, "__qualname__", "") or ""
        self_ = getattr(arg, "__self__", None)
        if "distributed" in mod or "c10d" in mod or (
                self_ is not None and "c10d" in type(self_).__module__):
            _bad.append((threading.current_thread().name, "%s.%s" % (mod, qual)))


def install_guard():
    import torch.distributed.distributed_c10d as c10d
    for n in _COLLECTIVES:
        for mod in (dist, c10d):
            fn = getattr(mod, n, None)
            if fn is not None and not getattr(fn, "_ckptd_guard", False):
                setattr(mod, n, _wrap(n, fn))
    threading.setprofile(_profile)


def self_check_guard():
    """The guard sees a thread's calls: a Python function of the package
    and a method of its C process group, from a thread started now."""
    pg = dist.distributed_c10d._get_default_group()
    t = threading.Thread(target=lambda: (dist.get_world_size(), pg.rank()), name="probe")
    t.start()
    t.join()
    seen = [w for th, w in _bad if th == "probe"]
    if not any("distributed_c10d.py:get_world_size" in w for w in seen) or not any(
            w.startswith("torch._C.") and w.endswith(".rank") for w in seen):
        raise AssertionError("the thread guard missed a probe's calls: %s" % seen)
    del _bad[:]


def check_guard():
    if _bad:
        raise AssertionError("torch.distributed called from a non-main thread: %s"
                             % sorted(set(_bad))[:10])
    print("GUARD ok main_calls=%d" % _main_calls[0], flush=True)


# ---- helpers ----

def full_of(state):
    """name -> full tensor of every tensor leaf (DTensors gathered, a
    collective, here in the main thread)."""
    out = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk("%s%s." % (prefix, k), x)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk("%s%d." % (prefix, i), x)
        elif isinstance(v, DTensor):
            out[prefix[:-1]] = v.full_tensor().detach().clone()
        elif isinstance(v, torch.Tensor):
            out[prefix[:-1]] = v.detach().clone()
    walk("", state)
    return out


def compare(got, want, what):
    if set(got) != set(want):
        raise AssertionError("%s: names differ: %s vs %s" % (what, sorted(got), sorted(want)))
    for k in want:
        a, b = got[k], want[k]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError("%s: '%s' differs: %s %s vs %s %s" % (
                what, k, a.dtype, tuple(a.shape), b.dtype, tuple(b.shape)))
    print("%s: %d tensors equal" % (what, len(want)), flush=True)


def save_full(state, name):
    """The gathered state, saved by rank 0 with torch.save: what loads are
    compared with."""
    full = full_of(state)
    if RANK == 0:
        torch.save(full, os.path.join(WORK, name + ".pt"))
    return full


def load_full(name):
    return torch.load(os.path.join(WORK, name + ".pt"))


def note(obj):
    """Per-rank facts for the parent test (WORK/<scenario>-<rank>.json)."""
    with open(os.path.join(WORK, "%s-%d.json" % (SCENARIO, RANK)), "w") as f:
        json.dump(obj, f)


# ---- FSDP2 model and optimizer ----

def fsdp_model(seed):
    """Dims chosen uneven: 5 rows over 2 ranks are 3+2 and over 3 ranks
    2+2+1; the last layer's single row leaves the other ranks empty."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 7),
                            torch.nn.ReLU(), torch.nn.Linear(7, 1))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed + 100)
    for _ in range(2):
        x = torch.randn(8, 4, generator=g)
        m(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return m, opt, mesh


def extra_dtensors(mesh, seed):
    """DTensors beside the model's: sharded on dimension 1, complex, bf16,
    replicated, and one of 0 elements."""
    g = torch.Generator().manual_seed(seed)
    return {
        "cols": distribute_tensor(torch.randn(3, 5, generator=g), mesh, [Shard(1)]),
        "cplx": distribute_tensor(torch.randn(5, 2, dtype=torch.complex64, generator=g),
                                  mesh, [Shard(0)]),
        "half": distribute_tensor(torch.randn(7, 3, generator=g).to(torch.bfloat16), mesh,
                                  [Shard(0)]),
        "repl": distribute_tensor(torch.randn(4, generator=g), mesh, [Replicate()]),
        "none": distribute_tensor(torch.zeros(0, 3), mesh, [Shard(0)]),
    }


def fsdp_state(m, opt, extra):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(m, opt)
    return {"model": msd, "optim": osd, "extra": extra}


def scn_fsdp_save():
    m, opt, mesh = fsdp_model(0)
    state = fsdp_state(m, opt, extra_dtensors(mesh, 1))
    save_full(state, "fsdp")
    local = {k: (list(v.to_local().shape), [int(x) for x in v.__create_chunk_list__()[0].offsets])
             for k, v in _leaves(state) if isinstance(v, DTensor)}
    note({"local": local})
    ct.save(state, checkpoint_id=os.path.join(ROOT, "fsdp"), step=2)


def _leaves(state, prefix=""):
    if isinstance(state, dict):
        for k, v in state.items():
            yield from _leaves(v, "%s%s." % (prefix, k))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from _leaves(v, "%s%d." % (prefix, i))
    else:
        yield prefix[:-1], state


def scn_fsdp_load():
    from torch.distributed.checkpoint.state_dict import set_state_dict
    m, opt, mesh = fsdp_model(7)  # other values, this world's layout
    state = fsdp_state(m, opt, extra_dtensors(mesh, 8))
    want = load_full("fsdp")
    before = full_of(state)
    changed = [k for k in want if k in before and not torch.equal(before[k], want[k])
               and want[k].numel()]
    if len(changed) < 10:
        raise AssertionError("the destination already holds the saved values: %s" % changed)
    local = {k: (list(v.to_local().shape), [int(x) for x in v.__create_chunk_list__()[0].offsets])
             for k, v in _leaves(state) if isinstance(v, DTensor)}
    note({"local": local})
    ct.load(state, checkpoint_id=os.path.join(ROOT, "fsdp"))
    set_state_dict(m, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    compare(full_of(state), want, "world %d load" % WORLD)
    # What the model and the optimizer hold now, read back from them.
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(m, opt)
    compare(full_of({"model": msd, "optim": osd}),
            {k: v for k, v in want.items() if not k.startswith("extra.")},
            "world %d model and optimizer" % WORLD)


# ---- 2-D meshes ----

PLACEMENTS_2D = {
    "sr": [Shard(0), Replicate()],
    "rs": [Replicate(), Shard(0)],
    "ss": [Shard(0), Shard(1)],
    "rr": [Replicate(), Replicate()],
    "s0s0": [Shard(0), Shard(0)],
}


def tensors_2d(seed):
    """kind -> {"big": 5x6, "t0".."t2": more tensors of that kind, whose
    writers go round the replicas}."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for kind in PLACEMENTS_2D:
        out[kind] = {"big": torch.randn(5, 6, generator=g),
                     "tiny": torch.randn(1, 3, generator=g)}  # empty chunks
        for i in range(3):
            out[kind]["t%d" % i] = torch.randn(4 + i, 3, generator=g)
    return out


def tp_model(seed, mesh2d=None):
    """A model with tensor parallelism over mesh2d's "b" dimension and
    FSDP2 over its "a" dimension (placements _StridedShard+Shard, and
    Shard+Replicate for the row-parallel bias), or, without mesh2d, FSDP2
    alone over all ranks; its AdamW state after one step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5))
    if mesh2d is not None:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        parallelize_module(m, mesh2d["b"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(m, mesh=mesh2d["a"])
    else:
        fully_shard(m, mesh=init_device_mesh("cpu", (WORLD,)))
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    m(torch.randn(3, 6, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()
    msd, osd = get_state_dict(m, opt)
    return m, opt, {"model": msd, "optim": osd}


def scn_mesh2d_save():
    mesh = init_device_mesh("cpu", (2, WORLD // 2), mesh_dim_names=("a", "b"))
    full = tensors_2d(3)
    grid = {kind: {k: distribute_tensor(t, mesh, PLACEMENTS_2D[kind]) for k, t in d.items()}
            for kind, d in full.items()}
    _, _, tp = tp_model(4, mesh)
    state = {"grid": grid, "tp": tp}
    save_full(state, "mesh2d")
    note({"coord": list(mesh.get_coordinate()),
          "placements": {k: [repr(p) for p in v.placements] for k, v in _leaves(state)
                         if isinstance(v, DTensor)}})
    ct.save(state, checkpoint_id=os.path.join(ROOT, "mesh2d"), step=1)


def scn_mesh2d_load():
    """Loads the 2-D checkpoint into a 1-D mesh of this world: the grid
    sharded on dimension 1 (other boxes than the saved ones), the model
    and optimizer with FSDP2 alone."""
    from torch.distributed.checkpoint.state_dict import set_state_dict
    mesh = init_device_mesh("cpu", (WORLD,))
    want = load_full("mesh2d")
    grid = {}
    for name, t in want.items():
        if name.startswith("grid."):
            _, kind, k = name.split(".")
            grid.setdefault(kind, {})[k] = distribute_tensor(torch.full_like(t, -1.0), mesh,
                                                             [Shard(1)])
    m, opt, tp = tp_model(9)
    state = {"grid": grid, "tp": tp}
    ct.load(state, checkpoint_id=os.path.join(ROOT, "mesh2d"))
    set_state_dict(m, opt, model_state_dict=tp["model"], optim_state_dict=tp["optim"])
    compare(full_of(state), want, "2-D checkpoint loaded by world %d" % WORLD)


# ---- plain tensors ----

def plain_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"p%d" % i: torch.randn(3 + i, 2, generator=g) for i in range(8)} | {
        "scalar": torch.tensor(3.5), "ints": torch.arange(10), "step": 4}


def scn_plain_save():
    state = plain_state(5)  # the same on every rank: replicated
    if RANK == 0:
        torch.save(state, os.path.join(WORK, "plain.pt"))
    ct.save(state, checkpoint_id=os.path.join(ROOT, "plain"), step=4)


def scn_plain_load():
    want = torch.load(os.path.join(WORK, "plain.pt"))
    state = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0)
             for k, v in want.items()}
    ct.load(state, checkpoint_id=os.path.join(ROOT, "plain"))
    if state["step"] != 4:
        raise AssertionError("step is %r" % state["step"])
    compare({k: v for k, v in state.items() if k != "step"},
            {k: v for k, v in want.items() if k != "step"}, "plain, rank %d" % RANK)


# ---- Partial ----

def scn_partial():
    from ckptd import _client
    mesh = init_device_mesh("cpu", (WORLD,))
    part = DTensor.from_local(torch.full((4,), float(RANK + 1)), mesh, [Partial()])
    good = {"w": distribute_tensor(torch.arange(6.0), mesh, [Shard(0)])}
    for cid in ("partial-first", "partial-again"):
        if cid == "partial-again":
            ct.save(good, checkpoint_id=os.path.join(ROOT, "good"), step=1)
        try:
            ct.async_save({"w": good["w"], "p": part}, checkpoint_id=os.path.join(ROOT, cid))
        except TypeError as e:
            msg = str(e)
            if "'p'" not in msg or "Partial" not in msg:
                raise AssertionError("the error does not name the tensor and Partial: %s" % msg)
            print("refused: %s" % msg, flush=True)
        else:
            raise AssertionError("a Partial DTensor was saved")
        if cid == "partial-first" and _client._clients:
            raise AssertionError("ckptd was contacted before the refusal")
        if os.path.exists(os.path.join(ROOT, cid)):
            raise AssertionError("%s exists" % cid)
    # Copies outside a DTensor's own mesh (here a 1-rank submesh per rank,
    # as DDP over tensor-parallel groups makes) are not known as copies:
    # each rank writes its chunk, and ckptd refuses the overlap.
    sub = init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("dp", "tp"))["tp"]
    r = ct.async_save({"o": distribute_tensor(torch.arange(4.0), sub, [Shard(0)])},
                      checkpoint_id=os.path.join(ROOT, "overlap"))
    try:
        r.upload_completion.result(timeout=120)
    except ckptd.SaveError as e:
        print("overlap refused: %s" % e, flush=True)
    else:
        raise AssertionError("overlapping chunks were committed")
    dst = {"w": distribute_tensor(torch.zeros(6), mesh, [Shard(0)])}
    ct.load(dst, checkpoint_id=os.path.join(ROOT, "good"))
    compare(full_of(dst), {"w": torch.arange(6.0)}, "earlier checkpoint")
    dst_p = {"w": DTensor.from_local(torch.zeros(6), mesh, [Partial()])}
    try:
        ct.load(dst_p, checkpoint_id=os.path.join(ROOT, "good"))
    except TypeError as e:
        print("load refused: %s" % e, flush=True)
    else:
        raise AssertionError("a load into a Partial DTensor was accepted")


# ---- all_reduce with saves in flight ----

def scn_allreduce():
    """A loop of collectives (all_reduce every step, a broadcast and an
    all_gather now and then) while async saves, one every few steps, are
    in flight: no hang, and every save commits."""
    steps, every = int(ARGS[0]), int(ARGS[1])
    mesh = init_device_mesh("cpu", (WORLD,))
    N = 1 << 18
    w = distribute_tensor(torch.zeros(N), mesh, [Shard(0)])
    bias = torch.zeros(1 << 12)
    inflight = []
    saved = []
    in_flight_at = [0]  # saves not committed yet, summed over the all_reduce calls
    for step in range(1, steps + 1):
        x = torch.full((1 << 10,), float(RANK + step))
        in_flight_at[0] += sum(not r.upload_completion.done() for _, r in inflight)
        dist.all_reduce(x)
        expect = sum(r + step for r in range(WORLD))
        if not torch.all(x == expect):
            raise AssertionError("all_reduce at step %d gave %s" % (step, x[0].item()))
        if step % 3 == 0:
            b = torch.tensor([step if RANK == 0 else -1])
            dist.broadcast(b, 0)
            got = [torch.zeros(1, dtype=torch.int64) for _ in range(WORLD)]
            dist.all_gather(got, torch.tensor([RANK]))
            if b.item() != step or [g.item() for g in got] != list(range(WORLD)):
                raise AssertionError("broadcast/all_gather at step %d" % step)
        # The "training": both tensors change every step, once the last
        # save has staged them (as with DCP's staging future).
        if inflight:
            inflight[-1][1].staging_completion.result(timeout=120)
        w.to_local().add_(1.0)
        bias.add_(2.0)
        if step % every == 0:
            r = ct.async_save({"w": w, "bias": bias, "step": step},
                              checkpoint_id=os.path.join(ROOT, "s%04d" % step), step=step)
            inflight.append((step, r))
            saved.append(step)
        # Waited for a few steps later, not at once: saves overlap the
        # collectives of the next steps.
        while len(inflight) > 2:
            inflight.pop(0)[1].upload_completion.result(timeout=120)
    for _, r in inflight:
        r.upload_completion.result(timeout=120)
    print("uncommitted saves met by all_reduce calls: %d" % in_flight_at[0], flush=True)
    dist.barrier()
    last = ckptd.latest(ROOT)
    if last != os.path.join(ROOT, "s%04d" % saved[-1]):
        raise AssertionError("latest is %s" % last)
    if [c.step for c in ckptd.list(ROOT)] != saved:
        raise AssertionError("committed: %s, saved %s" % ([c.step for c in ckptd.list(ROOT)],
                                                          saved))
    for step in saved:  # each save holds its step's values
        dst = {"w": distribute_tensor(torch.zeros(N), mesh, [Shard(0)]),
               "bias": torch.zeros(1 << 12), "step": 0}
        ct.load(dst, checkpoint_id=os.path.join(ROOT, "s%04d" % step))
        if dst["step"] != step:
            raise AssertionError("step %r" % dst["step"])
        compare(full_of(dst), {"w": torch.full((N,), float(step)),
                               "bias": torch.full((1 << 12,), 2.0 * step)},
                "save of step %d" % step)


def main():
    install_guard()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + PORT, rank=RANK,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    try:
        self_check_guard()
        globals()["scn_" + SCENARIO]()
        check_guard()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
