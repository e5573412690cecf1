# SPDX-License-Identifier: MIT
"""Data-loader state (ckptd.data) and RNG state (ckptd.rng): exact resume of
a torchdata StatefulDataLoader, the reasons a naive recipe is not exact, and
ShardSampler's progress table dealt to other DP worlds by libckpt.

Several ranks of one job are simulated in one process: each is a libckpt
client of its own (rank, world), as ckptd.torch would make for a rank of a
process group; the checkpoint commits once every rank of the world saved.
"""
import gc
import itertools
import random

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import ckptd
import ckptd.data
import ckptd.rng
import ckptd.torch
from ckptd import _client
from ckptd.data import LoaderState, ShardSampler, ShardTable

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


# ---- helpers ----

class Ranks:
    """Saves and loads as rank r of a world of w, in this one process."""

    def __init__(self, monkeypatch, root):
        self.mp = monkeypatch
        self.root = root

    def use(self, rank, world):
        self.mp.setattr(ckptd.torch, "_rank_world",
                        lambda process_group=None, no_dist=False: (rank, world))

    def save_all(self, name, states, step=0):
        """states[r] is rank r's state; all ranks save `name`."""
        world = len(states)
        futs = []
        for r, st in enumerate(states):
            self.use(r, world)
            futs.append(ckptd.torch.async_save(st, checkpoint_id="%s/%s" % (self.root, name),
                                               step=step))
        for f in futs:
            f.upload_completion.result(timeout=120)
        return "%s/%s" % (self.root, name)

    def load(self, rank, world, name, state, **kw):
        self.use(rank, world)
        return ckptd.torch.load(state, checkpoint_id="%s/%s" % (self.root, name), **kw)


@pytest.fixture
def ranks(daemon, monkeypatch):
    saved = dict(_client._settings)
    # Many small clients: small arenas; one job per world size.
    ckptd.configure(arena_bytes="8M")
    yield Ranks(monkeypatch, daemon.root)
    _client._settings.clear()
    _client._settings.update(saved)


class Noisy(torch.utils.data.Dataset):
    """x[i] plus noise drawn where the sample is made (a worker, or the
    main process): a random transform."""

    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)]), torch.rand(1)


def stream(loader):
    """Batches of loader, epoch after epoch, with a draw of the main
    process's torch RNG after each (as dropout would)."""
    while True:
        for idx, noise in loader:
            yield idx.view(-1).tolist(), noise.view(-1).tolist(), torch.rand(1).item()


def make_loader(num_workers, wrap=True, seed=0):
    torch.manual_seed(seed)
    ds = Noisy()
    if wrap:
        ds = ckptd.data.worker_rng(ds)
    kw = {"prefetch_factor": 2} if num_workers else {}
    return StatefulDataLoader(ds, batch_size=3, shuffle=True, num_workers=num_workers, **kw)


def drop(*loaders):
    """Stops the loaders' workers now rather than at some later collection
    (a worker forked meanwhile would inherit the parent's iterators)."""
    for ld in loaders:
        if hasattr(ld, "_iterator"):
            ld._iterator = None
    gc.collect()


# ---- StatefulDataLoader: exact resume ----

@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_resume_exact(daemon, num_workers):
    """Saved at several steps (mid-epoch, at an epoch's end, right after a
    resume) and resumed in a new loader each time: indices, worker-side
    noise and the main process's draws equal the uninterrupted run's."""
    n = 34  # 14 batches an epoch: the run crosses two epoch ends
    ref_loader = make_loader(num_workers)
    ref = list(itertools.islice(stream(ref_loader), n))
    drop(ref_loader)
    stops = [5, 14, 14, 23]  # 14: the last batch of epoch 1, and again at once
    got = []
    loader = make_loader(num_workers)
    it = stream(loader)
    for j, s in enumerate(stops):
        while len(got) < s:
            got.append(next(it))
        state = {"data": LoaderState(loader), "rng": ckptd.rng.RNGState()}
        cid = "%s/l%d" % (daemon.root, j)
        ckptd.torch.save(state, checkpoint_id=cid, step=s)
        del it
        drop(loader)
        torch.manual_seed(1234)  # the new process's RNG is not the old one's
        random.seed(99)
        loader = make_loader(num_workers, seed=5)
        state = {"data": LoaderState(loader), "rng": ckptd.rng.RNGState()}
        ckptd.torch.load(state, checkpoint_id=cid)
        assert state["data"].restored
        it = stream(loader)
    while len(got) < n:
        got.append(next(it))
    del it
    drop(loader)
    assert [g[0] for g in got] == [r[0] for r in ref], "batch indices differ"
    assert [g[1] for g in got] == [r[1] for r in ref], "worker-side draws differ"
    assert [g[2] for g in got] == [r[2] for r in ref], "main-process draws differ"


