# SPDX-License-Identifier: MIT
"""Data-loader state: exact resume in the same topology, and a sampler whose
progress survives a change of the number of data-parallel ranks.

    LoaderState(loader)
        A torchdata StatefulDataLoader as a Stateful value of the state: its
        state taken in the caller's thread at the save call, saved per rank,
        restored so that the resumed run yields exactly the batches the
        uninterrupted run would have, in order (same world size, same
        num_workers).
    worker_rng(dataset)
        Wraps a dataset so that each loader worker's RNGs (torch, numpy,
        random) travel with the loader state: random transforms done in
        workers resume where they were instead of at the epoch's seed.
    ShardSampler(shard_sizes, batch_size, dp_rank=, dp_world=, replica=)
        A batch sampler over logical shards whose progress (samples the
        training loop consumed, per shard) is saved as libckpt's data-loader
        table; restored with another DP world, the shards are dealt again by
        libckpt's rules and every sample of an epoch is still seen once.
    ShardTable, first(), restore()
        That table: one DP rank's block of rows, a leaf ckptd.torch saves
        with ckpt_save_add_dl_table and loads with ckpt_dl_restore.

Why the naive recipe was not exact (issue 31's trial: two workers, shuffle,
a model with dropout and a random transform).  The batches' indices did
come back in order: torchdata 0.11 snapshots the sampler at the last batch
the loop took, not at the prefetched ones.  What went wrong was randomness:

  1. Creating a DataLoader iterator draws a base seed for its workers from
     the global torch RNG, with num_workers=0 too (unless the loader has a
     generator of its own).  The
     uninterrupted run drew it at the epoch's start, before the save; the
     resumed run restored the RNG and then drew again when it built the
     resumed iterator, so every later torch draw of the main process
     (dropout, noise) was one draw off.  LoaderState builds the resumed
     iterator inside load_state_dict with the global RNG put back
     afterwards, so the iterator costs the stream nothing, whatever order
     the RNG and the loader are restored in.
  2. A worker seeds torch, numpy and random from base_seed + worker id when
     it starts and nothing saves them afterwards; a resumed worker starts
     its streams over, so the transforms of resumed steps got the draws of
     the epoch's first steps.  worker_rng(dataset) makes them part of the
     per-worker state torchdata snapshots with each batch.
  3. In a job of several ranks the loader state holds tensors (the
     shuffle generator's state); ckptd, like DCP, treats plain tensors as
     replicated and writes one rank's copy.  LoaderState saves the whole
     loader state as one per-rank value, so each rank gets its own back.

The state is taken when the save is called, in the calling thread: take it
after the step that consumed the last batch (the usual place, at the end of
the step), never from another thread: the loader's iterator updates its
snapshot and its yielded count in two separate statements, so a state read
from a thread in between resumes one batch off.
"""
import base64
import ctypes
import errno
import hashlib
import json
import random
import sys
import warnings

from . import _lib
from ._errors import CheckpointError, strerror

__all__ = ["LoaderState", "worker_rng", "ShardSampler", "ShardTable", "first", "restore",
           "split", "COL_ID", "COL_CURSOR", "COL_DONE"]

COL_ID = 0
COL_CURSOR = 1
COL_DONE = 2
MIN_COLS = 3
MAX_COLS = 64

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def _torch():
    import torch
    return torch


# ---- the C data-loader table ----

def first(n_shards, dp_world, dp_rank):
    """The first run's deal (ckpt_dl_first): (shard ids of DP rank dp_rank,
    row0 of its block).  Rank r gets r, r + dp_world, r + 2 dp_world, ..."""
    ids_p = ctypes.POINTER(_lib.c_i64)()
    n = _lib.c_u64()
    row0 = _lib.c_u64()
    r = _lib.lib.ckpt_dl_first(n_shards, dp_world, dp_rank, ctypes.byref(ids_p),
                               ctypes.byref(n), ctypes.byref(row0))
    if r < 0:
        raise ValueError(_lib.last_error() or strerror(-r))
    try:
        return [int(x) for x in ids_p[:n.value]], row0.value
    finally:
        _libc.free(ctypes.cast(ids_p, ctypes.c_void_p))


