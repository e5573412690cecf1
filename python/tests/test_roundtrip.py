# SPDX-License-Identifier: MIT
"""Round trips through a real ckptd: every dtype and shape torch has,
numpy arrays, nested containers, Stateful objects, values and blobs; what
is refused before anything is sent; the shards open with safetensors."""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import ckptd
import ckptd.torch as ct
from conftest import wait_for


def _bits(t):
    """A tensor's bytes, for exact comparison whatever its dtype (NaNs and
    -0.0 included)."""
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _random_of(dtype, shape, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        if dtype.itemsize == 1:  # the fp8 family: random bytes are values
            return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).view(dtype)
        t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        if t.numel() > 2:
            t.view(-1)[0] = float("nan")
            t.view(-1)[1] = -0.0
        return t
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -2**62), min(info.max, 2**62)
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype) \
        if dtype not in (torch.uint64,) else \
        torch.randint(0, 2**62, shape, generator=gen, dtype=torch.int64).view(torch.uint64)


DTYPES = [d for d in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    getattr(torch, "uint16", None), getattr(torch, "uint32", None), getattr(torch, "uint64", None),
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128, getattr(torch, "complex32", None),
    getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None),
    getattr(torch, "float8_e4m3fnuz", None), getattr(torch, "float8_e5m2fnuz", None),
    getattr(torch, "float8_e8m0fnu", None)) if d is not None]


def _shapes(dtype, gen):
    """Named tensors of dtype: 0-d, empty, 1-d, non-contiguous, a view."""
    base = _random_of(dtype, (6, 5), gen)
    return {
        "scalar": _random_of(dtype, (), gen),
        "empty": _random_of(dtype, (0, 3), gen),
        "vector": _random_of(dtype, (7,), gen),
        "transposed": base.t(),                 # non-contiguous
        "rows": base[2:5],                      # a contiguous view at an offset
        "strided": base[::2, 1::2],             # a strided view
        "big": _random_of(dtype, (3, 1000), gen),
    }


def test_every_dtype_and_shape(daemon):
    gen = torch.Generator().manual_seed(1)
    state = {str(d).replace("torch.", ""): _shapes(d, gen) for d in DTYPES}
    cid = os.path.join(daemon.root, "dtypes")
    ct.save(state, checkpoint_id=cid, step=3)
    dest = {k: {n: torch.zeros_like(t) if not t.is_complex() or t.dtype != torch.complex32
                else torch.zeros(t.shape, dtype=t.dtype) for n, t in v.items()}
            for k, v in state.items()}
    # Non-contiguous destinations too: the load writes through strides.
    for k, v in dest.items():
        v["transposed"] = torch.zeros_like(state[k]["transposed"].t()).t()
        assert not v["transposed"].is_contiguous()
    ct.load(dest, checkpoint_id=cid)
    for k, v in state.items():
        for n, t in v.items():
            got = dest[k][n]
            assert got.dtype == t.dtype and got.shape == t.shape, (k, n)
            assert torch.equal(_bits(got), _bits(t)), "%s.%s differs" % (k, n)


def test_dtype_mismatch_is_an_error(daemon):
    cid = os.path.join(daemon.root, "mismatch")
    ct.save({"w": torch.ones(3, dtype=torch.float8_e4m3fnuz)}, checkpoint_id=cid)
    with pytest.raises(ckptd.CheckpointError, match="float8_e4m3fnuz"):
        ct.load({"w": torch.zeros(3, dtype=torch.uint8)}, checkpoint_id=cid)
    with pytest.raises(ckptd.CheckpointError, match="'w'"):
        ct.load({"w": torch.zeros(4, dtype=torch.float8_e4m3fnuz)}, checkpoint_id=cid)


class Counter:
    """A Stateful object that is not a Module (DCP's protocol)."""

    def __init__(self, n=0):
        self.n = n
        self.loaded = None

    def state_dict(self):
        return {"n": self.n, "hist": torch.arange(self.n, dtype=torch.int64)}

    def load_state_dict(self, sd):
        self.loaded = sd
        self.n = sd["n"]


