# SPDX-License-Identifier: MIT
"""Processes: fork after import (the child never uses its parent's
connection), DataLoader workers while a save is in flight, and interpreter
exit with saves in flight (it waits for staged; ckptd commits them)."""
import os
import subprocess
import sys
import textwrap

import torch

import ckptd
import ckptd.torch as ct
from conftest import wait_for


def _run(daemon, code, timeout=300):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=timeout, env=daemon.env_for_child())
    assert out.returncode == 0, "rc %d\nstdout:\n%s\nstderr:\n%s" % (
        out.returncode, out.stdout, out.stderr)
    return out


def test_fork_child_connects_anew(daemon):
    root = daemon.root
    ct.save({"w": torch.ones(4)}, checkpoint_id=os.path.join(root, "parent-1"), step=1)
    r = ct.async_save({"w": torch.full((1 << 20,), 2.0)},
                      checkpoint_id=os.path.join(root, "parent-2"), step=2)
    pid = os.fork()
    if pid == 0:  # the child: its own connection, as its own job
        code = 1
        try:
            ckptd.configure(job="forked-child")
            ct.save({"c": torch.full((3,), 7.0)}, checkpoint_id=os.path.join(root, "child"),
                    step=5)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    r.upload_completion.result(timeout=300)
    ct.save({"w": torch.ones(4)}, checkpoint_id=os.path.join(root, "parent-3"), step=3)
    d = {"c": torch.zeros(3)}
    ct.load(d, checkpoint_id=os.path.join(root, "child"))
    assert torch.equal(d["c"], torch.full((3,), 7.0))
    assert [c.name for c in ckptd.list(root)] == ["parent-1", "parent-2", "parent-3", "child"]


def test_dataloader_workers_with_a_save_in_flight(daemon):
    _run(daemon, """
        import os, torch, ckptd, ckptd.torch as ct
        from torch.utils.data import DataLoader, TensorDataset
        root = %r
        ckptd.configure(arena_bytes="64M")
        state = {"w": torch.randn(256, 1024)}
        r = ct.async_save(state, checkpoint_id=os.path.join(root, "dl"), step=1)
        dl = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2,
                        multiprocessing_context="fork")
        assert sum(float(b[0].sum()) for b in dl) == float(sum(range(64)))
        r.upload_completion.result(timeout=300)
        ct.save(state, checkpoint_id=os.path.join(root, "dl2"), step=2)
        print("ok")
    """ % daemon.root)
    assert ckptd.latest(daemon.root) == os.path.join(daemon.root, "dl2")


def test_exit_with_saves_in_flight(daemon):
    # The process returns from its last line with two saves in flight and
    # never waits on them: exit waits until they are staged, and ckptd
    # commits both.
    out = _run(daemon, """
        import os, torch, ckptd, ckptd.torch as ct
        root = %r
        ckptd.configure(arena_bytes="64M")
        big = {"w": torch.randn(32, 1 << 20)}   # 128 MiB: larger than the arena
        ct.async_save(big, checkpoint_id=os.path.join(root, "exit-1"), step=1)
        ct.async_save({"v": torch.ones(8)}, checkpoint_id=os.path.join(root, "exit-2"), step=2)
        print("returning")
    """ % daemon.root)
    assert "returning" in out.stdout
    for n in ("exit-1", "exit-2"):
        wait_for(lambda: os.path.exists(os.path.join(daemon.root, n, "manifest.json")),
                 "%s to be committed" % n)
    d = {"v": torch.zeros(8)}
    ct.load(d, checkpoint_id=os.path.join(daemon.root, "exit-2"))
    assert torch.equal(d["v"], torch.ones(8))


def test_restart_after_kill_loads_from_the_daemons_memory(daemon):
    # A trainer saving with resident images is killed with SIGKILL; its
    # restart on this node loads from ckptd's memory (the shard on disk is
    # even gone), every block still checked against the manifest.
    root = daemon.root
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, signal, torch, ckptd, ckptd.torch as ct
        ckptd.configure(resident=True, arena_bytes="64M")
        g = torch.Generator().manual_seed(11)
        ct.save({"w": torch.randn(512, 1024, generator=g), "step": 7},
                checkpoint_id=os.path.join(%r, "step-7"), step=7)
        print("saved", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """ % root)], stdout=subprocess.PIPE, text=True, env=daemon.env_for_child())
    try:
        assert trainer.stdout.readline().strip() == "saved"
        trainer.wait(300)
    finally:
        trainer.kill()
        trainer.wait()
    latest = ckptd.latest(root)
    assert latest == os.path.join(root, "step-7")
    for f in os.listdir(latest):
        if f.endswith(".safetensors"):
            os.unlink(os.path.join(latest, f))
    out = _run(daemon, """
        import torch, ckptd, ckptd.torch as ct
        ckptd.configure(resident=True, arena_bytes="64M")
        g = torch.Generator().manual_seed(11)
        want = torch.randn(512, 1024, generator=g)
        d = {"w": torch.zeros(512, 1024), "step": 0}
        st = ct.load(d, checkpoint_id=ckptd.latest(%r))
        assert torch.equal(d["w"], want) and d["step"] == 7
        print("resident", st["bytes_resident"])
    """ % root)
    assert int(out.stdout.split("resident")[1]) >= 512 * 1024 * 4, out.stdout
