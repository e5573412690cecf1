# SPDX-License-Identifier: MIT
"""The save call's cheap paths (the ones `make bench` times in py-save-2g):
the fast path for plain host tensors beside the general one, the array
that hands all tensors to libckpt in one call (reused while unchanged),
and the reused threads that complete the futures.  Every check is on what a load gives back, never on time."""
import os
import threading

import pytest

torch = pytest.importorskip("torch")

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402
from ckptd import _engine  # noqa: E402

from conftest import wait_for  # noqa: E402


def mixed_state():
    """Tensors that take the fast path and tensors that do not, side by
    side, so that the struct handed to libckpt goes from one kind to the
    other and back in the one array handed to libckpt."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 5, generator=g)
    z = torch.randn(3, dtype=torch.complex64, generator=g)
    w = torch.randn(4, 4, generator=g).requires_grad_()
    return {
        "plain": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "transposed": base.t(),                      # not contiguous
        "plain_after": torch.arange(7, dtype=torch.int64),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 3, dtype=torch.float16),
        "flags": torch.tensor([True, False, True]),
        "bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "complex": z,
        "imag_of_conj": z.conj().imag,               # a real view with the negative bit
        "with_grad": w,
        "slice": base[1:4, 2:],
        "nested": {"a": [torch.full((2, 2), 3.0), torch.ones(1, dtype=torch.uint8)]},
        "step": 17,
    }


def expect(state):
    """What a load must give back: every tensor's values (resolved views)."""
    out = {}

    def walk(v, name):
        if isinstance(v, dict):
            for k, s in v.items():
                walk(s, name + "." + k if name else k)
        elif isinstance(v, list):
            for i, s in enumerate(v):
                walk(s, "%s.%d" % (name, i))
        elif isinstance(v, torch.Tensor):
            out[name] = v.detach().resolve_conj().resolve_neg().clone()
        else:
            out[name] = v
    walk(state, "")
    return out


def blank(state):
    """A destination of the same layout, filled with other values."""
    if isinstance(state, dict):
        return {k: blank(v) for k, v in state.items()}
    if isinstance(state, list):
        return [blank(v) for v in state]
    if isinstance(state, torch.Tensor):
        t = torch.empty_like(state.detach().resolve_conj().resolve_neg(),
                             memory_format=torch.contiguous_format)
        if t.dtype == torch.bool:
            t.fill_(False)
        elif t.is_complex():
            t.fill_(complex(-1, -1))
        else:
            t.fill_(-1)
        return t
    return None


def test_fast_and_general_paths_round_trip(daemon, tmp_path):
    state = mixed_state()
    want = expect(state)
    cid = os.path.join(daemon.root, "mixed")
    ct.save(state, checkpoint_id=cid)
    dst = blank(state)
    ct.load(dst, checkpoint_id=cid)
    got = expect(dst)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype, k
            assert got[k].shape == v.shape, k
            assert torch.equal(got[k], v), k
        else:
            assert got[k] == v, k


def test_many_tensors_each_keeps_its_own_shape(daemon):
    # Shapes of every rank 0..4 interleaved: the one array of dimensions
    # the struct points into must give each tensor its own slice.
    state = {}
    for i in range(300):
        nd = i % 5
        shape = [1 + (i + d) % 3 for d in range(nd)]
        state["t%03d" % i] = torch.full(shape, float(i))
    cid = os.path.join(daemon.root, "shapes")
    ct.save(state, checkpoint_id=cid)
    dst = {k: torch.zeros_like(v) for k, v in state.items()}
    ct.load(dst, checkpoint_id=cid)
    for k, v in state.items():
        assert torch.equal(dst[k], v), k


def test_reused_tensor_array_follows_every_change(daemon):
    # The array handed to ckpt_save_add_tensors is reused while a save's
    # tensors equal the last save's (names, shapes, addresses): each
    # change of one of them must reach the checkpoint.
    a = torch.arange(8, dtype=torch.float32)
    b = torch.full((2, 3), 5.0)
    state = {"a": a, "b": b}
    saves = []

    def save(tag):
        cid = os.path.join(daemon.root, tag)
        ct.save(state, checkpoint_id=cid)
        saves.append((cid, {k: v.clone() for k, v in state.items()}))

    save("s0")
    a.add_(1)            # same tensors, new values: the array is reused
    save("s1")
    assert _engine._last_pack is not None and _engine._last_pack[0][0][0] == "a"
    state["b"] = torch.full((2, 3), 7.0)   # another tensor: another address
    save("s2")
    state["b"].resize_(3, 2)               # same storage, another shape
    save("s3")
    state["c"] = torch.ones(1)             # one more name
    save("s4")
    del state["a"]                         # one name fewer
    save("s5")
    for cid, want in saves:
        dst = {k: torch.zeros_like(v) for k, v in want.items()}
        ct.load(dst, checkpoint_id=cid)
        for k, v in want.items():
            assert dst[k].shape == v.shape and torch.equal(dst[k], v), (cid, k)