def _model_and_optim(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    o = torch.optim.AdamW(m.parameters(), lr=0.01)
    for _ in range(3):
        o.zero_grad()
        m(torch.randn(4, 8)).pow(2).sum().backward()
        o.step()
    return m, o


def test_nested_state_stateful_and_values(daemon):
    m, o = _model_and_optim(0)
    state = {
        "model": m, "optim": o, "counter": Counter(5),
        "cfg": {"lr": 0.5, "name": "run-1", "tags": ["a", "b"], "none": None, "flag": True,
                "big": 2**62 + 1, "neg": -7, "inf": math.inf, "nan": math.nan,
                "pair": (1, (2.5, "x")), 3: "int key", "ünï": "escaped"},
        "blob": b"\x00\xffbytes", "ba": bytearray(b"xyz"),
        "np": {"i": np.arange(10, dtype=np.int16).reshape(2, 5),
               "c": (np.arange(4) + 1j).astype(np.complex128),
               "t": np.arange(12, dtype=np.float32).reshape(3, 4).T},
        "np_scalar": np.float32(2.5),
    }
    cid = os.path.join(daemon.root, "nested")
    ct.save(state, checkpoint_id=cid, step=9)
    m2, o2 = _model_and_optim(1)
    dest = {
        "model": m2, "optim": o2, "counter": Counter(5),
        "cfg": {"lr": 0.0, "name": "", "tags": ["", ""], "none": 1, "flag": False, "big": 0,
                "neg": 0, "inf": 0.0, "nan": 0.0, "pair": (0, (0.0, "")), 3: "", "ünï": ""},
        "blob": b"", "ba": bytearray(),
        "np": {"i": np.zeros((2, 5), np.int16), "c": np.zeros(4, np.complex128),
               "t": np.zeros((4, 3), np.float32)},
        "np_scalar": 0.0,
    }
    ct.load(dest, checkpoint_id=cid)
    for (k1, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k1
    s1, s2 = o.state_dict(), o2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k]), (i, k)
    assert dest["counter"].n == 5 and torch.equal(dest["counter"].loaded["hist"], torch.arange(5))
    c = dest["cfg"]
    assert c["lr"] == 0.5 and c["name"] == "run-1" and c["tags"] == ["a", "b"]
    assert c["none"] is None and c["flag"] is True and c["big"] == 2**62 + 1 and c["neg"] == -7
    assert c["inf"] == math.inf and math.isnan(c["nan"])
    assert c["pair"] == (1, (2.5, "x")) and isinstance(c["pair"], tuple)
    assert c[3] == "int key" and c["ünï"] == "escaped"
    assert dest["blob"] == b"\x00\xffbytes" and dest["ba"] == bytearray(b"xyz")
    assert isinstance(dest["ba"], bytearray)
    for k in ("i", "c", "t"):
        assert np.array_equal(dest["np"][k], state["np"][k]), k
    assert dest["np_scalar"] == 2.5


def test_refused_before_anything_is_sent(daemon):
    root = daemon.root
    cid = os.path.join(root, "refused")
    with pytest.raises(ValueError, match="both flatten to the name 'a.b'"):
        ct.async_save({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}, checkpoint_id=cid)
    with pytest.raises(ValueError, match="'x.1'"):
        ct.async_save({"x": {1: 1, "1": 2}}, checkpoint_id=cid)
    with pytest.raises(TypeError, match="allow_pickle=True"):
        ct.async_save({"obj": object()}, checkpoint_id=cid)
    with pytest.raises(TypeError, match="key"):
        ct.async_save({"k": {(1, 2): 3}}, checkpoint_id=cid)
    with pytest.raises(ValueError, match="reserved"):
        ct.async_save({"~ckptd/meta/0": 1}, checkpoint_id=cid)
    with pytest.raises(TypeError, match="sparse|strided"):
        ct.async_save({"s": torch.eye(3).to_sparse()}, checkpoint_id=cid)
    with pytest.raises(ValueError, match="last component"):
        ct.async_save({"a": 1}, checkpoint_id=os.path.join(root, ".hidden"))
    with pytest.raises(ValueError, match="not finite"):
        ct.async_save({"a": 1}, checkpoint_id=cid, metrics={"loss": float("nan")})
    with pytest.raises(TypeError, match="storage_writer"):
        ct.async_save({"a": 1}, checkpoint_id=cid, storage_writer=object())
    # Nothing reached the root: no checkpoint, no work area.
    assert sorted(os.listdir(root)) == []


def test_pickle_needs_opt_in_at_save_and_load(daemon):
    cid = os.path.join(daemon.root, "pickled")
    ct.save({"obj": {1, 2, 3}, "w": torch.ones(2)}, checkpoint_id=cid, allow_pickle=True)
    with pytest.raises(ckptd.CheckpointError, match="allow_pickle=True"):
        ct.load({"obj": None, "w": torch.zeros(2)}, checkpoint_id=cid)
    dest = {"obj": None, "w": torch.zeros(2)}
    ct.load(dest, checkpoint_id=cid, allow_pickle=True)
    assert dest["obj"] == {1, 2, 3} and torch.equal(dest["w"], torch.ones(2))


def test_strict_and_kinds(daemon):
    cid = os.path.join(daemon.root, "strict")
    ct.save({"w": torch.ones(2), "n": 3}, checkpoint_id=cid)
    with pytest.raises(ckptd.CheckpointError, match="'extra'"):
        ct.load({"w": torch.zeros(2), "n": 0, "extra": torch.zeros(1)}, checkpoint_id=cid)
    with pytest.raises(ckptd.CheckpointError, match="no value 'm'"):
        ct.load({"w": torch.zeros(2), "m": 0}, checkpoint_id=cid)
    with pytest.raises(ckptd.CheckpointError, match="saved as a tensor"):
        ct.load({"w": 0}, checkpoint_id=cid)
    with pytest.raises(ckptd.CheckpointError, match="saved as a value"):
        ct.load({"n": torch.zeros(1)}, checkpoint_id=cid)
    dest = {"w": torch.zeros(2), "n": 0, "extra": torch.zeros(1), "m": 7}
    ct.load(dest, checkpoint_id=cid, strict=False)
    assert torch.equal(dest["w"], torch.ones(2)) and dest["n"] == 3 and dest["m"] == 7


