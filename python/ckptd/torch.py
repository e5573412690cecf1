# SPDX-License-Identifier: MIT
"""ckptd for PyTorch: DCP-shaped async_save / save / load.

    # before: from torch.distributed.checkpoint import async_save
    from ckptd.torch import async_save
    resp = async_save(state_dict, checkpoint_id="/ckpt/run1/step-000100")
    resp.staging_completion.result()   # the trainer may change its tensors
    resp.upload_completion.result()    # committed: complete and visible

No collective is ever called: ranks meet in ckptd's commit.  The process
group (if any) is asked for its rank and size only, in the caller's thread;
the threads that complete the futures only wait in libckpt.

Sharded state (verified with gloo on CPU, torch 2.15, by
python/tests/test_dist.py, which also checks from inside every rank that
no thread but the main one calls into torch.distributed while 4 ranks run
collectives with saves in flight):

  - A DTensor is saved as this rank's local chunk, placed in the global
    tensor by the box of DTensor.__create_chunk_list__() (DCP's own chunk
    list: uneven shards, empty shards, FSDP2's and tensor parallelism's
    _StridedShard layouts).  A chunk held by several ranks (Replicate
    placements) is written once, by one of them: see _replica_of.  A
    Partial placement is refused with a TypeError before anything is sent
    (at load too).  A DTensor whose local part is not one box is refused.
  - A plain tensor (or numpy array) saved under a process group of more
    than one rank is taken as replicated, as DCP takes it: every rank is
    expected to hold the same value under the same name, and one rank,
    chosen from the name, writes it.  A tensor only some ranks hold, or
    that differs between ranks, needs a name of its own per rank.
  - Copies of a DTensor outside its own mesh (DDP over tensor-parallel
    submeshes) are not known to be copies: each is written and ckptd
    refuses the overlapping chunks (the upload future raises SaveError).
  - load() fills each destination's own box (a DTensor's local chunk, a
    plain tensor whole) from whatever chunks the checkpoint has: any other
    mesh, placements or number of ranks; the C planner reads only the
    bytes those boxes need.
"""
import json
import os
import pickle
import sys
import zlib

import torch
import torch.distributed as dist

from . import _client, _engine, _lib, _tree
from ._engine import META_PREFIX, FORMAT, LoadBox, tensor_item
from .data import ShardTable
from ._errors import CheckpointError, SaveError

try:  # torch >= 2.5
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial, Replicate
except ImportError:  # torch 2.4
    try:
        from torch.distributed._tensor import DTensor
        from torch.distributed._tensor.placement_types import Partial, Replicate
    except ImportError:  # a build without torch.distributed
        DTensor = None
        Partial = Replicate = ()

__all__ = ["async_save", "save", "load", "AsyncSaveResponse"]

# torch dtype -> (ckpt dtype, how it is stored).  how: None (as it is),
# "complex" (its real view: one more dimension of 2), "bytes" (its bytes,
# the same shape, as U8 or U16: dtypes safetensors and libckpt do not name).
_DTYPES = {}


def _add_dtype(attr, code, how=None):
    dt = getattr(torch, attr, None)
    if dt is not None:
        _DTYPES[dt] = (_lib.DTYPE[code], how)


for _a, _c in (("bool", "BOOL"), ("uint8", "U8"), ("int8", "I8"), ("int16", "I16"),
               ("uint16", "U16"), ("int32", "I32"), ("uint32", "U32"), ("int64", "I64"),
               ("uint64", "U64"), ("float16", "F16"), ("bfloat16", "BF16"),
               ("float32", "F32"), ("float64", "F64"), ("float8_e4m3fn", "F8_E4M3"),
               ("float8_e5m2", "F8_E5M2")):
    _add_dtype(_a, _c)
_add_dtype("complex32", "F16", "complex")
_add_dtype("complex64", "F32", "complex")
_add_dtype("complex128", "F64", "complex")
for _a in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
           "bits8", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
           "int1", "int2", "int3", "int4", "int5", "int6", "int7"):
    _dt = getattr(torch, _a, None)
    if _dt is not None and _dt.itemsize == 1:
        _add_dtype(_a, "U8", "bytes")
