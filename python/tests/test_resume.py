# SPDX-License-Identifier: MIT
"""Exact resume: a trainer (resume_trainer.py: a StatefulDataLoader with 2
workers and shuffle, worker-side noise, dropout, Adam, async saves every 3
steps) is killed with SIGKILL at a random step and restarted from
ckptd.latest(); its losses, final parameters and optimizer state are
bit-identical to those of a run that was never interrupted."""
import os
import random
import signal
import subprocess
import sys

import pytest
import torch

import ckptd
from conftest import Daemon, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "resume_trainer.py")
STEPS = 26  # 10 batches an epoch: the runs cross two epoch ends
EVERY = 3


def run(daemon, root, life, tag, kill_at=None):
    """Runs the trainer to its end, or until it reaches kill_at and is
    killed there (with its loader workers: it leads a process group).
    Returns {step: loss hex} from its log."""
    log = os.path.join(daemon.base, "%s.log" % tag)
    final = os.path.join(daemon.base, "%s.pt" % tag)
    err = open(os.path.join(daemon.base, "%s.err" % tag), "w+")
    args = [sys.executable, TRAINER, root, str(STEPS), str(EVERY), str(life), log, final]
    if kill_at:
        args.append(str(kill_at))
    p = subprocess.Popen(args, env=daemon.env_for_child(), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=err)
    try:
        if kill_at:
            def stopped():
                if p.poll() is not None:
                    err.seek(0)
                    pytest.fail("the trainer exited (%s) before step %d: %s"
                                % (p.returncode, kill_at, err.read()[-3000:]))
                return os.path.exists(log) and "stop\n" in open(log).read()
            wait_for(stopped, "the trainer to reach step %d" % kill_at, timeout=300)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(60)
        else:
            p.wait(300)
            err.seek(0)
            assert p.returncode == 0, "trainer failed:\n%s" % err.read()[-3000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        err.close()
    losses = {}
    for line in open(log):
        if line.strip() != "stop":
            s, v = line.split()
            losses.setdefault(int(s), []).append(v)
    return losses, final


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (with its saves)."""
    base = tmp_path_factory.mktemp("ref")
    d = Daemon(base).start()
    try:
        root = os.path.join(d.root, "run")
        os.makedirs(root)
        losses, final = run(d, root, 0, "ref")
    finally:
        d.stop()
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses, torch.load(final)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_and_resume_exact(daemon, reference, seed):
    ref_losses, ref_final = reference
    kill_at = random.Random(seed).randint(EVERY + 1, STEPS - 1)
    root = os.path.join(daemon.root, "run")
    os.makedirs(root)
    first, _ = run(daemon, root, 0, "killed", kill_at=kill_at)
    assert max(first) == kill_at
    # Its last save was staged before the kill: ckptd commits it on its own.
    last = kill_at // EVERY * EVERY
    wait_for(lambda: (ckptd.latest(root) or "").endswith("step-%05d-0" % last),
             "ckptd to commit the killed trainer's save of step %d" % last)
    second, final = run(daemon, root, 1, "resumed")
    assert min(second) == last + 1
    assert max(second) == STEPS
    for s, vals in sorted(list(first.items()) + list(second.items())):
        for v in vals:
            assert v == ref_losses[s][0], "seed %d: step %d's loss %s, uninterrupted %s" % (
                seed, s, float.fromhex(v), float.fromhex(ref_losses[s][0]))
    got = torch.load(final)
    for k, t in ref_final["model"].items():
        assert torch.equal(got["model"][k], t), "parameter %s differs" % k
    ro, go = ref_final["optim"], got["optim"]
    assert ro["param_groups"] == go["param_groups"]
    assert sorted(ro["state"]) == sorted(go["state"])
    for i, st in ro["state"].items():
        for k, t in st.items():
            assert torch.equal(go["state"][i][k], t), "optimizer state %d.%s differs" % (i, k)