def test_naive_recipe_causes(daemon):
    """The two causes of the naive recipe's drift, shown on their own:
    (1) building the resumed iterator draws from the global torch RNG after
    it was restored; (2) a worker's RNG is not in the loader state, so a
    resumed worker repeats the draws of the epoch's start."""
    # (1) iter() of a loader without a generator consumes a global draw.
    loader = make_loader(0, wrap=False)
    before = torch.get_rng_state()
    iter(loader)
    if torch.equal(before, torch.get_rng_state()):
        pytest.skip("this torch no longer draws a base seed from the global RNG in iter()")
    drop(loader)

    def resumed(wrap, stop=7, n=12, use_state=True):
        loader = make_loader(2, wrap=wrap)
        it = stream(loader)
        head = [next(it) for _ in range(stop)]
        sd = {"data": LoaderState(loader) if use_state else loader, "rng": ckptd.rng.RNGState()}
        cid = "%s/n%d%d" % (daemon.root, wrap, use_state)
        ckptd.torch.save(sd, checkpoint_id=cid)
        del it
        drop(loader)
        loader = make_loader(2, wrap=wrap, seed=3)
        sd = {"data": LoaderState(loader) if use_state else loader, "rng": ckptd.rng.RNGState()}
        ckptd.torch.load(sd, checkpoint_id=cid)
        it = stream(loader)
        tail = [next(it) for _ in range(n - stop)]
        del it
        drop(loader)
        return head + tail

    ref_loader = make_loader(2)
    ref = list(itertools.islice(stream(ref_loader), 12))
    drop(ref_loader)
    naive = resumed(wrap=False, use_state=False)
    assert [g[0] for g in naive] == [r[0] for r in ref]  # the indices were right
    assert [g[2] for g in naive[7:]] != [r[2] for r in ref[7:]]  # cause 1
    assert [g[1] for g in naive[7:]] != [r[1] for r in ref[7:]]  # cause 2
    only_state = resumed(wrap=False)
    assert [g[2] for g in only_state] == [r[2] for r in ref]  # LoaderState fixes 1
    assert [g[1] for g in only_state[7:]] != [r[1] for r in ref[7:]]
    fixed = resumed(wrap=True)
    assert fixed == ref  # worker_rng fixes 2


def test_loader_state_per_rank(ranks):
    """Two ranks whose loaders shuffle differently save one checkpoint; each
    resumes its own order (the loader state is a per-rank value, not a
    tensor ckptd would treat as replicated).  Another world size or another
    num_workers is refused with a clear error."""
    ckptd.configure(job="lw2")
    loaders = [make_loader(0, seed=10 + r) for r in range(2)]
    its = [stream(ld) for ld in loaders]
    for it in its:
        for _ in range(4):
            next(it)
    ranks.save_all("two", [{"data": LoaderState(ld, rank=r, world=2)}
                           for r, ld in enumerate(loaders)])
    want = [[next(it)[0] for _ in range(5)] for it in its]
    assert want[0] != want[1]
    del its
    for r in range(2):
        ld = make_loader(0, seed=50)
        st = {"data": LoaderState(ld, rank=r, world=2)}
        ranks.load(r, 2, "two", st)
        it = stream(ld)
        assert [next(it)[0] for _ in range(5)] == want[r]
        del it
        drop(ld)
    ld = make_loader(0, seed=1)
    with pytest.raises(ValueError, match="same topology"):
        ranks.load(1, 3, "two", {"data": LoaderState(ld, rank=1, world=3)})
    st = {"data": LoaderState(ld, rank=1, world=3, allow_new_topology=True)}
    with pytest.warns(RuntimeWarning, match="afresh"):
        ranks.load(1, 3, "two", st)
    assert st["data"].restored is False
    ld2 = make_loader(2, seed=1)
    with pytest.raises(ValueError, match="workers"):
        ranks.load(0, 2, "two", {"data": LoaderState(ld2, rank=0, world=2)})
    drop(ld, ld2, *loaders)


def test_loader_state_refuses_unsaveable():
    class Odd:
        def state_dict(self):
            return {"x": object()}

        def load_state_dict(self, sd):
            pass
    with pytest.raises(TypeError, match="object at .loader.x"):
        LoaderState(Odd()).state_dict()
    with pytest.raises(TypeError, match="StatefulDataLoader"):
        LoaderState(object())


