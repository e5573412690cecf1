# SPDX-License-Identifier: MIT
"""The process's random number generators as a Stateful value of a ckptd
state, for exact resume:

    state = {"model": model, "optim": opt, "data": ckptd.data.LoaderState(loader),
             "rng": ckptd.rng.RNGState(), "step": step}

RNGState() saves and restores, per rank, the global generators a training
loop draws from: torch's CPU generator, the CUDA generators (when CUDA is
in use), numpy's global RandomState (numpy.random.*) and Python's `random`.
A numpy Generator (default_rng) or a torch.Generator of your own is an
object you hold: save its state yourself (generator.get_state(),
bit_generator.state).

Each rank saves its own states (as per-rank values, never as tensors that
ckptd would treat as replicated).  Loaded by the same world size, each rank
gets its own back.  Loaded by another world size, ckptd gives every rank
rank 0's values: the states are restored (so all ranks draw alike) and
`.restored_from` says whose they were; reseed per rank if that matters.

Importing this module imports nothing; torch and numpy are used only when
the program has imported them.
"""
import random
import struct
import sys

__all__ = ["RNGState"]


def _torch():
    return sys.modules.get("torch")


def _tensor_bytes(t):
    import ctypes
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _cuda_in_use(torch):
    try:
        return torch.cuda.is_available() and torch.cuda.is_initialized()
    except Exception:  # a build without CUDA support
        return False


class RNGState:
    """Stateful: state_dict() captures the generators now (call it, or let
    ckptd's save call it, at the save, in the training thread);
    load_state_dict() sets them.  Switch parts off with torch=False,
    cuda=False, numpy=False, python=False.

    After a load, .restored_from is the rank whose states were restored
    (None before a load)."""

    def __init__(self, *, torch=True, cuda=True, numpy=True, python=True, rank=None):
        self.parts = {"torch": torch, "cuda": cuda, "numpy": numpy, "python": python}
        self.rank = rank
        self.restored_from = None

    def _rank(self):
        if self.rank is not None:
            return self.rank
        torch = _torch()
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return 0

    def state_dict(self):
        # Every key is always present (None where a part is off or absent),
        # so a load finds the same names whatever this process has.
        sd = {"rank": self._rank(), "python": None, "python_gauss": None, "numpy": None,
              "numpy_pos": None, "numpy_has_gauss": None, "numpy_gauss": None,
              "torch": None, "cuda": None, "cuda_devices": 0}
        if self.parts["python"]:
            ver, internal, gauss = random.getstate()
            if ver != 3:
                raise ValueError("RNGState: Python's random state version %r (3 expected)"
                                 % (ver,))
            sd["python"] = struct.pack("<%dI" % len(internal), *internal)
            sd["python_gauss"] = gauss
        np = sys.modules.get("numpy")
        if self.parts["numpy"] and np is not None:
            name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
            if name != "MT19937":
                raise ValueError("RNGState: numpy's global generator is %r (MT19937 expected)"
                                 % (name,))
            sd["numpy"] = keys.astype("<u4").tobytes()
            sd["numpy_pos"] = int(pos)
            sd["numpy_has_gauss"] = int(has_gauss)
            sd["numpy_gauss"] = float(cached)
        torch = _torch()
        if torch is not None:
            if self.parts["torch"]:
                sd["torch"] = _tensor_bytes(torch.get_rng_state())
            if self.parts["cuda"] and _cuda_in_use(torch):
                states = torch.cuda.get_rng_state_all()
                sd["cuda"] = b"".join(_tensor_bytes(s) for s in states)
                sd["cuda_devices"] = len(states)
        return sd

    def load_state_dict(self, sd):
        if self.parts["python"] and sd.get("python") is not None:
            raw = sd["python"]
            random.setstate((3, struct.unpack("<%dI" % (len(raw) // 4), raw),
                             sd.get("python_gauss")))
        if self.parts["numpy"] and sd.get("numpy") is not None:
            import numpy as np
            np.random.set_state(("MT19937", np.frombuffer(sd["numpy"], dtype="<u4")
                                 .astype(np.uint32), int(sd["numpy_pos"]),
                                 int(sd["numpy_has_gauss"]), float(sd["numpy_gauss"])))
        torch = _torch()
        if torch is None and (sd.get("torch") is not None or sd.get("cuda") is not None):
            import torch
        if self.parts["torch"] and sd.get("torch") is not None:
            torch.set_rng_state(torch.frombuffer(bytearray(sd["torch"]), dtype=torch.uint8))
        n = int(sd.get("cuda_devices") or 0)
        if self.parts["cuda"] and sd.get("cuda") is not None and n > 0 and \
                torch.cuda.is_available():
            raw = sd["cuda"]
            each = len(raw) // n
            # set_rng_state is queued until CUDA initializes: no early init.
            for i in range(min(n, torch.cuda.device_count())):
                torch.cuda.set_rng_state(
                    torch.frombuffer(bytearray(raw[i * each:(i + 1) * each]), dtype=torch.uint8),
                    device=i)
        self.restored_from = sd.get("rank")
