# SPDX-License-Identifier: MIT
"""Datasets that carry their DataLoader worker's RNG states in their state
(ckptd.data.worker_rng).  Needs torch; imported only when used.

torchdata's StatefulDataLoader asks a worker's dataset for state_dict()
after every batch it fetches and sends it with that batch; the main process
keeps the state of the last batch the loop took.  A resumed worker is
seeded from base_seed + worker id as usual and then given that state
(load_state_dict), which here puts its RNGs back: the next batch it fetches
draws what the uninterrupted worker drew for it.
"""
import ctypes
import random
import struct
import sys

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


def _stateful(v):
    return callable(getattr(v, "state_dict", None)) and \
        callable(getattr(v, "load_state_dict", None))


def rng_state():
    """This process's torch, numpy (if imported) and random states, as
    bytes and ints."""
    t = torch.get_rng_state()
    ver, internal, gauss = random.getstate()
    st = {"torch": ctypes.string_at(t.data_ptr(), t.numel()),
          "python": {"version": ver, "state": struct.pack("<%dI" % len(internal), *internal),
                     "gauss": gauss}}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        st["numpy"] = {"name": name, "keys": keys.astype("<u4").tobytes(), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(cached)}
    return st


def set_rng_state(st):
    torch.set_rng_state(torch.frombuffer(bytearray(st["torch"]), dtype=torch.uint8))
    py = st["python"]
    raw = py["state"]
    random.setstate((py["version"], struct.unpack("<%dI" % (len(raw) // 4), raw), py["gauss"]))
    if "numpy" in st:
        import numpy as np
        n = st["numpy"]
        np.random.set_state((n["name"], np.frombuffer(n["keys"], dtype="<u4").astype(np.uint32),
                             n["pos"], n["has_gauss"], n["gauss"]))


class _WithRNG:
    def __init__(self, dataset):
        self.dataset = dataset

    def __getattr__(self, name):
        if name == "dataset":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def state_dict(self):
        sd = {}
        if _stateful(self.dataset):
            sd["dataset"] = self.dataset.state_dict()
        if get_worker_info() is not None:
            sd["rng"] = rng_state()
        return sd

    def load_state_dict(self, sd):
        if "dataset" in sd and _stateful(self.dataset):
            self.dataset.load_state_dict(sd["dataset"])
        if "rng" in sd and get_worker_info() is not None:
            set_rng_state(sd["rng"])


class MapWithRNG(_WithRNG, Dataset):
    def __getitem__(self, i):
        return self.dataset[i]

    def __len__(self):
        return len(self.dataset)


class IterableWithRNG(_WithRNG, IterableDataset):
    def __iter__(self):
        return iter(self.dataset)


def wrap(dataset):
    if isinstance(dataset, IterableDataset):
        return IterableWithRNG(dataset)
    return MapWithRNG(dataset)
