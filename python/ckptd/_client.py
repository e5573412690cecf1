# SPDX-License-Identifier: MIT
"""The process's connections to ckptd, made on first use and reused.

One connection per (socket, job, rank, world, resident): a trainer normally
has exactly one.  After fork() the child never touches its parent's
connections (their library threads do not exist in the child): they are
forgotten, and the child connects anew if it saves.  At interpreter exit
every save in flight is waited for until it is staged (from then on ckptd
owns its bytes and finishes the commit on its own), then the connections
are closed.
"""
import atexit
import ctypes
import errno
import hashlib
import os
import re
import sys
import threading
import time

from . import _lib
from ._errors import DaemonNotRunning, CkptdError, strerror

_DEFAULT_SOCKET = "/run/ckptd/ckptd.sock"
_lock = threading.Lock()
_clients = {}
_inflight = set()  # saves not yet staged (their waiter objects)
_settings = {}
_pid = os.getpid()


def configure(*, socket=None, job=None, arena_bytes=None, resident=None, copy_threads=None,
              connect_timeout_s=None):
    """Process-wide settings for connections made from now on (a connection
    already made keeps its own).  None leaves a setting as it is.

    socket        ckptd's socket; default $CKPTD_SOCKET, else /run/ckptd/ckptd.sock
    job           the job id shared by all ranks ([A-Za-z0-9._-], <= 128);
                  default $CKPTD_JOB, else derived from the checkpoint root
    arena_bytes   staging arena to ask for (int, or "4G"); default
                  $CKPTD_ARENA, else libckpt's 1 GiB.  A state larger than the
                  arena still saves: staging waits for ckptd to drain.
    resident      keep this rank's newest checkpoint in ckptd's memory, so a
                  restart after a crash loads from there (default
                  $CKPTD_RESIDENT=1, else off)
    copy_threads  host copy threads (default: libckpt's choice)
    """
    for k, v in (("socket", socket), ("job", job), ("arena_bytes", arena_bytes),
                 ("resident", resident), ("copy_threads", copy_threads),
                 ("connect_timeout_s", connect_timeout_s)):
        if v is not None:
            _settings[k] = v


def _parse_size(v, what):
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 0:
            raise ValueError("%s: %d is negative" % (what, v))
        return v
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", str(v), re.I)
    if not m:
        raise ValueError("%s: '%s' is not a size (bytes, or a number with K, M, G or T)"
                         % (what, v))
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def socket_path():
    return _settings.get("socket") or os.environ.get("CKPTD_SOCKET") or _DEFAULT_SOCKET


_JOB_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


_jobs = {}  # root -> its derived job id (hashing it on every save cost ~50 us)


def job_for(root):
    job = _settings.get("job") or os.environ.get("CKPTD_JOB")
    if job:
        if not _JOB_RE.fullmatch(job):
            raise ValueError("job id '%s' must be 1..128 of [A-Za-z0-9._-] (set by "
                             "ckptd.configure(job=...) or $CKPTD_JOB)" % job)
        return job
    # Every rank saves under the same root, so the root names the job.
    job = _jobs.get(root)
    if job is None:
        job = "py-" + hashlib.sha256(os.path.abspath(root).encode()
                                     if "://" not in root else root.encode()).hexdigest()[:20]
        _jobs[root] = job
    return job


class Client:
    def __init__(self, handle, key):
        self.handle = handle
        self.key = key
        self.pid = os.getpid()

    @property
    def arena_bytes(self):
        return _lib.lib.ckpt_client_arena_bytes(self.handle)


def _after_fork_in_child():
    # The parent's clients belong to the parent: their threads are gone
    # here and their sockets are shared with it.  Forget them without a
    # word to the daemon; a save from the child connects anew.
    global _pid
    _pid = os.getpid()
    _clients.clear()
    _inflight.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def get(rank, world, root):
    """The connection for rank/world of the job of `root`, made if needed.
    Raises DaemonNotRunning when no ckptd answers."""
    sock = socket_path()
    job = job_for(root)
    resident = _settings.get("resident")
    if resident is None:
        resident = os.environ.get("CKPTD_RESIDENT", "") not in ("", "0")
    key = (sock, job, rank, world, bool(resident))
    with _lock:
        c = _clients.get(key)
        if c is not None and c.pid == os.getpid():
            return c
        opts = _lib.ConnectOpts()
        opts.size = ctypes.sizeof(_lib.ConnectOpts)
        opts.rank = rank
        opts.world = world
        arena = _settings.get("arena_bytes") or os.environ.get("CKPTD_ARENA")
        if arena:
            opts.arena_bytes = _parse_size(arena, "arena size")
        threads = _settings.get("copy_threads")
        if threads:
            opts.copy_threads = int(threads)
        t = _settings.get("connect_timeout_s")
        if t is not None:
            opts.timeout_ms = max(1, int(t * 1000))
        opts.socket_path = sock.encode()
        opts.job = job.encode()
        opts.run = None
        opts.flags = _lib.CONNECT_RESIDENT if resident else 0
        h = ctypes.c_void_p()
        r = _lib.lib.ckpt_connect(ctypes.byref(opts), ctypes.byref(h))
        if r < 0:
            msg = _lib.last_error()
            if -r in (errno.ENOENT, errno.ECONNREFUSED, errno.ETIMEDOUT):
                raise DaemonNotRunning(
                    "no ckptd answers on %s (%s). Start one: `systemctl start ckptd` on a "
                    "node where it is installed, or `ckptd -c <config>` by hand; point "
                    "$CKPTD_SOCKET (or ckptd.configure(socket=...)) at its socket"
                    % (sock, msg or strerror(-r)), -r)
            if -r == errno.EACCES:
                raise DaemonNotRunning("ckptd on %s refused this process: %s"
                                       % (sock, msg or strerror(-r)), -r)
            raise CkptdError("cannot connect to ckptd on %s: %s" % (sock, msg or strerror(-r)),
                             -r)
        c = Client(h.value, key)
        _clients[key] = c
        return c


def drop(client):
    """Forgets a connection that was lost (the daemon stopped or
    restarted): the next get() connects anew.  Its handle is freed."""
    with _lock:
        if _clients.get(client.key) is client:
            del _clients[client.key]
        else:
            return
    if client.pid == os.getpid():
        _lib.lib.ckpt_disconnect(client.handle)


def try_get(rank, world, root):
    """As get(), None when no daemon runs (loads then read by themselves)."""
    try:
        return get(rank, world, root)
    except DaemonNotRunning:
        return None


def track(save):
    with _lock:
        _inflight.add(save)


def untrack(save):
    with _lock:
        _inflight.discard(save)


def _at_exit():
    # Saves in flight: wait until each is staged (ckptd then owns the bytes
    # and commits on its own), saying so when it takes long.
    with _lock:
        pending = list(_inflight)
    warned = False
    t0 = time.monotonic()
    for s in pending:
        while not s.wait_staged(1.0):
            if not warned and time.monotonic() - t0 > 5:
                print("ckptd: interpreter exit waits for %d save(s) in flight to be staged"
                      % len(pending), file=sys.stderr)
                warned = True
    with _lock:
        clients = [c for c in _clients.values() if c.pid == os.getpid()]
        _clients.clear()
    for c in clients:
        _lib.lib.ckpt_disconnect(c.handle)


atexit.register(_at_exit)