def restore(reader, name, dp_world, dp_rank):
    """Reads table `name` of an open checkpoint (a ckptd._engine.Reader) and
    deals it to DP rank dp_rank of dp_world (ckpt_dl_restore): returns
    (rows, row0, same_topology, n_rows), rows a list of lists of ints.
    Raises CheckpointError (errno ENOENT when the table is missing)."""
    rows_p = ctypes.POINTER(_lib.c_i64)()
    n = _lib.c_u64()
    k = _lib.c_u32()
    row0 = _lib.c_u64()
    same = ctypes.c_bool()
    r = _lib.lib.ckpt_dl_restore(reader.handle, name.encode(), dp_world, dp_rank,
                                 ctypes.byref(rows_p), ctypes.byref(n), ctypes.byref(k),
                                 ctypes.byref(row0), ctypes.byref(same))
    if r < 0:
        raise CheckpointError("checkpoint %s: data-loader table '%s': %s"
                              % (reader.path, name, _lib.last_error() or strerror(-r)), -r)
    try:
        flat = rows_p[:n.value * k.value]
    finally:
        _libc.free(ctypes.cast(rows_p, ctypes.c_void_p))
    kk = k.value
    rows = [list(flat[i * kk:(i + 1) * kk]) for i in range(n.value)]
    info = reader.tensor_info(name)
    n_rows = info[1][0] if info else None
    return rows, row0.value, bool(same.value), n_rows


class ShardTable:
    """One DP rank's block of a data-loader table: rows of k int64 columns
    (COL_ID, COL_CURSOR: samples the loop consumed, COL_DONE, then the
    caller's own), at row0 of a table of n_shards rows.

    A leaf of the state given to ckptd.torch.async_save/load, not a
    Stateful: the save adds it with ckpt_save_add_dl_table (replica 0 of
    each DP group writes; the other TP/PP peers pass their index), the load
    replaces rows/row0 with what ckpt_dl_restore deals this DP rank and sets
    same_topology (True when the checkpoint was saved by dp_world DP ranks:
    per-rank state beside the table is then still this rank's).  The rows
    are copied: later changes to the given lists do not reach a save."""

    __slots__ = ("rows", "k", "row0", "n_shards", "dp_rank", "dp_world", "replica",
                 "same_topology")

    def __init__(self, rows, *, k, row0, n_shards, dp_rank=0, dp_world=1, replica=0):
        for what, v in (("k", k), ("row0", row0), ("n_shards", n_shards),
                        ("dp_rank", dp_rank), ("dp_world", dp_world), ("replica", replica)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TypeError("ShardTable: %s must be an int >= 0, not %r" % (what, v))
        if not MIN_COLS <= k <= MAX_COLS:
            raise ValueError("ShardTable: %d columns (%d..%d)" % (k, MIN_COLS, MAX_COLS))
        if dp_world < 1 or dp_rank >= dp_world:
            raise ValueError("ShardTable: DP rank %d of a DP world of %d" % (dp_rank, dp_world))
        out = []
        for i, r in enumerate(rows):
            r = [int(x) for x in r]
            if len(r) != k:
                raise ValueError("ShardTable: row %d has %d columns, not %d" % (i, len(r), k))
            if r[COL_ID] < 0 or r[COL_CURSOR] < 0 or r[COL_DONE] not in (0, 1):
                raise ValueError("ShardTable: row %d %r: id and cursor must be >= 0, done 0 or 1"
                                 % (i, r))
            out.append(r)
        if row0 + len(out) > n_shards:
            raise ValueError("ShardTable: rows %d..%d are outside a table of %d rows"
                             % (row0, row0 + len(out), n_shards))
        self.rows = out
        self.k = k
        self.row0 = row0
        self.n_shards = n_shards
        self.dp_rank = dp_rank
        self.dp_world = dp_world
        self.replica = replica
        self.same_topology = None

    def __repr__(self):
        return ("ShardTable(%d rows at %d of %d, k=%d, dp %d/%d, replica %d)"
                % (len(self.rows), self.row0, self.n_shards, self.k, self.dp_rank,
                   self.dp_world, self.replica))

    def _block(self):
        """(ctypes int64 array of the rows or None, row count), for the save."""
        n = len(self.rows)
        if n == 0:
            return None, 0
        return (_lib.c_i64 * (n * self.k))(*[x for r in self.rows for x in r]), n

    def _restore_from(self, reader, name, strict):
        """Called by ckptd.torch.load for this leaf: deals the saved table to
        this table's DP rank.  False when the checkpoint has none and strict
        is off (the table is left as it is)."""
        try:
            rows, row0, same, n_rows = restore(reader, name, self.dp_world, self.dp_rank)
        except CheckpointError as e:
            if e.errno == errno.ENOENT and not strict:
                return False
            raise
        if n_rows is not None and n_rows != self.n_shards:
            raise CheckpointError("checkpoint %s: data-loader table '%s' has %d shards, this "
                                  "one %d: the data set's sharding changed"
                                  % (reader.path, name, n_rows, self.n_shards))
        if rows and len(rows[0]) != self.k:
            raise CheckpointError("checkpoint %s: data-loader table '%s' has %d columns, this "
                                  "one %d" % (reader.path, name, len(rows[0]), self.k))
        self.rows = rows
        self.row0 = row0
        self.same_topology = same
        return True


def split(n_samples, n_shards):
    """Shard sizes for n_samples samples in n_shards contiguous shards that
    differ by at most one sample."""
    if n_shards < 1 or n_samples < n_shards:
        raise ValueError("cannot split %d samples into %d non-empty shards"
                         % (n_samples, n_shards))
    q, r = divmod(n_samples, n_shards)
    return [q + 1 if i < r else q for i in range(n_shards)]


def _mix(*parts):
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(),
                                          digest_size=8).digest(), "little")