_dt = getattr(torch, "bits16", None)
if _dt is not None:
    _add_dtype("bits16", "U16", "bytes")

# What a tensor's entry in the Python metadata says, one per dtype (only
# read, so shared by every tensor of that dtype).
_TMETA = {_dt: {"torch": str(_dt).replace("torch.", "")} for _dt in _DTYPES}
_STRIDED = torch.strided
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # exact types: no subclass

_NP_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
              "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
              "float16": "F16", "float32": "F32", "float64": "F64"}
_NP_COMPLEX = {"complex64": "F32", "complex128": "F64"}


def _np():
    return sys.modules.get("numpy")


def _is_ndarray(v):
    np = _np()
    return np is not None and isinstance(v, np.ndarray)


def _is_tensor_leaf(v):
    return isinstance(v, torch.Tensor) or _is_ndarray(v)


class AsyncSaveResponse:
    """The two futures of a save, as DCP's: staging_completion (the trainer
    may change its tensors again) and upload_completion (committed: the
    checkpoint is complete and visible).  Both are
    concurrent.futures.Future; a failure raises ckptd.SaveError."""

    __slots__ = ("staging_completion", "upload_completion", "checkpoint_id")

    def __init__(self, staging, upload, checkpoint_id):
        self.staging_completion = staging
        self.upload_completion = upload
        self.checkpoint_id = checkpoint_id

    # DCP's async_save returns a plain Future (the upload's) unless given a
    # stager: code that calls .result() on it keeps working here.
    def result(self, timeout=None):
        """upload_completion.result(): waits until committed."""
        return self.upload_completion.result(timeout)

    def done(self):
        return self.upload_completion.done()

    def exception(self, timeout=None):
        return self.upload_completion.exception(timeout)

    def add_done_callback(self, fn):
        self.upload_completion.add_done_callback(lambda _f: fn(self))

    def __repr__(self):
        return "AsyncSaveResponse(%r, staged=%s, committed=%s)" % (
            self.checkpoint_id, self.staging_completion.done(), self.upload_completion.done())


def _rank_world(process_group, no_dist=False):
    if no_dist or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    rank = dist.get_rank(process_group)
    if rank < 0:
        raise ValueError("this process is not a member of the process_group given")
    return rank, dist.get_world_size(process_group)


def _writer(name, n):
    return zlib.crc32(name.encode()) % n if n > 1 else 0


_side_streams = {}


def _stream_after_current(device, ordered):
    """A private stream of `device` that waits for what is queued on the
    current stream now: copies ordered on it see the tensor as it is at
    the call, whatever the trainer queues afterwards.  ordered: this save's
    {device index: stream}, so that one event per device orders all of a
    save's tensors (not one per tensor)."""
    got = ordered.get(device.index)
    if got is not None:
        return got
    s = _side_streams.get(device.index)
    if s is None:
        s = torch.cuda.Stream(device=device)
        _side_streams[device.index] = s
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(device))
    s.wait_event(ev)
    ordered[device.index] = s.cuda_stream
    return s.cuda_stream


def _storage_view(name, t):
    """(tensor to copy, ckpt dtype, how it is stored)."""
    if t.layout != torch.strided:
        raise TypeError("'%s': a %s tensor cannot be saved (only strided tensors; call "
                        ".to_dense() first)" % (name, t.layout))
    if t.is_quantized:
        raise TypeError("'%s': quantized tensors cannot be saved; dequantize() first" % name)
    m = _DTYPES.get(t.dtype)
    if m is None:
        raise TypeError("'%s': dtype %s is not supported" % (name, t.dtype))
    code, how = m
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if how == "complex":
        t = torch.view_as_real(t)
    elif how == "bytes":
        t = t.view(torch.uint8 if t.dtype.itemsize == 1 else torch.uint16)
    return t, code, how