def test_codec_exact():
    doc = {"a": (1, 2.5, float("nan"), -0.0), "b": {3: b"\x00\xff", "$x": None},
           "t": torch.arange(6, dtype=torch.int16).view(2, 3)[:, 1:],
           "e": torch.empty(0, 2), "n": np.arange(4, dtype=np.float32), "g": np.int64(7)}
    import json
    out = ckptd.data._dec(json.loads(json.dumps(ckptd.data._enc(doc, ""))))
    assert out["a"][:2] == (1, 2.5) and out["a"][2] != out["a"][2]
    assert str(out["a"][3]) == "-0.0" and isinstance(out["a"], tuple)
    assert out["b"] == {3: b"\x00\xff", "$x": None}
    assert torch.equal(out["t"], doc["t"]) and out["t"].dtype == torch.int16
    assert out["e"].shape == (0, 2)
    assert np.array_equal(out["n"], doc["n"]) and out["n"].dtype == np.float32
    assert out["g"] == 7 and type(out["g"]) is int


# ---- RNG ----

def test_rng_roundtrip(daemon):
    torch.manual_seed(3)
    np.random.seed(4)
    random.seed(5)
    np.random.randn()  # a cached gaussian in numpy's state
    st = {"rng": ckptd.rng.RNGState()}
    ckptd.torch.save(st, checkpoint_id=daemon.root + "/rng")
    want = (torch.rand(3).tolist(), np.random.rand(3).tolist(), np.random.randn(),
            [random.random() for _ in range(3)], random.gauss(0, 1))
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    st = {"rng": ckptd.rng.RNGState()}
    ckptd.torch.load(st, checkpoint_id=daemon.root + "/rng")
    got = (torch.rand(3).tolist(), np.random.rand(3).tolist(), np.random.randn(),
           [random.random() for _ in range(3)], random.gauss(0, 1))
    assert got == want
    assert st["rng"].restored_from == 0


def test_rng_per_rank(ranks):
    """Each rank gets its own generators back; another world gets rank 0's
    and is told so."""
    ckptd.configure(job="rng2")
    taken = []
    for r in range(2):  # each simulated rank's RNG, taken when it saves
        torch.manual_seed(100 + r)
        taken.append(_Frozen(ckptd.rng.RNGState(rank=r).state_dict()))
    ranks.save_all("rng", [{"rng": f} for f in taken])
    for r in range(2):
        torch.manual_seed(100 + r)
        want = torch.rand(2)
        torch.manual_seed(0)
        st = {"rng": ckptd.rng.RNGState(rank=r)}
        ranks.load(r, 2, "rng", st)
        assert torch.equal(torch.rand(2), want) and st["rng"].restored_from == r
    st = {"rng": ckptd.rng.RNGState(rank=2)}
    ranks.load(2, 3, "rng", st)
    assert st["rng"].restored_from == 0


class _Frozen:
    """A Stateful whose state was taken earlier."""

    def __init__(self, sd):
        self.sd = sd

    def state_dict(self):
        return self.sd

    def load_state_dict(self, sd):
        self.sd = sd


# ---- ShardSampler and the C table ----

SIZES = [13, 9, 12, 10, 16]  # 60 samples in 5 uneven shards


class Index(torch.utils.data.Dataset):
    def __len__(self):
        return sum(SIZES)

    def __getitem__(self, i):
        return i


def test_sampler_single_rank():
    s = ShardSampler(SIZES, 7, seed=1)
    assert len(s) == 9 and s.epoch == 0
    e0 = [i for b in s.track(s) for i in b]
    assert sorted(e0) == list(range(60)) and e0 != list(range(60))
    assert s.epoch == 1
    e1 = [i for b in s.track(s) for i in b]
    assert sorted(e1) == list(range(60)) and e1 != e0
    # The order is a function of (seed, epoch): another sampler agrees.
    t = ShardSampler(SIZES, 7, seed=1)
    assert [i for b in t.track(t) for i in b] == e0
    # drop_last: 60 = 8 x 7 + 4, the 4 are dropped and the epoch still ends.
    d = ShardSampler(SIZES, 7, seed=1, drop_last=True)
    assert len(d) == 8
    assert sum(len(b) for b in d.track(d)) == 56 and d.epoch == 1
    # Without shuffle: shards by id, samples in order.
    q = ShardSampler(SIZES, 60, shuffle=False)
    assert next(iter(q)) == list(range(60))
    # Only batches taken count: a new pass starts after them, whatever an
    # earlier pass had handed out (prefetched) beyond them.
    p = ShardSampler(SIZES, 5, seed=2)
    it1 = iter(p)
    head = [next(it1) for _ in range(3)]  # prefetched, none taken
    it2 = iter(p)
    assert next(it2) == head[0]
    p.advance(2)  # the loop took two batches of this pass
    assert sum(r[1] for r in p.state_dict()["table"].rows) == 10
    assert next(iter(p)) == head[2]
    for bad in (dict(shard_sizes=[], batch_size=2), dict(shard_sizes=[3, 0], batch_size=2),
                dict(shard_sizes=[3], batch_size=0), dict(shard_sizes=[3], batch_size=2,
                                                           dp_rank=2, dp_world=2)):
        with pytest.raises(ValueError):
            ShardSampler(**bad)


