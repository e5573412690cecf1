# SPDX-License-Identifier: MIT
"""Saves and loads of prepared items, over libckpt.  Framework-free: the
torch and numpy layers turn their values into tensor items, blobs and
LoadBox lists, and this module talks to the C library."""
import array
import concurrent.futures
import ctypes
import errno
import json
import os
import queue
import re
import struct
import threading

from . import _client, _lib
from ._errors import CheckpointError, SaveError, strerror

META_PREFIX = "~ckptd/"
FORMAT = 1  # of the Python metadata blob; a newer one is refused on load
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


def tensor_item(name, dtype, shape, ptr, global_shape=None, offsets=None,
                device=_lib.DEVICE_HOST, device_index=0, replica=0, stream=None):
    """One tensor (or chunk) of a save, as the tuple _pack reads: (name,
    dtype code, shape, data address or 0, replica, global shape or None,
    offsets or None, device, device index, CUDA stream or 0).  A tuple,
    so that a save of the same tensors compares equal to the last one
    (_add_tensors); ckptd.torch builds the plain host case's literally, at
    less cost than this call."""
    return (name, dtype, shape, ptr or 0, replica, global_shape, offsets, device, device_index,
            stream or 0)


def split_checkpoint_id(checkpoint_id):
    """checkpoint_id (a directory or s3:// URL) -> (root, name)."""
    cid = os.fspath(checkpoint_id)
    if not isinstance(cid, str) or not cid:
        raise ValueError("checkpoint_id must be a directory path or an s3:// URL")
    if cid.startswith("s3://"):
        body = cid[5:].rstrip("/")
        if "/" not in body:
            raise ValueError("checkpoint_id '%s': an S3 checkpoint is s3://bucket/[prefix/]name"
                             % cid)
        root, name = "s3://" + body.rsplit("/", 1)[0], body.rsplit("/", 1)[1]
    else:
        cid = os.path.abspath(cid.rstrip("/") or "/")
        root, name = os.path.split(cid)
    if (not _NAME_RE.fullmatch(name) or name.startswith(".") or
            len(name) > _lib.MAX_NAME_LEN):
        raise ValueError("checkpoint_id '%s': its last component '%s' must be 1..128 of "
                         "[A-Za-z0-9._-] and not start with '.'" % (checkpoint_id, name))
    return root, name


# errnos that say the connection to ckptd is gone (the daemon stopped or
# restarted): the connection is dropped and the next call makes a new one.
LOST = (errno.ENOTCONN, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE)


def _check(r, what):
    if r < 0:
        raise SaveError("%s: %s" % (what, _lib.last_error() or strerror(-r)), -r)
    return r