def _tensor_items(name, v, rank, world, items, keep, tmeta, ordered):
    if DTensor is not None and isinstance(v, DTensor):
        return _dtensor_items(name, v, items, keep, tmeta, ordered)
    if not isinstance(v, torch.Tensor):  # a numpy array (a tensor leaf)
        np = _np()
        kind = v.dtype.name
        if kind in _NP_DTYPES:
            code, how = _lib.DTYPE[_NP_DTYPES[kind]], None
            a = np.ascontiguousarray(v)
        elif kind in _NP_COMPLEX:
            code, how = _lib.DTYPE[_NP_COMPLEX[kind]], "complex"
            a = np.ascontiguousarray(v).view(v.dtype.type(0).real.dtype).reshape(v.shape + (2,))
        else:
            raise TypeError("'%s': a numpy array of dtype %s cannot be saved" % (name, v.dtype))
        keep.append(a)
        tmeta[name] = {"np": kind}
        w = _writer(name, world)
        items.append(tensor_item(name, code, a.shape, a.ctypes.data,
                                 replica=(rank - w) % world))
        return
    dtype = v.dtype
    t, code, how = _storage_view(name, v.detach())
    device, index, stream = _lib.DEVICE_HOST, 0, None
    if t.device.type == "cuda":
        device, index = _lib.DEVICE_CUDA, t.device.index or 0
        stream = _stream_after_current(t.device, ordered)
    elif t.device.type != "cpu":
        raise TypeError("'%s': tensors on %s cannot be saved (CPU and CUDA only)"
                        % (name, t.device))
    if not t.is_contiguous():
        t = t.contiguous()
    keep.append(t)
    tmeta[name] = {"torch": str(dtype).replace("torch.", "")}
    # Replicated over the group (as DCP takes a plain tensor): one rank,
    # a function of the name, writes it; the others are its replicas.
    w = _writer(name, world)
    items.append(tensor_item(name, code, t.shape, t.data_ptr(), device=device,
                             device_index=index, replica=(rank - w) % world, stream=stream))


def _replica_of(v, name):
    """(replica index this rank writes as, replica count) of a DTensor's
    local chunk, or None when this rank is not in the DTensor's mesh.

    The ranks of the mesh that hold the same chunk are those whose
    coordinates agree in every mesh dimension that is not Replicate (Shard
    dimensions pick the chunk); they differ only in the Replicate
    dimensions, whose coordinates, read as one mixed-radix number, number
    them 0 .. count-1.  One of them writes (libckpt writes replica 0 and
    skips the others): which one is a pure function of the tensor's name
    and the chunk's Shard coordinates, so every holder computes the same
    writer without talking to the others, and the chunks of one tensor go
    round the replicas in turn (with 2 chunks on 2 replicas, each replica
    writes one).  Checked in python/tests/test_dist.py for 1-D meshes
    (Shard, Replicate) and 2-D meshes (Shard+Replicate, Replicate+Shard,
    Replicate+Replicate, Shard+Shard, FSDP2 with tensor parallelism's
    _StridedShard+Shard)."""
    mesh = v.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:
        return None
    rep, n, shard = 0, 1, 0
    for d, p in enumerate(v.placements):
        size = mesh.size(d)
        if isinstance(p, Replicate):
            rep = rep * size + coord[d]
            n *= size
        else:
            shard = shard * size + coord[d]
    w = (zlib.crc32(name.encode()) + shard) % n
    return (rep - w) % n, n