def test_table_validation():
    with pytest.raises(ValueError, match="columns"):
        ShardTable([[0, 0, 0]], k=2, row0=0, n_shards=1)
    with pytest.raises(ValueError, match="done 0 or 1"):
        ShardTable([[0, 0, 2]], k=3, row0=0, n_shards=1)
    with pytest.raises(ValueError, match="outside"):
        ShardTable([[0, 0, 0]], k=3, row0=1, n_shards=1)
    with pytest.raises(ValueError, match="DP rank"):
        ShardTable([], k=3, row0=0, n_shards=1, dp_rank=1, dp_world=1)
    assert ckptd.data.first(7, 3, 1) == ([1, 4], 3)
    assert ckptd.data.split(10, 3) == [4, 3, 3]


def take(sampler, loader, n):
    """The loop takes n batches of loader (built on sampler)."""
    out = []
    for b in itertools.islice(sampler.track(loader), n):
        out.extend(b.tolist() if isinstance(b, torch.Tensor) else b)
    return out


def test_rescale_4_3_6(ranks):
    """4 DP ranks (loaders with 2 workers prefetching) stop mid-epoch; 3 DP
    ranks of 2 TP peers each resume and stop again; 6 DP ranks finish the
    epoch: every sample of it was taken exactly once, TP peers took the
    same batches, and the next epoch covers the data once more."""
    taken = []
    # Phase 1: 4 DP ranks, real DataLoaders with workers that prefetch.
    ckptd.configure(job="dp4")
    samplers = [ShardSampler(SIZES, 3, dp_rank=r, dp_world=4, seed=7) for r in range(4)]
    loaders = [torch.utils.data.DataLoader(Index(), batch_sampler=s, num_workers=2,
                                           prefetch_factor=2) for s in samplers]
    its = [iter(ld) for ld in loaders]
    for s, it, n in zip(samplers, its, (2, 1, 3, 2)):
        taken += take(s, it, n)
    ranks.save_all("p1", [{"data": s} for s in samplers], step=1)
    for s, it in zip(samplers, its):
        taken_after = take(s, it, 1)  # after the save: rolled back by the resume
        assert taken_after
    del its
    drop(*loaders)

    # Phase 2: 3 DP ranks x 2 TP peers (world 6).
    ckptd.configure(job="dp3tp2")
    samplers = {}
    for d in range(3):
        for t in range(2):
            s = ShardSampler(SIZES, 3, dp_rank=d, dp_world=3, replica=t, seed=7)
            ranks.load(d * 2 + t, 6, "p1", {"data": s})
            assert s.same_topology is False
            samplers[d, t] = s
    for d in range(3):
        a, b = samplers[d, 0], samplers[d, 1]
        assert a.shards == b.shards
        ta, tb = take(a, a, 2), take(b, b, 2)
        assert ta == tb, "TP peers of one DP group took different data"
        taken += ta
    ranks.save_all("p2", [{"data": samplers[d, t]} for d in range(3) for t in range(2)],
                   step=2)

    # Phase 3: 6 DP ranks finish epoch 0, then run epoch 1.
    ckptd.configure(job="dp6")
    samplers = [ShardSampler(SIZES, 3, dp_rank=r, dp_world=6, seed=7) for r in range(6)]
    for r, s in enumerate(samplers):
        ranks.load(r, 6, "p2", {"data": s})
    assert sorted(sh for s in samplers for sh in s.shards) == list(range(len(SIZES)))
    assert [len(s.shards) for s in samplers].count(0) == 1  # 5 shards, 6 ranks
    for s in samplers:  # a rank whose shards are all done is already at epoch 1
        if s.epoch == 0:
            taken += take(s, s, 10 ** 6)
    assert sorted(taken) == list(range(sum(SIZES))), "epoch 0: not every sample exactly once"
    epoch1 = []
    for s in samplers:
        assert s.epoch == 1 or not s.shards
        epoch1 += take(s, s, 10 ** 6)
    assert sorted(epoch1) == list(range(sum(SIZES)))

    # The same world gets its rows back as saved (identity).
    ranks.save_all("p3", [{"data": s} for s in samplers], step=3)
    for r in range(6):
        s = ShardSampler(SIZES, 3, dp_rank=r, dp_world=6, seed=7)
        ranks.load(r, 6, "p3", {"data": s})
        assert s.same_topology is True
        assert s.state_dict()["table"].rows == samplers[r].state_dict()["table"].rows


