# SPDX-License-Identifier: MIT
"""ckptd: asynchronous checkpoints through the per-node ckptd daemon.

This module needs no framework: importing it does not import torch.  The
PyTorch API is in ckptd.torch (async_save, save, load), data-loader helpers
in ckptd.data, RNG state in ckptd.rng.

    ckptd.latest(root)    the newest committed checkpoint under root, or None
    ckptd.list(root)      every committed checkpoint under root, oldest first
    ckptd.configure(...)  socket, job id, arena size, resident images
"""
from ._errors import CkptdError, DaemonNotRunning, SaveError, CheckpointError
from ._client import configure
from ._engine import CheckpointInfo, latest as _latest, list_checkpoints as _list
from . import _lib

__version__ = "0.6.0"
__all__ = ["CkptdError", "DaemonNotRunning", "SaveError", "CheckpointError", "configure",
           "latest", "list", "CheckpointInfo", "libckpt_version", "libckpt_path"]


def latest(root):
    """Path of the newest committed checkpoint directly under root (a
    directory or s3://bucket/prefix): the greatest step, then the latest
    commit.  None when root holds none."""
    return _latest(root)


def list(root, *, metrics=()):  # noqa: A001 - the name users expect
    """The committed checkpoints directly under root, oldest first, as
    CheckpointInfo(path, name, step, time, metrics): metrics holds the
    values of the metric names asked for (None where one has none)."""
    return _list(root, metrics)


def libckpt_version():
    """The version of the libckpt this package runs on."""
    return _lib.lib.ckpt_version().decode()


def libckpt_path():
    """Where that libckpt was loaded from."""
    return _lib.path