def _dtensor_chunk(name, v, what):
    """(offsets, sizes, local tensor) of this rank's part of DTensor v, from
    the chunk list DCP uses (DTensor.__create_chunk_list__, which knows
    uneven and empty shards), or None when this rank is not in v's mesh
    (it holds no part).  Partial placements and layouts whose local part
    is not one box of the global tensor are refused."""
    for p in v.placements:
        if isinstance(p, Partial):
            raise TypeError("'%s': a DTensor with a Partial placement (%r) holds partial "
                            "sums, not values, and cannot be %s: redistribute it (e.g. to "
                            "Replicate) first" % (name, p, what))
    if v.device_mesh.get_coordinate() is None:
        return None
    chunks = v.__create_chunk_list__()
    if len(chunks) != 1:
        raise TypeError("'%s': a DTensor whose local part is %d chunks cannot be %s"
                        % (name, len(chunks), what))
    offsets = [int(x) for x in chunks[0].offsets]
    sizes = [int(x) for x in chunks[0].sizes]
    local = v.to_local()
    if list(local.shape) != sizes:
        raise TypeError("'%s': the local tensor's shape %s is not its chunk's %s (a strided "
                        "sharding cannot be %s)" % (name, list(local.shape), sizes, what))
    return offsets, sizes, local


def _dtensor_items(name, v, items, keep, tmeta, ordered):
    """This rank's chunk of DTensor v: its box of the global tensor (an
    empty one too: libckpt stores a chunk of 0 elements, with no data, and
    its tiling check ignores it), written by one of the ranks holding it
    (_replica_of)."""
    part = _dtensor_chunk(name, v, "saved")
    if part is None:  # this rank is not in the DTensor's mesh
        return
    offsets, sizes, local = part
    rep = _replica_of(v, name)
    local = local.detach()
    gshape = [int(x) for x in v.shape]
    t, code, how = _storage_view(name, local)
    if how == "complex":
        offsets, sizes, gshape = offsets + [0], sizes + [2], gshape + [2]
    device, index, stream = _lib.DEVICE_HOST, 0, None
    if t.device.type == "cuda":
        device, index = _lib.DEVICE_CUDA, t.device.index or 0
        stream = _stream_after_current(t.device, ordered)
    if not t.is_contiguous():
        t = t.contiguous()
    keep.append(t)
    tmeta[name] = {"torch": str(v.dtype).replace("torch.", ""), "dtensor": True}
    items.append(tensor_item(name, code, t.shape, t.data_ptr(),
                             global_shape=gshape, offsets=offsets, device=device,
                             device_index=index, replica=rep[0], stream=stream))


def _value_kind(name, v, allow_pickle):
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, int) and not isinstance(v, bool) and type(v) is not int:
            v = int(v)  # an IntEnum and the like: its value
        return "value", v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "bytes", bytes(v)
    np = _np()
    if np is not None and isinstance(v, np.generic):
        return "value", v.item()
    if allow_pickle:
        return "pickle", pickle.dumps(v)
    raise TypeError("'%s': a value of type %s can only be saved with pickle: pass "
                    "allow_pickle=True to the save and to the load (a checkpoint made so "
                    "runs code when loaded: load only checkpoints you trust)"
                    % (name, type(v).__name__))


def _prepare(state_dict, rank, world, allow_pickle, dl_tables=None):
    names, leaves = _tree.names_values(state_dict, _is_tensor_leaf)
    items, keep, blobs = [], [], []
    tmeta, values, bmeta = {}, {}, {}
    ordered = {}  # CUDA device -> the stream this save's copies wait on
    for name, v in zip(names, leaves):
        # The common case first, inline and at the least cost (every tensor
        # adds to the time async_save blocks the trainer): a plain (not
        # DTensor) contiguous host tensor of a dtype stored as it is.  Its
        # memory is read as it is: no detached alias or view is needed.
        # Anything else takes _tensor_items's general path.
        if type(v) in _PLAIN_TENSORS:
            dtype = v.dtype
            m = _DTYPES.get(dtype)
            if (m is not None and m[1] is None and v.layout is _STRIDED and v.is_cpu and
                    v.is_contiguous() and not v.is_neg()):
                keep.append(v)
                tmeta[name] = _TMETA[dtype]
                items.append((name, m[0], v.shape, v.data_ptr(),   # _engine.tensor_item
                              (rank - _writer(name, world)) % world if world > 1 else 0,
                              None, None, _lib.DEVICE_HOST, 0, 0))
                continue
        if isinstance(v, ShardTable) and dl_tables is not None:
            dl_tables.append((name, v))  # ckpt_save_add_dl_table
            continue
        if _is_tensor_leaf(v):
            _tensor_items(name, v, rank, world, items, keep, tmeta, ordered)
            continue
        kind, val = _value_kind(name, v, allow_pickle)
        if kind == "value":
            values[name] = val
        else:
            bmeta[name] = kind
            blobs.append(("%sb/%d/%s" % (META_PREFIX, rank, name), val))
    meta = {"format": FORMAT, "rank": rank, "world": world, "tensors": tmeta,
            "values": values, "blobs": bmeta}
    # A trainer saves the same names, dtypes and values again and again:
    # comparing with the last save's metadata (its per-dtype entries are
    # the same objects) costs a fraction of encoding it anew.
    last = _last_meta
    if last is not None and last[0] == meta:
        raw = last[1]
    else:
        raw = json.dumps(meta, separators=(",", ":")).encode()
        globals()["_last_meta"] = (meta, raw)
    blobs.append((_engine.meta_key(rank), raw))
    return items, blobs, keep