class _Waiters:
    """The threads that complete saves' futures, reused from save to save.
    Starting a thread per save cost the caller 0.3 to 10 ms on a busy
    2-CPU machine (Thread.start() returns only once the new thread has
    run, while the save's copy threads already hold the CPUs); handing
    the save to an idle thread costs a queue put.  A thread waits for one
    save at a time, so there are never more threads than saves that were
    in flight at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle = 0
        self.queue = queue.SimpleQueue()

    def submit(self, fn):
        with self.lock:
            if self.idle:
                self.idle -= 1
                self.queue.put(fn)
                return
        threading.Thread(target=self._main, args=(fn,), name="ckptd-save", daemon=True).start()

    def _main(self, fn):
        while True:
            fn()
            fn = None  # what the save kept alive goes now, not at the next save
            with self.lock:
                self.idle += 1
            fn = self.queue.get()


_waiters = _Waiters()


def _after_fork_in_child():
    # The parent's waiter threads do not exist in the child.
    global _waiters
    _waiters = _Waiters()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class PendingSave:
    """One committed save: its two futures, completed by a Python thread
    that waits in libckpt (without the GIL), and what must stay alive until
    the bytes are staged."""

    def __init__(self, handle, keepalive, path):
        # Made before ckpt_save_commit, started (start()) right after it:
        # once the commit has returned, the save's copy threads take the
        # CPUs, and on a machine with few of them the caller's thread may
        # wait for one in whatever it still has to do before returning.
        self.handle = handle
        self.staged = None
        self.committed = None
        self.keepalive = keepalive
        self.path = path
        self.staging_completion = concurrent.futures.Future()
        self.upload_completion = concurrent.futures.Future()
        self._staged_evt = threading.Event()
        for f in (self.staging_completion, self.upload_completion):
            f.set_running_or_notify_cancel()

    def start(self, staged, committed):
        """The commit succeeded: its futures are waited for from now on."""
        self.staged = staged
        self.committed = committed
        _client.track(self)
        _waiters.submit(self._run)

    def wait_staged(self, timeout):
        return self._staged_evt.wait(timeout)

    def _fail(self, fut, r):
        msg = (_lib.lib.ckpt_future_error(fut) or b"").decode("utf-8", "replace")
        return SaveError("save of %s failed: %s" % (self.path, msg or strerror(-r)), -r)

    def _run(self):
        lib = _lib.lib
        try:
            r = lib.ckpt_future_wait(self.staged, -1)
            self.keepalive = None  # the trainer's memory is no longer read
            self._staged_evt.set()
            _client.untrack(self)
            staged_err = self._fail(self.staged, r) if r < 0 else None
            if staged_err is not None:
                self.staging_completion.set_exception(staged_err)
            else:
                self.staging_completion.set_result(None)
            r = lib.ckpt_future_wait(self.committed, -1)
            if r < 0:
                self.upload_completion.set_exception(self._fail(self.committed, r))
            elif staged_err is not None:
                self.upload_completion.set_exception(staged_err)
            else:
                self.upload_completion.set_result(None)
        finally:
            self._staged_evt.set()
            _client.untrack(self)
            lib.ckpt_save_free(self.handle)
            self.handle = None


# struct ckpt_tensor as the platform's C compiler lays it out ("@": native
# sizes and alignment): size, dtype, name, shape, data, global_shape,
# offsets, ndim, device, device_index, replica, cuda_stream.
_TENSOR = struct.Struct("@IIPPPPPIIiIP")
assert _TENSOR.size == ctypes.sizeof(_lib.Tensor)


def _pack(tensors):
    """(array of struct ckpt_tensor for ckpt_save_add_tensors, what its
    pointers point into); tensors: tensor_item tuples."""
    names = [it[0].encode() for it in tensors]
    pool = b"\0".join(names) + b"\0"
    dims = array.array("Q")
    for it in tensors:
        dims.extend(it[2])
        if it[5]:  # a sharded 0-d tensor is not a thing: saved plain
            dims.extend(it[5])
            dims.extend(it[6])
    # bytes never move: the pool's address holds while it is referenced.
    nbase = ctypes.cast(ctypes.c_char_p(pool), ctypes.c_void_p).value
    dbase = dims.buffer_info()[0]
    size = _TENSOR.size
    buf = bytearray(size * len(tensors))
    pack = _TENSOR.pack_into
    pos = noff = doff = 0
    for nm, (_, dtype, shape, ptr, replica, gshape, offsets, device, index, stream) in zip(
            names, tensors):
        nd = len(shape)
        at_shape = dbase + 8 * doff if nd else 0
        doff += nd
        at_gshape = at_offs = 0
        if gshape:
            at_gshape = dbase + 8 * doff
            doff += len(gshape)
            at_offs = dbase + 8 * doff
            doff += len(offsets)
        pack(buf, pos, size, dtype, nbase + noff, at_shape, ptr, at_gshape, at_offs, nd, device,
             index, replica, stream)
        pos += size
        noff += len(nm) + 1
    return buf, (pool, dims)


# A function object of its own (CDLL's [] makes a new one, unlike the
# attribute), so that its argument types here leave _lib's alone.
_add_tensors_raw = _lib.lib["ckpt_save_add_tensors"]
_add_tensors_raw.restype = ctypes.c_int
_add_tensors_raw.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_last_pack = None  # (tensors, array, keepalive) of the last save of this process


def _add_tensors(handle, tensors):
    """Every tensor item to libckpt in one ckpt_save_add_tensors call (a
    ctypes call per tensor cost ~2.6 us each).  A trainer saves the same
    tensors (names, shapes, addresses) again and again: when the items
    equal the last save's, that save's array is passed again (libckpt
    copies what it needs during the call and changes nothing in it).  A
    failure is not raised here: the commit reports it again."""
    global _last_pack
    last = _last_pack
    if last is not None and last[0] == tensors:
        buf = last[1]
    else:
        buf, keep = _pack(tensors)
        # A copy of the list: a caller that changed its own list
        # afterwards must not find it equal to itself next time.
        _last_pack = last = (list(tensors), buf, keep)
    if tensors:
        arr = (ctypes.c_char * len(buf)).from_buffer(buf)
        _add_tensors_raw(handle, ctypes.addressof(arr), len(tensors))
        del arr
    del last  # not before the call above has returned


def save(client, root, name, step, tensors, blobs, metrics, metadata, keepalive,
         cuda_stream=None, dl_tables=()):
    """Begins, fills and commits one save of this rank.  tensors: tensor_item tuples;
    blobs: (key, bytes); dl_tables: (name, ckptd.data.ShardTable), each
    this rank's block of a data-loader table (ckpt_save_add_dl_table);
    returns a PendingSave.  Raises SaveError when libckpt refuses it
    (nothing is committed then)."""
    lib = _lib.lib
    opts = _lib.SaveOpts()
    opts.size = ctypes.sizeof(_lib.SaveOpts)
    opts.root = root.encode()
    opts.name = name.encode()
    opts.step = step
    h = ctypes.c_void_p()
    _check(lib.ckpt_save_begin_opts(client.handle, ctypes.byref(opts), ctypes.byref(h)),
           "cannot begin the save of %s/%s" % (root, name))
    handle = h.value
    try:
        for k, v in (metrics or {}).items():
            lib.ckpt_save_set_metric(handle, k.encode(), float(v))
        for k, v in (metadata or {}).items():
            lib.ckpt_save_set_metadata(handle, k.encode(), v.encode())
        if cuda_stream is not None:
            lib.ckpt_save_set_cuda_stream(handle, cuda_stream)
        _add_tensors(handle, tensors)
        bufs = []
        for key, table in dl_tables:
            buf, n = table._block()
            bufs.append(buf)
            lib.ckpt_save_add_dl_table(handle, key.encode(), buf, n, table.k, table.row0,
                                       table.n_shards, table.replica)
        for key, data in blobs:
            # bytes are immutable: libckpt reads them where they are (kept
            # alive in bufs until staged), no copy into a ctypes buffer.
            data = bytes(data)
            bufs.append(data)
            lib.ckpt_save_add_blob(handle, key.encode(), data if data else None, len(data))
        staged = ctypes.c_void_p()
        committed = ctypes.c_void_p()
        p = PendingSave(handle, (keepalive, bufs), "%s/%s" % (root, name))
        _check(lib.ckpt_save_commit(handle, ctypes.byref(staged), ctypes.byref(committed)),
               "ckptd refused the save of %s/%s" % (root, name))
    except BaseException:
        lib.ckpt_save_free(handle)
        raise
    p.start(staged.value, committed.value)
    return p


# ---- reading ----

class Reader:
    """An open committed checkpoint (libckpt reader)."""

    handle = None  # until opened: __del__ of one that failed to open has nothing to close

    def __init__(self, path=None, latest_root=None):
        self.handle = None
        h = ctypes.c_void_p()
        lib = _lib.lib
        if latest_root is not None:
            r = lib.ckpt_reader_open_latest(latest_root.encode(), ctypes.byref(h))
            what = latest_root
        else:
            r = lib.ckpt_reader_open(path.encode(), ctypes.byref(h))
            what = path
        if r < 0:
            msg = _lib.last_error() or strerror(-r)
            if -r == errno.EPROTONOSUPPORT:
                msg += " (written by a newer ckptd: upgrade this package to read it)"
            raise CheckpointError("cannot open checkpoint %s: %s" % (what, msg), -r)
        self.handle = h.value

    def close(self):
        if self.handle:
            _lib.lib.ckpt_reader_close(self.handle)
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __del__(self):
        self.close()

    @property
    def path(self):
        return _lib.lib.ckpt_reader_path(self.handle).decode()

    @property
    def step(self):
        return _lib.lib.ckpt_reader_step(self.handle)

    @property
    def world(self):
        return _lib.lib.ckpt_reader_world(self.handle)

    @property
    def time(self):
        return _lib.lib.ckpt_reader_time(self.handle).decode()

    def metadata(self, key):
        v = _lib.lib.ckpt_reader_metadata(self.handle, key.encode())
        return v.decode() if v is not None else None

    def metric(self, key):
        d = ctypes.c_double()
        if _lib.lib.ckpt_reader_metric(self.handle, key.encode(), ctypes.byref(d)) < 0:
            return None
        return d.value

    def tensor_names(self):
        lib = _lib.lib
        return [lib.ckpt_reader_tensor_name(self.handle, i).decode()
                for i in range(lib.ckpt_reader_tensor_count(self.handle))]

    def blob_names(self):
        lib = _lib.lib
        return [lib.ckpt_reader_blob_name(self.handle, i).decode()
                for i in range(lib.ckpt_reader_blob_count(self.handle))]

    def tensor_info(self, name):
        """(dtype name, global shape) or None."""
        dt = ctypes.c_int()
        nd = ctypes.c_uint()
        shape = (_lib.c_u64 * _lib.MAX_NDIM)()
        r = _lib.lib.ckpt_reader_tensor_info(self.handle, name.encode(), _lib.MAX_NDIM,
                                             ctypes.byref(dt), ctypes.byref(nd), shape)
        if r < 0:
            return None
        return _lib.DTYPES[dt.value] if dt.value < len(_lib.DTYPES) else None, \
            tuple(shape[i] for i in range(nd.value))

    def blob(self, key):
        lib = _lib.lib
        n = lib.ckpt_reader_blob_size(self.handle, key.encode())
        if n < 0:
            return None
        buf = ctypes.create_string_buffer(max(n, 1))
        r = lib.ckpt_reader_read_blob(self.handle, key.encode(), buf, n)
        if r < 0:
            raise CheckpointError("checkpoint %s: blob '%s': %s"
                                  % (self.path, key, _lib.last_error() or strerror(-r)), -r)
        return buf.raw[:n]


def meta_key(rank):
    return "%smeta/%d" % (META_PREFIX, rank)


def read_meta(reader, rank, raw=None):
    """The Python metadata a rank saved (raw: its blob, already read), or
    None if it saved none."""
    if raw is None:
        raw = reader.blob(meta_key(rank))
    if raw is None:
        return None
    try:
        meta = json.loads(raw.decode())
        fmt = meta["format"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError("checkpoint %s: its Python metadata (%s) is not valid: %s"
                              % (reader.path, meta_key(rank), e))
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise CheckpointError("checkpoint %s was saved by a newer ckptd package (Python "
                              "metadata format %r; this one reads up to %d): upgrade ckptd "
                              "to load it" % (reader.path, fmt, FORMAT))
    # The checkpoint is not trusted: what the loader indexes by must have
    # the types it expects, or the load stops here with a CheckpointError.
    if (not isinstance(meta.get("rank", 0), int) or
            any(not isinstance(meta.get(k, {}), dict) for k in ("tensors", "values", "blobs")) or
            any(not isinstance(v, dict) for v in meta.get("tensors", {}).values())):
        raise CheckpointError("checkpoint %s: its Python metadata (%s) is not valid: a field "
                              "has the wrong type" % (reader.path, meta_key(rank)))
    return meta


class LoadBox:
    __slots__ = ("name", "dtype", "global_shape", "offsets", "shape", "strides", "ptr",
                 "device", "device_index")

    def __init__(self, name, dtype, global_shape, ptr, offsets=None, shape=None,
                 strides=None, device=_lib.DEVICE_HOST, device_index=0):
        self.name = name
        self.dtype = dtype
        self.global_shape = global_shape
        self.offsets = offsets
        self.shape = shape
        self.strides = strides
        self.ptr = ptr
        self.device = device
        self.device_index = device_index


def load(reader, boxes, client=None, partial=False, blobs=()):
    """Fills every box, and reads every blob key of `blobs` the checkpoint
    has, in one load through the C planner (through the daemon when client
    is given, so from its memory where it holds the files).  Returns (the
    load's stats as a dict, {key: bytes}).  Raises CheckpointError; if the
    load failed after it started, the message lists the tensors that may
    hold partial bytes."""
    lib = _lib.lib
    got = {}
    h = ctypes.c_void_p()
    r = lib.ckpt_load_begin(reader.handle, _lib.LOAD_PARTIAL if partial else 0, ctypes.byref(h))
    if r < 0:
        raise CheckpointError("load of %s: %s" % (reader.path, _lib.last_error()), -r)
    ld = h.value
    try:
        t = _lib.LoadTensor()
        t.size = ctypes.sizeof(_lib.LoadTensor)
        d = _lib.LoadDst()
        d.size = ctypes.sizeof(_lib.LoadDst)
        t.n_dsts = 1
        t.dsts = ctypes.pointer(d)
        first_err = None
        for b in boxes:
            t.dtype = b.dtype
            t.name = b.name.encode()
            gs = _lib.u64s(b.global_shape)
            t.global_shape = gs
            t.ndim = len(b.global_shape)
            d.device = b.device
            d.device_index = b.device_index
            d.offsets = _lib.u64s(b.offsets) if b.offsets is not None else None
            d.shape = _lib.u64s(b.shape) if b.shape is not None else None
            d.strides = _lib.i64s(b.strides) if b.strides is not None else None
            d.data = b.ptr
            r = lib.ckpt_load_add_tensor(ld, ctypes.byref(t))
            if r < 0 and first_err is None:
                first_err = (r, _lib.last_error())
        for key in blobs:
            n = lib.ckpt_reader_blob_size(reader.handle, key.encode())
            if n < 0:
                continue
            buf = ctypes.create_string_buffer(max(n, 1))
            r = lib.ckpt_load_add_blob(ld, key.encode(), buf, n)
            if r < 0 and first_err is None:
                first_err = (r, _lib.last_error())
            got[key] = (buf, n)
        if client is not None:
            lib.ckpt_load_set_client(ld, client.handle)
        done = ctypes.c_void_p()
        r = lib.ckpt_load_start(ld, ctypes.byref(done))
        if r < 0:
            r, msg = first_err if first_err else (r, _lib.last_error())
            raise CheckpointError("cannot load %s: %s" % (reader.path, msg or strerror(-r)),
                                  -r)
        r = lib.ckpt_future_wait(done, -1)
        if r < 0:
            msg = (lib.ckpt_future_error(done) or b"").decode("utf-8", "replace")
            names = sorted({b.name for b in boxes}) or ["(none: only blobs were read)"]
            shown = ", ".join(names[:20]) + (" and %d more" % (len(names) - 20)
                                             if len(names) > 20 else "")
            raise CheckpointError(
                "load of %s failed: %s; the destination tensors may hold partial bytes: %s"
                % (reader.path, msg or strerror(-r), shown), -r)
        st = _lib.LoadStats()
        st.size = ctypes.sizeof(_lib.LoadStats)
        lib.ckpt_load_stats(ld, ctypes.byref(st))
        return ({k: getattr(st, k) for k, _ in _lib.LoadStats._fields_
                 if k not in ("size", "reserved", "reserved2")},
                {k: buf.raw[:n] for k, (buf, n) in got.items()})
    finally:
        lib.ckpt_load_free(ld)


def latest(root):
    """Path of the newest committed checkpoint under root (greatest step,
    then latest commit), or None when there is none."""
    root = os.fspath(root)
    if not root.startswith("s3://"):
        root = os.path.abspath(root)
    h = ctypes.c_void_p()
    r = _lib.lib.ckpt_reader_open_latest(root.encode(), ctypes.byref(h))
    if r == -errno.ENOENT and (not root.startswith("s3://") or
                               "no committed checkpoint" in _lib.last_error()):
        return None  # (on S3, -ENOENT is also a bucket that does not exist)
    if r < 0:
        raise CheckpointError("latest(%s): %s" % (root, _lib.last_error() or strerror(-r)), -r)
    try:
        return _lib.lib.ckpt_reader_path(h.value).decode()
    finally:
        _lib.lib.ckpt_reader_close(h.value)


class CheckpointInfo(tuple):
    """(path, name, step, time, metrics) of a committed checkpoint."""
    __slots__ = ()

    def __new__(cls, path, name, step, time, metrics):
        return tuple.__new__(cls, (path, name, step, time, metrics))

    path = property(lambda s: s[0])
    name = property(lambda s: s[1])
    step = property(lambda s: s[2])
    time = property(lambda s: s[3])
    metrics = property(lambda s: s[4])

    def __repr__(self):
        return "CheckpointInfo(path=%r, step=%d, time=%r)" % (self.path, self.step, self.time)


def list_checkpoints(root, metrics=()):
    """Committed checkpoints under root, oldest first (step, then commit
    time, then name).  One whose manifest does not parse is left out."""
    root = os.fspath(root)
    if not root.startswith("s3://"):
        root = os.path.abspath(root)
        if not os.path.isdir(root):
            return []
    names = []

    def add(_ud, name):
        # (ckptd names checkpoints in ASCII: a name that is not UTF-8 is
        # nobody's checkpoint, and an exception here would not cross C.)
        try:
            names.append(name.decode())
        except UnicodeDecodeError:
            pass
        return 0

    cb = _lib.LIST_FN(add)
    r = _lib.lib.ckpt_list(root.encode(), cb, None)
    if r < 0:
        raise CheckpointError("list(%s): %s" % (root, _lib.last_error() or strerror(-r)), -r)
    out = []
    for n in names:
        path = root.rstrip("/") + "/" + n
        try:
            rd = Reader(path)
        except CheckpointError:
            continue
        try:
            out.append(CheckpointInfo(path, n, rd.step, rd.time,
                                      {m: rd.metric(m) for m in metrics}))
        finally:
            rd.close()
    out.sort(key=lambda c: (c.step, c.time, c.name))
    return out
