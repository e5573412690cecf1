# SPDX-License-Identifier: MIT
"""Sharded state across processes: gloo groups on 127.0.0.1 (dist_worker.py
is one rank), a real ckptd.

- FSDP2 (fully_shard on CPU) model and optimizer state saved by 2 ranks
  with uneven and empty shards, loaded by 3 ranks and by 1 into their own
  layouts: every value equals the gathered tensor rank 0 saved with
  torch.save beforehand;
- 2-D meshes (Shard+Replicate and others): each chunk written once, the
  writers spread over the replicas; loaded into a 1-D layout;
- plain tensors under a group: written once, loaded by every rank;
- Partial placements refused before ckptd hears of the save;
- 4 ranks running collectives with saves in flight: no hang, and no save
  calls torch.distributed from another thread than the main one.

Each job is bounded: a rank that fails stops the others, and a job that
outlives its bound is killed (every process by its PID) and fails.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dist_worker.py")
JOB_TIMEOUT = float(os.environ.get("CKPTD_DIST_TIMEOUT", "300"))


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_ifname():
    """gloo's device: the loopback interface, so that no rank looks for
    the host's name in DNS."""
    for _, name in socket.if_nameindex():
        if name == "lo" or name.startswith("lo0"):
            return name
    return None


def run_job(daemon, work, scenario, world, *args, timeout=JOB_TIMEOUT):
    """Runs `world` ranks of scenario; returns their outputs.  Fails (after
    stopping every rank) when a rank fails or the job outlives timeout."""
    os.makedirs(work, exist_ok=True)
    env = daemon.env_for_child()
    ifname = _loopback_ifname()
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    env["MASTER_ADDR"] = "127.0.0.1"
    env["DIST_ROOT"] = daemon.root
    env.pop("CKPTD_JOB", None)
    port = str(_free_port())
    logs = [os.path.join(work, "%s-%d-of-%d.log" % (scenario, r, world)) for r in range(world)]
    procs = []
    try:
        for r in range(world):
            with open(logs[r], "w") as lf:
                procs.append(subprocess.Popen(
                    [sys.executable, WORKER, scenario, str(r), str(world), port, str(work)]
                    + [str(a) for a in args],
                    stdout=lf, stderr=subprocess.STDOUT, env=env))
        end = time.monotonic() + timeout
        failed = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = "rank %d exited with %d" % (bad[0], codes[bad[0]])
                break
            if time.monotonic() > end:
                failed = "the job did not finish in %.0f s (hung?)" % timeout
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    outs = [open(lg).read() for lg in logs]
    if failed is None and any(p.returncode for p in procs):
        failed = "exit codes %s" % [p.returncode for p in procs]
    if failed:
        pytest.fail("%s %d-rank job: %s\n%s" % (scenario, world, failed, "\n".join(
            "---- rank %d ----\n%s" % (r, o[-6000:]) for r, o in enumerate(outs))))
    for r, o in enumerate(outs):
        assert "GUARD ok" in o, "rank %d did not check its threads:\n%s" % (r, o)
    return outs


