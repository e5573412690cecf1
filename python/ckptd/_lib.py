# SPDX-License-Identifier: MIT
"""ctypes binding of libckpt's public ABI (include/ckpt.h), nothing else.

Which libckpt is loaded, first match wins:
  1. $CKPTD_LIBCKPT, a path to a libckpt.so (an installed one, say
     /usr/local/lib/libckpt.so.0): it must be 0.6 or later;
  2. the copy bundled in this package (ckptd/_lib/libckpt.so.0, put there by
     `make wheel` or `pip install ./python`);
  3. in a source checkout, $CKPT_BUILD_DIR/libckpt.so or <repo>/build/libckpt.so.

ctypes releases the GIL around every foreign call, so a thread waiting on a
future in ckpt_future_wait() does not hold up the interpreter.  libckpt never
calls back into Python from its own threads: the only callback used here
(ckpt_list's) runs on the calling thread.
"""
import ctypes
import os

c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_i32 = ctypes.c_int32
c_i64 = ctypes.c_int64
c_p = ctypes.c_void_p
c_str = ctypes.c_char_p

# enum ckpt_dtype, in the header's order (append-only).
DTYPES = ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16",
          "F32", "F64", "F8_E4M3", "F8_E5M2"]
DTYPE = {name: i for i, name in enumerate(DTYPES)}
DEVICE_HOST = 0
DEVICE_CUDA = 1
CONNECT_RESIDENT = 0x1
LOAD_PARTIAL = 0x1
MAX_NAME_LEN = 128
MAX_ITEM_NAME = 512
MAX_NDIM = 16


class ConnectOpts(ctypes.Structure):
    _fields_ = [("size", c_u32), ("rank", c_u32), ("world", c_u32), ("copy_threads", c_u32),
                ("arena_bytes", c_u64), ("timeout_ms", c_i64), ("socket_path", c_str),
                ("job", c_str), ("run", c_str), ("cuda_pin", ctypes.c_int), ("flags", c_u32)]


class SaveOpts(ctypes.Structure):
    _fields_ = [("size", c_u32), ("flags", c_u32), ("root", c_str), ("name", c_str),
                ("step", c_u64)]


class Tensor(ctypes.Structure):
    _fields_ = [("size", c_u32), ("dtype", ctypes.c_int), ("name", c_str),
                ("shape", ctypes.POINTER(c_u64)), ("data", c_p),
                ("global_shape", ctypes.POINTER(c_u64)), ("offsets", ctypes.POINTER(c_u64)),
                ("ndim", c_u32), ("device", ctypes.c_int), ("device_index", c_i32),
                ("replica", c_u32), ("cuda_stream", c_p)]


class LoadDst(ctypes.Structure):
    _fields_ = [("size", c_u32), ("device", ctypes.c_int), ("device_index", c_i32),
                ("reserved", c_u32), ("offsets", ctypes.POINTER(c_u64)),
                ("shape", ctypes.POINTER(c_u64)), ("strides", ctypes.POINTER(c_i64)),
                ("data", c_p)]


class LoadTensor(ctypes.Structure):
    _fields_ = [("size", c_u32), ("dtype", ctypes.c_int), ("name", c_str),
                ("global_shape", ctypes.POINTER(c_u64)), ("ndim", c_u32), ("n_dsts", c_u32),
                ("dsts", ctypes.POINTER(LoadDst))]


class LoadStats(ctypes.Structure):
    _fields_ = [("size", c_u32), ("missing", c_u32), ("bytes_wanted", c_u64),
                ("bytes_read", c_u64), ("reads", c_u64), ("bytes_resident", c_u64),
                ("files_resident", c_u32), ("reserved", c_u32), ("bytes_daemon", c_u64),
                ("bytes_shared", c_u64), ("bytes_local", c_u64), ("files_local", c_u32),
                ("reserved2", c_u32)]


LIST_FN = ctypes.CFUNCTYPE(ctypes.c_int, c_p, c_str)