class ShardSampler:
    """A batch sampler (DataLoader(dataset, batch_sampler=...)) over logical
    shards, whose progress is libckpt's data-loader table, so that a job can
    stop mid-epoch and resume on another number of data-parallel ranks.

    shard_sizes: samples in each shard; shard s is the dataset's indices
    [sum(shard_sizes[:s]), sum(shard_sizes[:s+1])) (split(n, m) makes even
    ones).  dp_rank/dp_world: this rank's place among the data-parallel
    ranks; replica: its index among the TP/PP peers of its DP group (all
    peers get the same batches; replica 0 writes the table).  shuffle: each
    pass visits its shards in an order, and each shard's samples in an
    order, drawn from (seed, epoch, shard id), so the order depends on the
    shard and not on which rank holds it.

    Each pass over the sampler (one iter()) is one epoch of this rank's
    shards.  Rows are (id, cursor, done, epoch, length): the epoch is per
    shard, so ranks that finished their epoch at different times rescale
    correctly (a pass serves the lowest epoch that still has work; shards
    already past it wait).

    Progress counts batches the training loop took, not the ones a loader
    prefetched: iterate the loader through track(loader) (or call
    advance() once per batch taken).  Use it with torch's DataLoader (any
    loader taking a batch_sampler), not inside a StatefulDataLoader: the
    sampler is itself the state to save.  Give at least as many shards as
    DP ranks: a rank without shards gets empty passes.  Put the sampler in the saved state
    (state = {"data": sampler, ...}); take the save after the step that
    used the batch.  On a load with the same DP world each rank gets its
    rows back as they were; with another, ckpt_dl_restore deals them
    again and the next pass resumes every shard at its cursor.  Samples
    prefetched but not taken at the save are served again; none is
    skipped, none served twice within an epoch."""

    K = 5
    COL_EPOCH = 3
    COL_LEN = 4

    def __init__(self, shard_sizes, batch_size, *, dp_rank=0, dp_world=1, replica=0,
                 shuffle=True, seed=0, drop_last=False):
        sizes = [int(s) for s in shard_sizes]
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError("ShardSampler: shard_sizes must be one or more sizes >= 1")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("ShardSampler: batch_size must be an int >= 1, not %r"
                             % (batch_size,))
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError("ShardSampler: seed must be an int, not %r" % (seed,))
        if not (0 <= dp_rank < dp_world) or replica < 0:
            raise ValueError("ShardSampler: DP rank %r of %r, replica %r"
                             % (dp_rank, dp_world, replica))
        self.sizes = sizes
        self.offsets = [0]
        for s in sizes:
            self.offsets.append(self.offsets[-1] + s)
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_world = dp_world
        self.replica = replica
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        ids, self._row0 = first(len(sizes), dp_world, dp_rank)
        self._rows = [[i, 0, 0, 0, sizes[i]] for i in ids]
        self._pass_plan = None  # (epoch, [(row index, start, end)], total, n_batches)
        self._taken = 0         # batches of the current pass the loop took
        self.same_topology = None

    @property
    def n_shards(self):
        return len(self.sizes)

    @property
    def shards(self):
        """The shard ids this rank holds, in table order."""
        return [r[COL_ID] for r in self._rows]

    @property
    def epoch(self):
        """The epoch of the pass in progress; once all its batches are
        taken (or before any pass), the epoch the next pass will serve."""
        if self._pass_plan is not None and self._taken < self._pass_plan[3]:
            return self._pass_plan[0]
        return self._plan(self._folded())[0]

    # -- progress --

    def advance(self, batches=1):
        """Records that the training loop took `batches` more batches of the
        current pass (track() does it for you)."""
        self._taken += batches

    def track(self, loader):
        """Yields the batches of `loader` (built on this sampler), counting
        each as taken when the loop gets it."""
        for batch in loader:
            self._taken += 1
            yield batch

    def _folded(self):
        """The rows with the current pass's taken batches applied."""
        rows = [list(r) for r in self._rows]
        if self._pass_plan is None or self._taken == 0:
            return rows
        _, plan, total, n_batches = self._pass_plan
        left = min(self._taken * self.batch_size, total)
        if self.drop_last and self._taken >= n_batches:
            left = total  # the pass is over; its last partial batch was dropped
        for i, start, end in plan:
            take = min(left, end - start)
            rows[i][COL_CURSOR] = start + take
            if start + take == end:
                rows[i][COL_DONE] = 1
            left -= take
            if left == 0 and start + take < end:
                break
        return rows

    def _plan(self, rows):
        """(epoch, plan, total, n_batches) of the pass that would start from
        rows, which it updates: shards finished in the epoch before get
        their next epoch."""
        if not rows:
            return 0, [], 0, 0
        ep = min(r[self.COL_EPOCH] + r[COL_DONE] for r in rows)
        for r in rows:
            if r[COL_DONE] and r[self.COL_EPOCH] + 1 == ep:
                r[COL_CURSOR], r[COL_DONE], r[self.COL_EPOCH] = 0, 0, ep
        active = [i for i, r in enumerate(rows) if r[self.COL_EPOCH] == ep and not r[COL_DONE]]
        if self.shuffle:
            active.sort(key=lambda i: (_mix("order", self.seed, ep, rows[i][COL_ID]),
                                       rows[i][COL_ID]))
        else:
            active.sort(key=lambda i: rows[i][COL_ID])
        plan = [(i, rows[i][COL_CURSOR], rows[i][self.COL_LEN]) for i in active]
        total = sum(end - start for _, start, end in plan if end > start)
        n = total // self.batch_size if self.drop_last else -(-total // self.batch_size)
        return ep, plan, total, n

    def __len__(self):
        if self._pass_plan is not None and self._taken < self._pass_plan[3]:
            return self._pass_plan[3]
        return self._plan(self._folded())[3]

    def __iter__(self):
        return self._pass()

    def _pass(self):
        # Runs at the first next(): a DataLoader makes iterators it never
        # uses, and a pass starts only when batches are really asked for.
        rows = self._folded()
        ep, plan, total, n = self._plan(rows)
        self._rows = rows
        self._pass_plan = (ep, plan, total, n)
        self._taken = 0
        batch = []
        for i, start, end in plan:
            sid = rows[i][COL_ID]
            order = list(range(self.sizes[sid]))
            if self.shuffle:
                random.Random(_mix("perm", self.seed, ep, sid)).shuffle(order)
            base = self.offsets[sid]
            for pos in range(start, end):
                batch.append(base + order[pos])
                if len(batch) == self.batch_size:
                    yield batch
                    batch = []
        if batch and not self.drop_last:
            yield batch

    # -- Stateful --

    def state_dict(self):
        """{"table": ShardTable} of the batches taken so far (not those a
        loader prefetched)."""
        return {"table": ShardTable(self._folded(), k=self.K, row0=self._row0,
                                    n_shards=self.n_shards, dp_rank=self.dp_rank,
                                    dp_world=self.dp_world, replica=self.replica)}

    def load_state_dict(self, state):
        t = state.get("table") if hasattr(state, "get") else None
        if not isinstance(t, ShardTable):
            raise TypeError("ShardSampler.load_state_dict takes the state ckptd.torch.load "
                            "fills ({'table': ShardTable}), not %r" % (type(t).__name__,))
        if t.k != self.K:
            raise ValueError("ShardSampler: the saved table has %d columns, not %d"
                             % (t.k, self.K))
        for r in t.rows:
            sid = r[COL_ID]
            if sid >= self.n_shards:
                raise ValueError("ShardSampler: the checkpoint names shard %d; this sampler has "
                                 "%d shards" % (sid, self.n_shards))
            if r[self.COL_LEN] != self.sizes[sid] or r[COL_CURSOR] > r[self.COL_LEN]:
                raise ValueError("ShardSampler: shard %d had %d samples at the save and has "
                                 "%d now (cursor %d): the data set changed"
                                 % (sid, r[self.COL_LEN], self.sizes[sid], r[COL_CURSOR]))
        self._rows = [list(r) for r in t.rows]
        self._row0 = t.row0
        self._pass_plan = None
        self._taken = 0
        self.same_topology = t.same_topology


