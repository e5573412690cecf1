#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""st_verify.py - check a ckptd checkpoint with an independent reader.

Usage: st_verify.py CKPT_DIR SPEC.json

Opens every rank-*.safetensors file of the checkpoint directory with the
`safetensors` library (safe_open with the numpy framework; dtypes numpy has no
type for, such as BF16 and the F8 types, through safetensors.deserialize,
which returns the raw bytes), and compares each tensor with SPEC, written by
the C integration test (tests/lib/testd.c, td_spec_add):

  [{"file": "rank-00000.safetensors", "name": "w", "dtype": "F32",
    "shape": [chunk shape], "global_shape": [...], "offsets": [...],
    "seed": 7}, ...]

The bytes of the global tensor are the deterministic stream of `seed`
(td_fill in testd.c); a chunk holds the sub-box of the global tensor at
`offsets` with `shape`.  Every file must hold exactly the tensors SPEC lists
for it (so a replica that must not be written is caught), with that dtype,
shape and bytes.  It also checks the layout rule of ARCHITECTURE.md: tensor
data starts on a 4 KiB boundary.

Exit 0 and one summary line if everything matches, 1 with one line per
problem otherwise, 2 on usage errors.
"""
import glob
import json
import os
import struct
import sys

import numpy as np
from safetensors import safe_open
import safetensors

C1 = 0x9E3779B97F4A7C15
C2 = 0xC2B2AE3D27D4EB4F
MASK = (1 << 64) - 1

ELEM = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4,
        "I64": 8, "U64": 8, "F16": 2, "BF16": 2, "F32": 4, "F64": 8,
        "F8_E4M3": 1, "F8_E5M2": 1}
# dtypes safe_open(framework="numpy") can hand back as arrays
NUMPY_OK = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
            "F16", "F32", "F64"}


def stream(seed, nbytes):
    """Bytes [0, nbytes) of the pattern stream of `seed`, as uint8."""
    nwords = (nbytes + 7) // 8
    k = np.arange(1, nwords + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = k * np.uint64(C1) + np.uint64((seed * C2) & MASK)
    x ^= x >> np.uint64(31)
    return x.astype("<u8").view(np.uint8)[:nbytes]


def expected_chunk(t):
    elem = ELEM[t["dtype"]]
    gshape = t["global_shape"]
    shape = t["shape"]
    offs = t["offsets"]
    if len(gshape) == 0:
        return stream(t["seed"], elem)
    total = elem
    for d in gshape:
        total *= d
    g = stream(t["seed"], total).reshape(list(gshape) + [elem])
    box = tuple(slice(o, o + s) for o, s in zip(offs, shape))
    return np.ascontiguousarray(g[box]).reshape(-1)


def check_file(path, want, problems):
    """Compares one shard file with its expected tensors (name -> spec)."""
    fname = os.path.basename(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) != 8:
        problems.append(f"{fname}: shorter than 8 bytes")
        return 0
    (hlen,) = struct.unpack("<Q", head)
    if (8 + hlen) % 4096 != 0:
        problems.append(f"{fname}: data starts at {8 + hlen}, not on a 4 KiB boundary")

    raw = None
    checked = 0
    with safe_open(path, framework="numpy") as h:
        names = set(h.keys())
        for extra in sorted(names - set(want)):
            problems.append(f"{fname}: unexpected tensor {extra!r}")
        for missing in sorted(set(want) - names):
            problems.append(f"{fname}: tensor {missing!r} is missing")
        for name in sorted(names & set(want)):
            t = want[name]
            sl = h.get_slice(name)
            dtype = sl.get_dtype()
            shape = list(sl.get_shape())
            if dtype != t["dtype"]:
                problems.append(f"{fname}: {name!r} has dtype {dtype}, expected {t['dtype']}")
                continue
            if shape != list(t["shape"]):
                problems.append(f"{fname}: {name!r} has shape {shape}, expected {t['shape']}")
                continue
            if dtype in NUMPY_OK:
                arr = h.get_tensor(name)
                got = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            else:
                if raw is None:
                    with open(path, "rb") as f:
                        raw = {n: d for n, d in safetensors.deserialize(f.read())}
                got = np.frombuffer(bytes(raw[name]["data"]), dtype=np.uint8)
            exp = expected_chunk(t)
            if got.size != exp.size:
                problems.append(f"{fname}: {name!r} holds {got.size} bytes, expected {exp.size}")
                continue
            diff = np.nonzero(got != exp)[0]
            if diff.size:
                problems.append(f"{fname}: {name!r} differs at {diff.size} bytes, first at byte {int(diff[0])}")
                continue
            checked += 1
    return checked


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    ckpt, spec_path = argv[1], argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    by_file = {}
    for t in spec:
        by_file.setdefault(t["file"], {})
        if t["name"] in by_file[t["file"]]:
            print(f"spec lists {t['name']!r} twice for {t['file']}", file=sys.stderr)
            return 2
        by_file[t["file"]][t["name"]] = t

    problems = []
    files = sorted(glob.glob(os.path.join(ckpt, "rank-*.safetensors")))
    if not files:
        problems.append(f"{ckpt}: no rank-*.safetensors files")
    present = {os.path.basename(p) for p in files}
    for missing in sorted(set(by_file) - present):
        problems.append(f"{missing}: file is missing")
    checked = 0
    for path in files:
        try:
            checked += check_file(path, by_file.get(os.path.basename(path), {}), problems)
        except Exception as e:  # the library refused the file: that is the finding
            problems.append(f"{os.path.basename(path)}: safetensors could not read it: {e}")
    if problems:
        for p in problems:
            print("FAIL:", p)
        return 1
    print(f"OK: {checked} tensors in {len(files)} safetensors files match "
          f"(safetensors {safetensors.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