def manifest(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def note(work, scenario, rank):
    with open(os.path.join(work, "%s-%d.json" % (scenario, rank))) as f:
        return json.load(f)



def chunk_bytes(m):
    """tensor name -> [(writer rank, offsets, shape, bytes)] of its chunks."""
    out = {}
    for name, t in m["tensors"].items():
        out[name] = [(m["files"][c["file"]]["rank"], c["offsets"], c["shape"],
                      c["end"] - c["begin"]) for c in t["chunks"]]
    return out


def assert_one_copy(m, itemsize):
    """Every tensor's chunks hold exactly one copy of it: as many bytes as
    its global shape (manifest_parse checked that they tile it)."""
    for name, chunks in chunk_bytes(m).items():
        t = m["tensors"][name]
        n = itemsize[t["dtype"]]
        for d in t["shape"]:
            n *= d
        assert sum(c[3] for c in chunks) == n, (name, chunks)
        boxes = [(tuple(c[1]), tuple(c[2])) for c in chunks if c[3]]
        assert len(boxes) == len(set(boxes)), (name, chunks)


ITEMSIZE = {"F32": 4, "BF16": 2, "F64": 8, "I64": 8, "F16": 2}


@pytest.mark.timeout(900)
def test_fsdp_state_saved_by_2_loads_on_3_and_1(daemon, tmp_path):
    work = tmp_path / "w"
    run_job(daemon, work, "fsdp_save", 2)
    m = manifest(os.path.join(daemon.root, "fsdp"))
    assert m["world_size"] == 2
    assert_one_copy(m, ITEMSIZE)
    chunks = chunk_bytes(m)
    # The saved layout was uneven (5 rows as 3 + 2) and had an empty
    # chunk (1 row: rank 1 held none), and both are in the manifest.
    saved = [note(work, "fsdp_save", r)["local"] for r in range(2)]
    assert saved[0]["model.0.weight"][0] == [3, 4] and saved[1]["model.0.weight"][0] == [2, 4]
    assert saved[1]["model.4.weight"][0] == [0, 7]
    assert sorted((c[1], c[2]) for c in chunks["model.0.weight"]) == [
        ([0, 0], [3, 4]), ([3, 0], [2, 4])]
    assert any(c[3] == 0 for c in chunks["model.4.weight"])
    assert all(c[3] == 0 for c in chunks["extra.none"])
    # Plain tensors (the optimizer's step counts) once, by one rank each.
    steps = [n for n in chunks if n.endswith(".step")]
    assert steps and all(len(chunks[n]) == 1 for n in steps)

    # Without torch.distributed: plain full tensors, in this process.
    import ckptd.torch as ct
    want = torch.load(os.path.join(work, "fsdp.pt"))
    dst = {k: torch.full_like(v, 7) if v.numel() else torch.empty_like(v)
           for k, v in want.items()}
    ct.load(dst, checkpoint_id=os.path.join(daemon.root, "fsdp"))
    for k, v in want.items():
        assert torch.equal(dst[k], v), k

    outs = run_job(daemon, work, "fsdp_load", 3)
    loaded = [note(work, "fsdp_load", r)["local"] for r in range(3)]
    assert [loaded[r]["model.0.weight"][0][0] for r in range(3)] == [2, 2, 1]
    assert [loaded[r]["model.4.weight"][0][0] for r in range(3)] == [1, 0, 0]
    for o in outs:
        assert "world 3 load" in o and "world 3 model and optimizer" in o
    outs = run_job(daemon, work, "fsdp_load", 1)
    assert "world 1 model and optimizer" in outs[0]


@pytest.mark.timeout(900)
def test_mesh_2d_chunks_written_once_by_spread_writers(daemon, tmp_path):
    work = tmp_path / "w"
    run_job(daemon, work, "mesh2d_save", 4)
    m = manifest(os.path.join(daemon.root, "mesh2d"))
    assert_one_copy(m, ITEMSIZE)
    chunks = chunk_bytes(m)
    notes = [note(work, "mesh2d_save", r) for r in range(4)]
    coord = [n["coord"] for n in notes]
    # Shard+Replicate over a 2x2 mesh: 2 chunks, each held by 2 ranks
    # (the 2 coordinates of the Replicate dimension), written once; the
    # two chunks of each tensor by ranks of different replicas.
    for kind, rep_dim in (("sr", 1), ("rs", 0)):
        for t in ("big", "t0", "t1", "t2"):
            cs = [c for c in chunks["grid.%s.%s" % (kind, t)] if c[3]]
            assert len(cs) == 2, (kind, t, cs)
            reps = {coord[c[0]][rep_dim] for c in cs}
            assert len(reps) == 2, ("%s.%s: both chunks written by replica %s"
                                    % (kind, t, reps))
    # Fully replicated: one chunk, one writer, and not always the same.
    writers = {chunks["grid.rr.%s" % t][0][0] for t in ("big", "t0", "t1", "t2")}
    for t in ("big", "t0", "t1", "t2"):
        assert len(chunks["grid.rr.%s" % t]) == 1
    assert len(writers) > 1, writers
    # Sharded on both dimensions: every rank writes its own chunk.
    for kind in ("ss", "s0s0"):
        assert {c[0] for c in chunks["grid.%s.big" % kind] if c[3]} == {0, 1, 2, 3}
    # FSDP2 over "a" with tensor parallelism over "b": _StridedShard
    # chunks, and the row-parallel bias replicated over "b".
    pl = notes[0]["placements"]
    assert pl["tp.model.0.weight"][0].startswith("_StridedShard"), pl
    assert pl["tp.model.2.bias"][1] == "Replicate()", pl
    assert len([c for c in chunks["tp.model.0.weight"] if c[3]]) == 4
    assert len([c for c in chunks["tp.model.2.bias"] if c[3]]) == 2
    # Empty chunks of a 1-row tensor, some at the same place: stored, and
    # harmless.
    assert any(c[3] == 0 for c in chunks["grid.s0s0.tiny"])
    # The bytes are spread: every rank's file holds tensors.
    per_rank = [0] * 4
    for cs in chunks.values():
        for c in cs:
            per_rank[c[0]] += c[3]
    assert all(per_rank), per_rank
    # Into another layout: 3 ranks, the grid sharded on dimension 1, the
    # model with FSDP2 alone.
    outs = run_job(daemon, work, "mesh2d_load", 3)
    assert all("2-D checkpoint loaded by world 3" in o for o in outs)


@pytest.mark.timeout(600)
def test_plain_tensors_under_a_group_written_once(daemon, tmp_path):
    work = tmp_path / "w"
    run_job(daemon, work, "plain_save", 2)
    m = manifest(os.path.join(daemon.root, "plain"))
    assert_one_copy(m, ITEMSIZE)
    chunks = chunk_bytes(m)
    assert all(len(cs) == 1 for cs in chunks.values()), chunks
    assert sorted(chunks) == sorted(["p%d" % i for i in range(8)] + ["scalar", "ints"])
    # The writers are spread over the ranks (a function of the name).
    assert {cs[0][0] for cs in chunks.values()} == {0, 1}
    outs = run_job(daemon, work, "plain_load", 2)
    assert "plain, rank 0: 10 tensors equal" in outs[0]
    assert "plain, rank 1: 10 tensors equal" in outs[1]


@pytest.mark.timeout(600)
def test_partial_refused_before_anything_is_sent_and_overlap_at_commit(daemon, tmp_path):
    work = tmp_path / "w"
    outs = run_job(daemon, work, "partial", 2)
    for o in outs:
        assert "refused:" in o and "load refused:" in o and "overlap refused:" in o
        assert "Partial(sum)" in o
    assert not os.path.exists(os.path.join(daemon.root, "partial-first"))
    assert not os.path.exists(os.path.join(daemon.root, "partial-again"))
    assert not os.path.exists(os.path.join(daemon.root, "overlap", "manifest.json"))
    assert manifest(os.path.join(daemon.root, "good"))["world_size"] == 2


@pytest.mark.timeout(600)
def test_collectives_with_saves_in_flight_on_4_ranks(daemon, tmp_path):
    work = tmp_path / "w"
    outs = run_job(daemon, work, "allreduce", 4, 40, 4)
    for o in outs:
        assert "save of step 40: 2 tensors equal" in o
        # The guard saw the loop's collectives (its patch was live) and no
        # call into torch.distributed from another thread.
        calls = int(o.split("GUARD ok main_calls=")[1].split()[0])
        assert calls >= 40, o
    import ckptd
    assert [c.step for c in ckptd.list(daemon.root)] == list(range(4, 41, 4))