# ---- exact resume of a torchdata StatefulDataLoader ----

def _enc(v, path):
    """v as JSON that _dec gives back exactly (types included)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return {"$f": v.hex()}
    if isinstance(v, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, list):
        return [_enc(x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]
    if isinstance(v, tuple):
        return {"$t": [_enc(x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]}
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in v):
            return {k: _enc(x, "%s.%s" % (path, k)) for k, x in v.items()}
        return {"$d": [[_enc(k, path), _enc(x, "%s[%r]" % (path, k))] for k, x in v.items()]}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach().to("cpu").contiguous()
        raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
        return {"$T": str(t.dtype).replace("torch.", ""), "s": list(t.shape),
                "d": base64.b64encode(raw).decode()}
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(v, np.ndarray):
            a = np.ascontiguousarray(v)
            return {"$N": a.dtype.str, "s": list(a.shape),
                    "d": base64.b64encode(a.tobytes()).decode()}
        if isinstance(v, np.generic):
            return _enc(v.item(), path)
    raise TypeError("LoaderState: the loader's state holds a %s at %s, which it cannot save "
                    "(None, bool, int, float, str, bytes, list, tuple, dict, CPU tensors and "
                    "numpy arrays only)" % (type(v).__name__, path or "the top"))


def _dec(j):
    if isinstance(j, list):
        return [_dec(x) for x in j]
    if not isinstance(j, dict):
        return j
    if "$f" in j:
        return float.fromhex(j["$f"])
    if "$b" in j:
        return base64.b64decode(j["$b"])
    if "$t" in j:
        return tuple(_dec(x) for x in j["$t"])
    if "$d" in j:
        return {_dec(k): _dec(x) for k, x in j["$d"]}
    if "$T" in j:
        torch = _torch()
        dt = getattr(torch, j["$T"], None)
        if not isinstance(dt, torch.dtype):
            raise CheckpointError("loader state: unknown torch dtype %r" % j["$T"])
        raw = base64.b64decode(j["d"])
        if not raw:
            return torch.empty(j["s"], dtype=dt)
        return torch.frombuffer(bytearray(raw), dtype=dt).reshape(j["s"])
    if "$N" in j:
        import numpy as np
        return np.frombuffer(base64.b64decode(j["d"]), dtype=np.dtype(j["$N"])) \
            .reshape(j["s"]).copy()
    return {k: _dec(x) for k, x in j.items()}


def _dist_rank_world():
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class LoaderState:
    """A torchdata StatefulDataLoader as a Stateful value of a ckptd state:

        state = {"model": model, "optim": opt, "data": ckptd.data.LoaderState(loader),
                 "rng": ckptd.rng.RNGState(), "step": step}

    state_dict() takes the loader's state in the calling thread (ckptd's
    async_save calls it there, at the save call) and returns it as one
    per-rank value: {"state": bytes}, an exact encoding (JSON with tensors,
    tuples and float bits kept; nothing is pickled, so loading runs no
    code).  load_state_dict() checks that the checkpoint was saved by this
    rank of the same world with the same num_workers, hands the state to
    the loader and builds the resumed iterator at once, with the global
    torch RNG put back afterwards, so that the next `for batch in loader`
    continues exactly where the save was and the RNG stream is the saved
    one whatever the order of restores.  If the loader has a generator of
    its own, its state is saved and restored too.

    rank/world: this process's place (default: torch.distributed's when
    initialized, else 0 of 1).  allow_new_topology: a checkpoint from
    another world size or num_workers is refused (ValueError) unless set;
    then the loader starts afresh (use ShardSampler to rescale).

    Iterate the loader only after the load: an iterator made before it
    does not see the loaded state (a RuntimeWarning says so)."""

    FORMAT = 1

    def __init__(self, loader, *, rank=None, world=None, allow_new_topology=False):
        if not (callable(getattr(loader, "state_dict", None)) and
                callable(getattr(loader, "load_state_dict", None))):
            raise TypeError("LoaderState wraps a loader with state_dict()/load_state_dict() "
                            "(torchdata's StatefulDataLoader), not %s" % type(loader).__name__)
        self.loader = loader
        self.rank = rank
        self.world = world
        self.allow_new_topology = allow_new_topology
        self.restored = None  # after a load: True, or False when it started afresh

    def _place(self):
        r, w = _dist_rank_world()
        return (self.rank if self.rank is not None else r,
                self.world if self.world is not None else w)

    def state_dict(self):
        rank, world = self._place()
        gen = getattr(self.loader, "generator", None)
        doc = {"format": self.FORMAT, "rank": rank, "world": world,
               "num_workers": getattr(self.loader, "num_workers", 0),
               "loader": self.loader.state_dict(),
               "generator": gen.get_state() if gen is not None else None}
        return {"state": json.dumps(_enc(doc, ""), separators=(",", ":")).encode()}

    def load_state_dict(self, state):
        raw = state.get("state") if hasattr(state, "get") else None
        if not isinstance(raw, (bytes, bytearray)):
            raise CheckpointError("LoaderState: the checkpoint holds no loader state saved by "
                                  "LoaderState (got %s)" % type(raw).__name__)
        try:
            doc = _dec(json.loads(raw))
            fmt = doc["format"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError("LoaderState: the saved loader state does not parse: %s" % e)
        if not isinstance(fmt, int) or fmt > self.FORMAT:
            raise CheckpointError("LoaderState: loader state format %r is newer than this "
                                  "package's (%d): upgrade ckptd" % (fmt, self.FORMAT))
        rank, world = self._place()
        nw = getattr(self.loader, "num_workers", 0)
        if (doc["rank"], doc["world"], doc["num_workers"]) != (rank, world, nw):
            msg = ("LoaderState: the checkpoint's loader state is rank %d's of %d with %d "
                   "workers; this is rank %d of %d with %d workers. A StatefulDataLoader "
                   "resumes only in the same topology (ckptd.data.ShardSampler rescales)"
                   % (doc["rank"], doc["world"], doc["num_workers"], rank, world, nw))
            if not self.allow_new_topology:
                raise ValueError(msg + "; allow_new_topology=True starts the loader afresh")
            warnings.warn(msg + ": starting the loader afresh", RuntimeWarning, stacklevel=2)
            self.restored = False
            return
        loader = self.loader
        if (getattr(loader, "_iterator", None) is not None and
                not getattr(loader, "_initial_iter_for_state_dict", True)):
            warnings.warn("LoaderState: the loader was iterated before its state was loaded; "
                          "an iterator made before the load does not see the loaded state: "
                          "iterate the loader only after ckptd.torch.load", RuntimeWarning,
                          stacklevel=2)
        torch = _torch()
        rng = torch.get_rng_state()
        try:
            loader.load_state_dict(doc["loader"])
            # Build the resumed iterator now: the next iter(loader) returns
            # it.  Its construction draws a base seed from the global RNG,
            # a draw the uninterrupted run made before the save.
            loader.state_dict()
        finally:
            torch.set_rng_state(rng)
        gen = getattr(loader, "generator", None)
        if gen is not None and doc["generator"] is not None:
            gen.set_state(doc["generator"])
        self.restored = True


def worker_rng(dataset):
    """`dataset` wrapped so that, in a DataLoader worker, its state (what
    torchdata's StatefulDataLoader snapshots in each worker with every
    batch) includes the worker's torch, numpy and random RNG states, and
    its restore puts them back.  Random transforms in workers then resume
    exactly; in the main process (num_workers=0) the wrapper adds nothing
    (ckptd.rng.RNGState covers that RNG).  A Stateful dataset's own state is
    kept under "dataset".  Map-style and iterable datasets both work; the
    wrapper passes other attributes through."""
    from . import _worker_rng
    return _worker_rng.wrap(dataset)