def test_shards_open_with_safetensors(daemon):
    from safetensors import safe_open
    gen = torch.Generator().manual_seed(2)
    state = {"a": torch.randn(4, 5, generator=gen), "b": torch.arange(7, dtype=torch.int32),
             "h": torch.randn(3, generator=gen).to(torch.bfloat16),
             "c": torch.randn(2, dtype=torch.complex64, generator=gen)}
    cid = os.path.join(daemon.root, "st")
    ct.save(state, checkpoint_id=cid)
    files = glob.glob(os.path.join(cid, "*.safetensors"))
    assert files
    seen = {}
    for f in files:
        with safe_open(f, framework="pt") as sf:
            for k in sf.keys():
                seen[k] = sf.get_tensor(k)
    for k in ("a", "b", "h"):
        assert torch.equal(seen[k], state[k]), k
    assert torch.equal(seen["c"], torch.view_as_real(state["c"]))


def test_latest_and_list(daemon):
    root = daemon.root
    assert ckptd.latest(root) is None and ckptd.list(root) == []
    for step in (10, 30, 20):
        ct.save({"w": torch.full((2,), float(step))}, checkpoint_id=os.path.join(
            root, "step-%d" % step), step=step, metrics={"loss": 1.0 / step})
    assert ckptd.latest(root) == os.path.join(root, "step-30")
    got = ckptd.list(root, metrics=["loss"])
    assert [c.step for c in got] == [10, 20, 30]
    assert [c.name for c in got] == ["step-10", "step-20", "step-30"]
    assert got[0].metrics["loss"] == pytest.approx(0.1)
    # A failed save leaves no committed checkpoint: latest is unchanged.
    r = ct.async_save({"w": torch.ones(1)}, checkpoint_id=os.path.join(root, "step-30"), step=40)
    with pytest.raises(ckptd.SaveError, match="already exists"):
        r.upload_completion.result(timeout=120)
    assert ckptd.latest(root) == os.path.join(root, "step-30")


def test_no_daemon_is_a_clear_error(tmp_path):
    sock = str(tmp_path / "nobody.sock")
    code = ("import ckptd, ckptd.torch as ct, torch\n"
            "ckptd.configure(socket=%r)\n"
            "try:\n"
            "    ct.async_save({'w': torch.ones(1)}, checkpoint_id=%r)\n"
            "except ckptd.DaemonNotRunning as e:\n"
            "    print('RAISED', e)\n" % (sock, str(tmp_path / "c" / "s1")))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert "RAISED" in out.stdout, out.stdout + out.stderr
    assert sock in out.stdout and "ckptd -c" in out.stdout


def test_import_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, ckptd; ckptd.list('/nonexistent');"
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_python_metadata_is_per_rank_json(daemon):
    cid = os.path.join(daemon.root, "meta")
    ct.save({"n": 1, "w": torch.ones(1)}, checkpoint_id=cid)
    with ckptd._engine.Reader(cid) as rd:
        meta = json.loads(rd.blob("~ckptd/meta/0"))
        assert meta["format"] == 1 and meta["values"] == {"n": 1}
        assert rd.metadata("ckptd.python") == "1"


def test_fresh_optimizer_receives_its_state(daemon):
    # A new optimizer has no state until its first step: load gives it
    # every moment and step count the checkpoint holds, without moving a
    # parameter (as DCP's get_state_dict does).
    m, o = _model_and_optim(0)
    cid = os.path.join(daemon.root, "optim")
    ct.save({"model": m, "optim": o}, checkpoint_id=cid)
    torch.manual_seed(3)
    m2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    o2 = torch.optim.AdamW(m2.parameters(), lr=0.01)
    ct.load({"model": m2, "optim": o2}, checkpoint_id=cid)
    s1, s2 = o.state_dict(), o2.state_dict()
    assert set(s1["state"]) == set(s2["state"]) and s1["state"]
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k]), (i, k)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    # The next steps of both are the same, bit for bit.
    x = torch.randn(4, 8)
    for mm, oo in ((m, o), (m2, o2)):
        oo.zero_grad()
        mm(x).pow(2).sum().backward()
        oo.step()
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def test_stateful_missing_names_is_an_error_when_strict(daemon):
    cid = os.path.join(daemon.root, "stateful")
    ct.save({"c": Counter(4)}, checkpoint_id=cid)

    class Smaller(Counter):
        def state_dict(self):
            return {"n": self.n}

    with pytest.raises(ckptd.CheckpointError, match="c.hist"):
        ct.load({"c": Smaller()}, checkpoint_id=cid)
    s = Smaller()
    ct.load({"c": s}, checkpoint_id=cid, strict=False)
    assert s.n == 4


def test_response_is_future_like(daemon):
    r = ct.async_save({"w": torch.ones(2)}, checkpoint_id=os.path.join(daemon.root, "fut"))
    seen = []
    r.add_done_callback(seen.append)
    assert r.result(timeout=300) is None and r.done() and r.exception() is None
    wait_for(lambda: seen, "the done callback")
    assert seen[0] is r