def waiter_threads():
    return [t for t in threading.enumerate() if t.name == "ckptd-save"]


def test_saves_in_flight_complete_and_threads_are_reused(daemon):
    state = {"w": torch.arange(1 << 16, dtype=torch.float32)}
    ct.save(state, checkpoint_id=os.path.join(daemon.root, "first"))
    wait_for(lambda: _engine._waiters.idle >= 1, "the first save's thread to go idle")
    before = len(waiter_threads())
    # Several saves in flight at once: each gets a thread of its own (one
    # waits for one save), all complete.
    resps = [ct.async_save({"w": state["w"] + i}, checkpoint_id=os.path.join(daemon.root, "f%d" % i))
             for i in range(4)]
    for r in resps:
        r.upload_completion.result(timeout=120)
        assert r.staging_completion.done() and r.staging_completion.exception() is None
    # Each thread goes idle once its save is committed (a save that
    # completed before the next call had its thread serve that one).
    wait_for(lambda: _engine._waiters.idle == len(waiter_threads()), "every thread to go idle")
    peak = len(waiter_threads())
    assert peak <= before + 4
    # One after the other, each once the last one's thread is idle: no new
    # thread (the idle one takes each save).
    for i in range(5):
        ct.save(state, checkpoint_id=os.path.join(daemon.root, "s%d" % i))
        wait_for(lambda: _engine._waiters.idle == len(waiter_threads()), "every thread to go idle")
    assert len(waiter_threads()) == peak
    for i in range(4):
        dst = {"w": torch.zeros(1 << 16)}
        ct.load(dst, checkpoint_id=os.path.join(daemon.root, "f%d" % i))
        assert torch.equal(dst["w"], state["w"] + i)


def test_failed_save_fails_its_futures_and_the_thread_serves_the_next(daemon):
    state = {"w": torch.ones(1024)}
    cid = os.path.join(daemon.root, "dup")
    ct.save(state, checkpoint_id=cid)
    # The same checkpoint again: ckptd refuses it, at the call or through
    # the futures; either way the next save works.
    try:
        r = ct.async_save(state, checkpoint_id=cid)
    except ckptd.SaveError:
        pass
    else:
        with pytest.raises(ckptd.SaveError):
            r.upload_completion.result(timeout=120)
    ct.save(state, checkpoint_id=os.path.join(daemon.root, "after"))
    assert ckptd.latest(daemon.root) is not None


def test_fork_child_saves_with_threads_of_its_own(daemon):
    state = {"w": torch.ones(4096)}
    ct.save(state, checkpoint_id=os.path.join(daemon.root, "parent"))
    pid = os.fork()
    if pid == 0:  # the child: exits with 0 only if its save committed
        code = 1
        try:
            ct.save({"w": torch.full((4096,), 2.0)},
                    checkpoint_id=os.path.join(daemon.root, "child"))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    dst = {"w": torch.zeros(4096)}
    ct.load(dst, checkpoint_id=os.path.join(daemon.root, "child"))
    assert torch.equal(dst["w"], torch.full((4096,), 2.0))


class _Stateful:
    def __init__(self):
        self.sd = {"x": torch.ones(2)}

    def state_dict(self):
        return self.sd

    def load_state_dict(self, sd):
        self.sd = sd


@pytest.mark.parametrize("state", [
    {"a": {"b": torch.ones(1), "c": 3}, "d": "s", "e": None, "f": b"x"},
    {"model": {"w": torch.ones(2)}, "optim": {"state": {0: {"m": torch.ones(2)}}}},  # int keys
    {"l": [torch.ones(1), {"z": 2}], "t": (1, 2)},                                 # lists, tuples
    {"__x": torch.ones(1), "y": {"__z": 1}},                                       # renamed names
    {"sp ace": 1, "uni\u00e9": 2, "pc%t": 3},                                      # escaped keys
    {"obj": _Stateful(), "n": 1.5},                                                # Stateful
    {"a": {}, "b": {"c": {}}},                                                     # empty dicts
])
def test_fast_flatten_gives_flattens_names(state):
    from ckptd import _tree

    leaves, _, _ = _tree.flatten(state, ct._is_tensor_leaf)
    names, values = _tree.names_values(state, ct._is_tensor_leaf)
    assert names == [leaf.name for leaf in leaves]
    assert all(a is b for a, b in zip(values, [leaf.value for leaf in leaves]))


@pytest.mark.parametrize("state", [
    {"a.b": 1, "a": {"b": 2}},      # two paths, one name
    {"~ckptd": 1},                  # reserved
    {"": 1},                        # no name
    {"x" * 600: 1},                 # too long
    [1, 2],                         # not a dict
])
def test_fast_flatten_refuses_as_flatten_does(state):
    from ckptd import _tree

    with pytest.raises((TypeError, ValueError)) as want:
        _tree.flatten(state, ct._is_tensor_leaf)
    with pytest.raises(type(want.value)) as got:
        _tree.names_values(state, ct._is_tensor_leaf)
    assert str(got.value) == str(want.value)