_last_meta = None  # (metadata, its JSON) of the last save of this process


def _step_of(step):
    if step is None:
        return 0
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError("step must be a non-negative int, not %r" % (step,))
    return step


def _check_metrics(metrics):
    if metrics is None:
        return {}
    out = {}
    for k, v in dict(metrics).items():
        if not isinstance(k, str):
            raise TypeError("metric names must be str, not %r" % (k,))
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError("metric %r: %r is not a number" % (k, v)) from None
        if f != f or f in (float("inf"), float("-inf")):
            raise ValueError("metric %r: %r is not finite" % (k, v))
        out[k] = f
    return out


def async_save(state_dict, *, checkpoint_id, process_group=None, step=None, metrics=None,
               allow_pickle=False, storage_writer=None, planner=None, no_dist=False,
               **unsupported):
    """Saves state_dict as this rank's part of checkpoint `checkpoint_id` (a
    directory <root>/<name> or s3://bucket/prefix/name, under one of ckptd's
    roots) and returns at once with an AsyncSaveResponse.

    Every rank of the job calls it with the same checkpoint_id.  Tensors
    (torch, numpy, DTensor) are staged by libckpt's threads (CUDA ones on
    the GPU's copy engine, after the work queued on their current stream);
    until staging_completion is done they must not be changed.  Values (int,
    float, str, None, bytes) are saved per rank.  step (int) orders
    checkpoints for ckptd.latest(); metrics (name -> number) serve
    `ckptctl prune --keep-best`.

    process_group: the ranks that save this checkpoint together (default:
    the default group once torch.distributed is initialized, else this
    process alone).  It is asked for this rank and its size, here in the
    caller's thread, and for nothing else: no collective is called, now or
    later.  DTensors are saved as their local chunks, and plain tensors
    under a group of several ranks as replicated (module docstring).

    Raises TypeError/ValueError for a state it cannot save (before anything
    is sent), ckptd.DaemonNotRunning, ckptd.SaveError if ckptd refuses it;
    later failures come through the futures as SaveError."""
    if storage_writer is not None or planner is not None or unsupported:
        bad = [k for k, v in (("storage_writer", storage_writer), ("planner", planner))
               if v is not None] + sorted(unsupported)
        raise TypeError("ckptd.torch.async_save does not take %s: ckptd writes the "
                        "checkpoint itself (drop the argument)" % ", ".join(bad))
    root, name = _engine.split_checkpoint_id(checkpoint_id)
    rank, world = _rank_world(process_group, no_dist)
    st = _step_of(step)
    mets = _check_metrics(metrics)
    dl_tables = []
    items, blobs, keep = _prepare(state_dict, rank, world, allow_pickle, dl_tables)
    meta = {"ckptd.python": str(FORMAT)} if rank == 0 else None
    client = _client.get(rank, world, root)
    try:
        p = _engine.save(client, root, name, st, items, blobs, mets, meta, keep,
                         dl_tables=dl_tables)
    except SaveError as e:
        if e.errno not in _engine.LOST:
            raise
        # The daemon went away since this connection was made (a restart):
        # nothing was sent, so the save is made again on a new one.
        _client.drop(client)
        client = _client.get(rank, world, root)
        p = _engine.save(client, root, name, st, items, blobs, mets, meta, keep,
                         dl_tables=dl_tables)
    return AsyncSaveResponse(p.staging_completion, p.upload_completion,
                             os.fspath(checkpoint_id))