def test_rescale_mixed_epochs(ranks):
    """Rank 1 finished its epoch 0 and is into epoch 1 when the job stops;
    rank 0 is mid-epoch 0.  Resumed on 3 ranks, epoch 0 and then epoch 1
    each cover every sample exactly once (the epoch is per shard)."""
    sizes = [5, 7, 6, 4]
    ckptd.configure(job="mix2")
    seen = {0: [], 1: []}
    s0 = ShardSampler(sizes, 2, dp_rank=0, dp_world=2, seed=3)
    s1 = ShardSampler(sizes, 2, dp_rank=1, dp_world=2, seed=3)
    seen[0] += take(s0, s0, 3)
    seen[0] += take(s1, s1, 10 ** 6)  # rank 1's whole epoch 0
    assert s1.epoch == 1
    seen[1] += take(s1, s1, 2)
    assert s1.epoch == 1
    ranks.save_all("mix", [{"data": s0}, {"data": s1}])
    ckptd.configure(job="mix3")
    for r in range(3):
        s = ShardSampler(sizes, 2, dp_rank=r, dp_world=3, seed=3)
        ranks.load(r, 3, "mix", {"data": s})
        while s.epoch < 2:
            ep = s.epoch
            got = take(s, s, 10 ** 6)
            if not got and ep == s.epoch:
                break
            seen[ep] += got
    assert sorted(seen[0]) == list(range(sum(sizes)))
    assert sorted(seen[1]) == list(range(sum(sizes)))


def test_table_load_errors(ranks):
    ckptd.configure(job="err1")
    s = ShardSampler(SIZES, 4, seed=1)
    take(s, s, 2)
    ranks.save_all("t", [{"data": s}])
    other = ShardSampler([13, 9, 12, 10, 17], 4, seed=1)
    with pytest.raises(ValueError, match="data set changed"):
        ranks.load(0, 1, "t", {"data": other})
    fewer = ShardSampler(SIZES[:4], 4, seed=1)
    with pytest.raises(ckptd.CheckpointError, match="sharding changed"):
        ranks.load(0, 1, "t", {"data": fewer})
    fresh = ShardSampler(SIZES, 4, seed=1)
    with pytest.raises(ckptd.CheckpointError, match="no data-loader table"):
        ranks.load(0, 1, "t", {"other": fresh})
    ranks.load(0, 1, "t", {"other": fresh}, strict=False)
    assert fresh.same_topology is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_rng_cuda(daemon):
    torch.cuda.manual_seed_all(7)
    torch.rand(1, device="cuda")  # CUDA in use: RNGState saves its generators
    st = {"rng": ckptd.rng.RNGState()}
    ckptd.torch.save(st, checkpoint_id=daemon.root + "/rngc")
    want = torch.rand(3, device="cuda").cpu()
    torch.cuda.manual_seed_all(0)
    ckptd.torch.load({"rng": ckptd.rng.RNGState()}, checkpoint_id=daemon.root + "/rngc")
    assert torch.equal(torch.rand(3, device="cuda").cpu(), want)


def test_fresh_optimizer_gets_saved_state(daemon):
    """A fresh Adam has no moments until it steps; load gives it its state
    first, so the saved moments land (they were silently dropped); a load
    that cannot open its checkpoint leaves the optimizer untouched."""
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    ckptd.torch.save({"m": m, "o": opt}, checkpoint_id=daemon.root + "/opt")
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.Adam(m2.parameters(), lr=0.5)
    with pytest.raises(ckptd.CheckpointError):
        ckptd.torch.load({"m": m2, "o": opt2}, checkpoint_id=daemon.root + "/none")
    assert not opt2.state and all(p.grad is None for p in m2.parameters())
    ckptd.torch.load({"m": m2, "o": opt2}, checkpoint_id=daemon.root + "/opt")
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for k in a["state"][i]:
            assert torch.equal(a["state"][i][k], b["state"][i][k])
    assert all(p.grad is None for p in m2.parameters())
