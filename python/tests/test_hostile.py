# SPDX-License-Identifier: MIT
"""Hostile checkpoints and a daemon that dies: each load raises its error,
names what is wrong, and leaves every other checkpoint readable; a save
whose daemon is killed fails its futures instead of hanging."""
import json
import os

import pytest
import torch

import ckptd
import ckptd.torch as ct
from conftest import Daemon, wait_for


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 1024, generator=g), "b": torch.randn(10, generator=g),
            "step": seed}


def _dest():
    return {"w": torch.zeros(64, 1024), "b": torch.zeros(10), "step": 0}


def _two(daemon):
    good = os.path.join(daemon.root, "good")
    bad = os.path.join(daemon.root, "bad")
    ct.save(_state(1), checkpoint_id=good, step=1)
    ct.save(_state(2), checkpoint_id=bad, step=2)
    return good, bad


def _good_still_loads(good):
    d = _dest()
    ct.load(d, checkpoint_id=good)
    assert torch.equal(d["w"], _state(1)["w"]) and d["step"] == 1


def _chunk(cid, name):
    with open(os.path.join(cid, "manifest.json")) as f:
        m = json.load(f)
    c = m["tensors"][name]["chunks"][0]
    return os.path.join(cid, m["files"][c["file"]]["path"]), c["begin"], c["end"]


@pytest.mark.parametrize("through_daemon", [True, False])
def test_bit_flip_names_file_tensor_offset(daemon, through_daemon):
    good, bad = _two(daemon)
    path, begin, end = _chunk(bad, "w")
    with open(path, "r+b") as f:
        f.seek(begin + 70000)
        byte = f.read(1)
        f.seek(begin + 70000)
        f.write(bytes([byte[0] ^ 0x10]))
    if not through_daemon:
        daemon.stop()
        ckptd.configure(socket=daemon.sock + ".gone")
    d = _dest()
    with pytest.raises(ckptd.CheckpointError) as ei:
        ct.load(d, checkpoint_id=bad)
    msg = str(ei.value)
    assert os.path.basename(path) in msg and "'w'" in msg, msg
    assert "offset" in msg and "partial bytes" in msg, msg
    _good_still_loads(good)


def test_truncated_shard(daemon):
    good, bad = _two(daemon)
    path, begin, end = _chunk(bad, "w")
    with open(path, "r+b") as f:
        f.truncate(begin + 1000)
    with pytest.raises(ckptd.CheckpointError) as ei:
        ct.load(_dest(), checkpoint_id=bad)
    assert os.path.basename(path) in str(ei.value), str(ei.value)
    _good_still_loads(good)


def test_manifest_naming_a_missing_file(daemon):
    good, bad = _two(daemon)
    path, _, _ = _chunk(bad, "w")
    os.unlink(path)
    with pytest.raises(ckptd.CheckpointError) as ei:
        ct.load(_dest(), checkpoint_id=bad)
    assert os.path.basename(path) in str(ei.value), str(ei.value)
    _good_still_loads(good)


def test_newer_manifest_format(daemon):
    good, bad = _two(daemon)
    mp = os.path.join(bad, "manifest.json")
    with open(mp) as f:
        text = f.read()
    with open(mp, "w") as f:
        f.write(text.replace('"format":"ckpt-1"', '"format":"ckpt-99"'))
    with pytest.raises(ckptd.CheckpointError, match="newer"):
        ct.load(_dest(), checkpoint_id=bad)
    # latest() skips it rather than failing or picking it.
    assert ckptd.latest(daemon.root) == good
    _good_still_loads(good)


def test_newer_python_format(daemon, monkeypatch):
    good = os.path.join(daemon.root, "good")
    ct.save(_state(1), checkpoint_id=good, step=1)
    monkeypatch.setattr(ct, "FORMAT", 99)
    newer = os.path.join(daemon.root, "newer")
    ct.save(_state(2), checkpoint_id=newer, step=2)
    monkeypatch.undo()
    with pytest.raises(ckptd.CheckpointError, match="newer ckptd package"):
        ct.load(_dest(), checkpoint_id=newer)
    _good_still_loads(good)


def test_missing_checkpoint(daemon):
    with pytest.raises(ckptd.CheckpointError, match="nothere"):
        ct.load(_dest(), checkpoint_id=os.path.join(daemon.root, "nothere"))


def test_daemon_killed_mid_save_fails_the_future(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    d = Daemon(tmp_path / "d", env={"CKPTD_TEST_GATE": str(gate)}).start()
    try:
        ckptd.configure(socket=d.sock, arena_bytes="64M")
        (gate / "commit.hold").write_text("")
        r = ct.async_save(_state(3), checkpoint_id=os.path.join(d.root, "s"), step=3)
        r.staging_completion.result(timeout=300)
        wait_for(lambda: (gate / "commit.waiting").exists(), "the daemon to reach its commit")
        d.kill()
        (gate / "commit.hold").unlink()
        with pytest.raises(ckptd.SaveError, match="connection to ckptd lost"):
            r.upload_completion.result(timeout=120)
        assert not os.path.exists(os.path.join(d.root, "s", "manifest.json"))
        # A daemon started again serves new saves; the lost one is not
        # committed by it.
        d.start()
        ckptd.configure(socket=d.sock)
        ct.save(_state(4), checkpoint_id=os.path.join(d.root, "s2"), step=4)
        assert ckptd.latest(d.root) == os.path.join(d.root, "s2")
    finally:
        d.stop()