def save(state_dict, *, checkpoint_id, process_group=None, step=None, metrics=None,
         allow_pickle=False, **kw):
    """The blocking form of async_save: returns once the checkpoint is
    committed (complete and visible), raises SaveError if it failed."""
    r = async_save(state_dict, checkpoint_id=checkpoint_id, process_group=process_group,
                   step=step, metrics=metrics, allow_pickle=allow_pickle, **kw)
    r.upload_completion.result()


# ---- load ----

def _torch_dtype(name):
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else None


def _dest_box(name, t, saved, reader, offsets=None, gshape=None):
    """A LoadBox for destination tensor t (a plain tensor, or a DTensor's
    local part at offsets of gshape)."""
    if t.layout != torch.strided or t.is_quantized:
        raise TypeError("'%s': cannot load into a %s tensor" % (name, t.layout))
    m = _DTYPES.get(t.dtype)
    if m is None:
        raise TypeError("'%s': dtype %s is not supported" % (name, t.dtype))
    want = str(t.dtype).replace("torch.", "")
    if saved is not None and saved.get("torch", want) != want:
        raise CheckpointError("checkpoint %s: '%s' was saved as %s, the destination is %s"
                              % (reader.path, name, saved["torch"], want))
    code, how = m
    if t.is_conj() or t.is_neg():
        raise TypeError("'%s': cannot load into a conjugate or negative view" % name)
    if how == "complex":
        t = torch.view_as_real(t)
    elif how == "bytes":
        t = t.view(torch.uint8 if t.dtype.itemsize == 1 else torch.uint16)
    shape = list(t.shape)
    if gshape is None:
        gshape = shape
    else:
        gshape = list(gshape)
        offsets = list(offsets)
        if how == "complex":
            gshape, offsets = gshape + [2], offsets + [0]
    strides = list(t.stride())
    for d, (n, s) in enumerate(zip(shape, strides)):
        if s == 0 and n > 1:
            raise TypeError("'%s': cannot load into an expanded tensor (stride 0 in "
                            "dimension %d)" % (name, d))
    device, index = _lib.DEVICE_HOST, 0
    if t.device.type == "cuda":
        device, index = _lib.DEVICE_CUDA, t.device.index or 0
    elif t.device.type != "cpu":
        raise TypeError("'%s': cannot load into a tensor on %s" % (name, t.device))
    return LoadBox(name, code, gshape, t.data_ptr() or None,
                   offsets=offsets, shape=shape if offsets is not None else None,
                   strides=strides, device=device, device_index=index)


