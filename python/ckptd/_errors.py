# SPDX-License-Identifier: MIT
"""The exceptions of the ckptd package."""
import errno as _errno
import os


class CkptdError(Exception):
    """Base of ckptd's errors.  .errno is libckpt's errno (positive) when a C
    call failed, else None."""

    def __init__(self, message, errno=None):
        super().__init__(message)
        self.errno = errno


class DaemonNotRunning(CkptdError, ConnectionError):
    """No ckptd answers on the socket (or it refused this process)."""


class SaveError(CkptdError):
    """A save failed: refused by ckptd, another rank failed, the deadline
    passed, the daemon went away.  The message is ckptd's."""


class CheckpointError(CkptdError):
    """A checkpoint is missing, corrupt, of a newer format, or does not match
    the state it is loaded into.  The message names the file, tensor and
    offset where libckpt knows them."""


def strerror(err):
    try:
        return os.strerror(err)
    except ValueError:
        return "error %d" % err


def _errname(err):
    return _errno.errorcode.get(err, str(err))