# name: (restype, argtypes)
_SIGS = {
    "ckpt_version": (c_str, []),
    "ckpt_last_error": (c_str, []),
    "ckpt_dtype_size": (ctypes.c_size_t, [ctypes.c_int]),
    "ckpt_connect": (ctypes.c_int, [ctypes.POINTER(ConnectOpts), ctypes.POINTER(c_p)]),
    "ckpt_disconnect": (None, [c_p]),
    "ckpt_client_arena_bytes": (c_u64, [c_p]),
    "ckpt_save_begin_opts": (ctypes.c_int, [c_p, ctypes.POINTER(SaveOpts), ctypes.POINTER(c_p)]),
    "ckpt_save_set_metadata": (ctypes.c_int, [c_p, c_str, c_str]),
    "ckpt_save_set_metric": (ctypes.c_int, [c_p, c_str, ctypes.c_double]),
    "ckpt_save_add_tensor": (ctypes.c_int, [c_p, ctypes.POINTER(Tensor)]),
    "ckpt_save_add_tensors": (ctypes.c_int, [c_p, ctypes.POINTER(Tensor), ctypes.c_size_t]),
    "ckpt_save_add_blob": (ctypes.c_int, [c_p, c_str, c_p, ctypes.c_size_t]),
    "ckpt_save_set_cuda_stream": (ctypes.c_int, [c_p, c_p]),
    "ckpt_save_commit": (ctypes.c_int, [c_p, ctypes.POINTER(c_p), ctypes.POINTER(c_p)]),
    "ckpt_save_durable": (c_p, [c_p]),
    "ckpt_save_free": (None, [c_p]),
    "ckpt_future_poll": (ctypes.c_int, [c_p]),
    "ckpt_future_wait": (ctypes.c_int, [c_p, c_i64]),
    "ckpt_future_error": (c_str, [c_p]),
    "ckpt_reader_open": (ctypes.c_int, [c_str, ctypes.POINTER(c_p)]),
    "ckpt_reader_open_latest": (ctypes.c_int, [c_str, ctypes.POINTER(c_p)]),
    "ckpt_reader_close": (None, [c_p]),
    "ckpt_reader_step": (c_u64, [c_p]),
    "ckpt_reader_world": (c_u32, [c_p]),
    "ckpt_reader_tensor_count": (ctypes.c_size_t, [c_p]),
    "ckpt_reader_tensor_name": (c_str, [c_p, ctypes.c_size_t]),
    "ckpt_reader_tensor_info": (ctypes.c_int, [c_p, c_str, ctypes.c_size_t,
                                               ctypes.POINTER(ctypes.c_int),
                                               ctypes.POINTER(ctypes.c_uint),
                                               ctypes.POINTER(c_u64)]),
    "ckpt_reader_read_tensor": (ctypes.c_int, [c_p, c_str, c_p, ctypes.c_size_t]),
    "ckpt_reader_blob_count": (ctypes.c_size_t, [c_p]),
    "ckpt_reader_blob_name": (c_str, [c_p, ctypes.c_size_t]),
    "ckpt_reader_blob_size": (c_i64, [c_p, c_str]),
    "ckpt_reader_read_blob": (ctypes.c_int, [c_p, c_str, c_p, ctypes.c_size_t]),
    "ckpt_reader_path": (c_str, [c_p]),
    "ckpt_reader_time": (c_str, [c_p]),
    "ckpt_reader_metadata": (c_str, [c_p, c_str]),
    "ckpt_reader_metric": (ctypes.c_int, [c_p, c_str, ctypes.POINTER(ctypes.c_double)]),
    "ckpt_list": (ctypes.c_int, [c_str, LIST_FN, c_p]),
    "ckpt_load_begin": (ctypes.c_int, [c_p, c_u32, ctypes.POINTER(c_p)]),
    "ckpt_load_add_tensor": (ctypes.c_int, [c_p, ctypes.POINTER(LoadTensor)]),
    "ckpt_load_add_blob": (ctypes.c_int, [c_p, c_str, c_p, ctypes.c_size_t]),
    "ckpt_load_set_client": (ctypes.c_int, [c_p, c_p]),
    "ckpt_load_start": (ctypes.c_int, [c_p, ctypes.POINTER(c_p)]),
    "ckpt_load_stats": (ctypes.c_int, [c_p, ctypes.POINTER(LoadStats)]),
    "ckpt_load_free": (None, [c_p]),
    "ckpt_dl_first": (ctypes.c_int, [c_u64, c_u32, c_u32, ctypes.POINTER(ctypes.POINTER(c_i64)),
                                     ctypes.POINTER(c_u64), ctypes.POINTER(c_u64)]),
    "ckpt_save_add_dl_table": (ctypes.c_int, [c_p, c_str, ctypes.POINTER(c_i64), c_u64, c_u32,
                                              c_u64, c_u64, c_u32]),
    "ckpt_dl_restore": (ctypes.c_int, [c_p, c_str, c_u32, c_u32,
                                       ctypes.POINTER(ctypes.POINTER(c_i64)),
                                       ctypes.POINTER(c_u64), ctypes.POINTER(c_u32),
                                       ctypes.POINTER(c_u64), ctypes.POINTER(ctypes.c_bool)]),
}

_here = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("CKPTD_LIBCKPT")
    if env:
        return [("$CKPTD_LIBCKPT", env)]
    out = [("bundled", os.path.join(_here, "_lib", "libckpt.so.0"))]
    build = os.environ.get("CKPT_BUILD_DIR")
    if build:
        out.append(("$CKPT_BUILD_DIR", os.path.join(build, "libckpt.so")))
    repo = os.path.dirname(os.path.dirname(_here))
    out.append(("source checkout", os.path.join(repo, "build", "libckpt.so")))
    return out


def _load():
    tried = []
    for how, path in _candidates():
        if not os.path.exists(path):
            tried.append("%s (%s): not found" % (path, how))
            continue
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, how, e))
            continue
        missing = [n for n in _SIGS if not hasattr(lib, n)]
        if missing:
            tried.append("%s (%s): too old, lacks %s (libckpt 0.6 or later needed)"
                         % (path, how, ", ".join(missing[:3])))
            continue
        for name, (res, args) in _SIGS.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        return lib, path
    hint = ""
    if any("libcurl.so.4" in t for t in tried):
        # The wheel bundles everything else libckpt needs; libcurl is the
        # system's (see the Makefile's python-lib target).
        hint = "\nlibckpt needs the system's libcurl: on Debian/Ubuntu `apt-get install libcurl4`"
    raise ImportError("ckptd: cannot load libckpt; tried:\n  " + "\n  ".join(tried) + hint +
                      "\nInstall the ckptd wheel (it bundles libckpt), or set CKPTD_LIBCKPT "
                      "to the path of a libckpt.so 0.6 or later")


lib, path = _load()


def last_error():
    s = lib.ckpt_last_error()
    return s.decode("utf-8", "replace") if s else ""


def u64s(values):
    """A ctypes uint64 array of values (None for an empty sequence's NULL
    is not used: a 0-d shape is passed as a NULL pointer with ndim 0)."""
    n = len(values)
    if n == 0:
        return None
    return (c_u64 * n)(*values)


def i64s(values):
    n = len(values)
    if n == 0:
        return None
    return (c_i64 * n)(*values)