def _np_box(name, a, saved, reader):
    np = _np()
    if not a.flags.writeable:
        raise TypeError("'%s': the destination numpy array is read-only" % name)
    kind = a.dtype.name
    if saved is not None and saved.get("np", saved.get("torch")) not in (kind, None):
        raise CheckpointError("checkpoint %s: '%s' was saved as %s, the destination is %s"
                              % (reader.path, name, saved.get("np", saved.get("torch")), kind))
    if kind in _NP_DTYPES:
        code = _lib.DTYPE[_NP_DTYPES[kind]]
        v = a
    elif kind in _NP_COMPLEX:
        code = _lib.DTYPE[_NP_COMPLEX[kind]]
        v = a[..., np.newaxis].view(a.real.dtype)
    else:
        raise TypeError("'%s': numpy dtype %s is not supported" % (name, a.dtype))
    item = v.dtype.itemsize
    strides = []
    for s in v.strides:
        if s < 0 or s % item:
            raise TypeError("'%s': cannot load into a numpy array with strides %s"
                            % (name, a.strides))
        strides.append(s // item)
    return LoadBox(name, code, list(v.shape), v.ctypes.data or None, strides=strides)


def _init_optimizer(obj):
    """A fresh optimizer has no state (no moments, no step counts) until
    its first step, so its state_dict() would name nothing to load into and
    the checkpoint's state would be dropped.  As DCP's get_state_dict does,
    it takes one step with zero gradients and a zero learning rate first,
    which makes every entry without changing a parameter."""
    if not isinstance(obj, torch.optim.Optimizer) or obj.state:
        return
    params = [p for g in obj.param_groups for p in g["params"]]
    if any(p.grad is not None for p in params):
        return
    made = []
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
            made.append(p)
    lrs = []
    for g in obj.param_groups:
        lrs.append(g.get("lr"))
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    try:
        with torch.no_grad():
            obj.step()
    finally:
        for g, lr in zip(obj.param_groups, lrs):
            if "lr" in g:
                g["lr"] = lr
        for p in made:
            p.grad = None


def _check_stateful_complete(rd, meta, statefuls, dest_names):
    """strict: a Stateful whose state_dict() lacks names the checkpoint
    holds under its prefix would silently drop them on load_state_dict()."""
    saved = set(rd.tensor_names()) | set(meta.get("values", {})) | set(meta.get("blobs", {}))
    for _, _, prefix in statefuls:
        p = prefix + "." if prefix else ""
        lost = sorted(n for n in saved if n.startswith(p) and n not in dest_names)
        if lost:
            raise CheckpointError(
                "checkpoint %s holds %d name(s) under '%s' that its state_dict() here lacks "
                "(e.g. '%s'): they would be lost on load_state_dict(); make the object's "
                "state complete first, or pass strict=False" % (rd.path, len(lost), prefix,
                                                                lost[0]))


def _load(rd, boxes, via, partial, blobs):
    """_engine.load through via["client"], or by libckpt alone if the daemon
    went away (via["client"] is then None for the loads that follow)."""
    client = via["client"]
    try:
        return _engine.load(rd, boxes, client=client, partial=partial, blobs=blobs)
    except CheckpointError as e:
        if client is None or e.errno not in _engine.LOST:
            raise
        via["client"] = None
        _client.drop(client)
        return _engine.load(rd, boxes, client=None, partial=partial, blobs=blobs)


def load(state_dict, *, checkpoint_id, process_group=None, strict=True, allow_pickle=False,
         no_dist=False, storage_reader=None, planner=None):
    """Loads checkpoint `checkpoint_id` into state_dict in place, whatever
    layout it has now (the checkpoint may have been saved by another number
    of ranks and another sharding): tensors are filled where they are
    (DTensors: their local part), values are replaced in their dicts and
    lists, and Stateful objects get load_state_dict() of their loaded state.

    strict: a tensor or value of state_dict the checkpoint lacks is an
    error (False: left as it is).  Through ckptd when one answers (and from
    its memory after a crash, for a trainer connected with resident on);
    otherwise libckpt reads the files itself.  Raises CheckpointError
    (naming the file, tensor and offset of a bad block; after a failed
    read, which tensors may hold partial bytes)."""
    if storage_reader is not None or planner is not None:
        raise TypeError("ckptd.torch.load does not take storage_reader or planner")
    cid = os.fspath(checkpoint_id)
    path = cid if cid.startswith("s3://") else os.path.abspath(cid)
    root, _ = _engine.split_checkpoint_id(checkpoint_id)
    rank, world = _rank_world(process_group, no_dist)
    if not isinstance(state_dict, dict):
        _tree.flatten(state_dict, _is_tensor_leaf)  # its TypeError, before the checkpoint's
    with _engine.Reader(path) as rd:
        # Only once the checkpoint opened: a load that cannot start leaves
        # the optimizers as they were.
        leaves, statefuls, tuples = _tree.flatten(state_dict, _is_tensor_leaf, _init_optimizer)
        saved_world = rd.world
        # Through the daemon where one runs: after a crash the files may be
        # in its memory only.  Everything read is CRC-checked either way.
        via = {"client": _client.try_get(rank, world, root)}
        own_rank = rank if world == saved_world else 0
        k0, kown = _engine.meta_key(0), _engine.meta_key(own_rank)
        _, raw = _load(rd, [], via, False, sorted({k0, kown}))
        meta0 = _engine.read_meta(rd, 0, raw[k0]) if k0 in raw else None
        own = _engine.read_meta(rd, own_rank, raw[kown]) if kown in raw else None
        if own is None:
            own = meta0 or {}
        meta0 = meta0 or {}
        tensors = dict(meta0.get("tensors", {}))
        tensors.update(own.get("tensors", {}))
        boxes, cuda_devs = [], set()
        post = []
        for leaf in leaves:
            v, name = leaf.value, leaf.name
            saved = tensors.get(name)
            if _is_tensor_leaf(v):
                if name in own.get("values", {}) or name in own.get("blobs", {}):
                    raise CheckpointError("checkpoint %s: '%s' is a tensor here but was saved "
                                          "as a value" % (path, name))
                if _is_ndarray(v):
                    boxes.append(_np_box(name, v, saved, rd))
                elif DTensor is not None and isinstance(v, DTensor):
                    part = _dtensor_chunk(name, v, "loaded")
                    if part is None:  # not in its mesh: nothing to fill
                        continue
                    offsets, _, local = part
                    boxes.append(_dest_box(name, local, saved, rd, offsets, v.shape))
                    if local.device.type == "cuda":
                        cuda_devs.add(local.device)
                else:
                    boxes.append(_dest_box(name, v, saved, rd))
                    if v.device.type == "cuda":
                        cuda_devs.add(v.device)
                continue
            post.append(leaf)
        if strict and statefuls:
            _check_stateful_complete(rd, own, statefuls, {leaf.name for leaf in leaves})
        # Values: this rank's own when the world is the one that saved,
        # else rank 0's.  Their blobs are read with the tensors.
        vrank = own.get("rank", 0)
        bkeys = ["%sb/%d/%s" % (META_PREFIX, vrank, leaf.name) for leaf in post
                 if leaf.name in own.get("blobs", {})]
        for dev in cuda_devs:
            torch.cuda.current_stream(dev).synchronize()
        stats, raw = _load(rd, boxes, via, not strict, bkeys)
        for leaf in post:
            name = leaf.name
            if isinstance(leaf.value, ShardTable):  # dealt by ckpt_dl_restore
                leaf.value._restore_from(rd, name, strict)
                continue
            if name in own.get("values", {}):
                _tree.assign(leaf, own["values"][name])
            elif name in own.get("blobs", {}):
                kind = own["blobs"][name]
                data = raw.get("%sb/%d/%s" % (META_PREFIX, vrank, name))
                if data is None:
                    raise CheckpointError("checkpoint %s: the blob of '%s' is missing"
                                          % (path, name))
                if kind == "pickle":
                    if not allow_pickle:
                        raise CheckpointError(
                            "checkpoint %s: '%s' was saved with pickle; loading it runs code "
                            "from the checkpoint: pass allow_pickle=True if you trust it"
                            % (path, name))
                    _tree.assign(leaf, pickle.loads(data))
                else:
                    _tree.assign(leaf, data if not isinstance(leaf.value, bytearray)
                                 else bytearray(data))
            elif name in tensors or rd.tensor_info(name) is not None:
                raise CheckpointError("checkpoint %s: '%s' is a value here but was saved as a "
                                      "tensor" % (path, name))
            elif strict:
                raise CheckpointError("checkpoint %s has no value '%s' (strict=False skips "
                                      "what the checkpoint lacks)" % (path, name))
    _tree.rebuild_tuples(tuples)
    for obj, sd, _ in statefuls:
        obj.load_state_dict(sd)
    return stats
