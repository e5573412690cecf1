# SPDX-License-Identifier: MIT
"""Shared helpers of the torch baselines (bench/baselines/*.py).

The state built here has exactly the shapes that bench/ckpt_bench.c saves:
`tensors` 1-D fp32 tensors, `bytes` in all, sizes differing by at most one
element (the first `n % tensors` tensors get one more), named
"layer.NNNNNN.weight".  Only the standard library is imported at module level,
so run.py can read the argument helpers without torch.
"""
import json
import os
import shutil
import sys
import tempfile


def setup_env(threads, gpu=False):
    """Pins the baselines to the CPU (unless gpu) and to a sane thread
    count.  Must run before torch is imported (CUDA_VISIBLE_DEVICES is read
    at CUDA init, the OpenMP pool size at import)."""
    if not gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))


def element_counts(nbytes, tensors):
    if nbytes % 4:
        raise SystemExit("bytes must be a multiple of 4 (fp32)")
    n = nbytes // 4
    if n < tensors:
        raise SystemExit("too few bytes for %d tensors" % tensors)
    per, extra = divmod(n, tensors)
    return [per + (1 if i < extra else 0) for i in range(tensors)]


def make_state(nbytes, tensors, prefix=""):
    """A dict name -> fp32 tensor, every page touched (as the C bench does
    before its first save)."""
    import torch

    sd = {}
    for i, n in enumerate(element_counts(nbytes, tensors)):
        t = torch.empty(n, dtype=torch.float32)
        t.fill_(float(i % 1000) * 0.5)
        sd["%slayer.%06d.weight" % (prefix, i)] = t
    return sd


def mutate(sd, step):
    """One training step's worth of change: one element per tensor."""
    for t in sd.values():
        t[0] += 1.0 + step


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path):
    """fsync every file and directory under path, then path's parent."""
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            fsync_path(os.path.join(dirpath, f))
        fsync_path(dirpath)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def drop_tree(path, flush=False):
    """Every file under path dropped from the page cache (DONTNEED drops
    clean pages only: flush writes dirty ones back first with fdatasync;
    without it the caller has made them clean, e.g. by an fsync).
    Returns (files, bytes)."""
    files = size = 0
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if flush:
                    os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                size += os.fstat(fd).st_size
                files += 1
            finally:
                os.close(fd)
    return files, size


def gloo_alone(dist, work_dir, prefix):
    """torch.distributed initialised as a job of one rank (gloo, a file
    store in a fresh directory under work_dir), as DCP wants a process
    group.  Returns the store's directory (the caller removes it)."""
    store = tempfile.mkdtemp(prefix=prefix, dir=work_dir)
    try:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(store, "store"),
                                rank=0, world_size=1)
    except BaseException:
        shutil.rmtree(store, ignore_errors=True)
        raise
    return store


def cpus():
    """CPUs this process may run on (its affinity mask), as the library
    counts them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def emit(obj):
    """One result: one JSON object on one line of stdout."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def log(msg):
    sys.stderr.write("  [%s] %s\n" % (os.path.basename(sys.argv[0]), msg))
    sys.stderr.flush()
