# SPDX-License-Identifier: MIT
"""CUDA tensors (real GPU only; SKIP without one).  What is saved is the
tensor as it is when async_save is called, even while the trainer's stream
goes on changing it; the tensor stays alive until staged; load fills CUDA
destinations in place."""
import os

import pytest
import torch

import ckptd.torch as ct

if not torch.cuda.is_available():
    pytest.skip("SKIP: [python_cuda] no CUDA device: these run on a GPU machine",
                allow_module_level=True)


def test_saved_as_at_the_call_while_the_stream_goes_on(daemon):
    dev = torch.device("cuda", 0)
    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        w = torch.arange(1 << 24, device=dev, dtype=torch.float32)
        torch.cuda._sleep(50_000_000)          # the stream is busy when we call
        w.add_(1)                              # queued before the call: saved
        want = w.clone()
        r = ct.async_save({"w": w, "h": w.to(torch.bfloat16)},
                          checkpoint_id=os.path.join(daemon.root, "cuda"), step=1)
        w.mul_(-1)                             # queued after the call: not saved
    r.staging_completion.result(timeout=300)
    r.upload_completion.result(timeout=300)
    got = {"w": torch.zeros_like(want), "h": torch.zeros_like(want, dtype=torch.bfloat16)}
    ct.load(got, checkpoint_id=os.path.join(daemon.root, "cuda"))
    torch.cuda.synchronize()
    assert torch.equal(got["w"], want)
    assert torch.equal(got["h"], want.to(torch.bfloat16))


def test_tensor_freed_by_the_trainer_is_kept_until_staged(daemon):
    dev = torch.device("cuda", 0)
    t = torch.full((1 << 22,), 3.0, device=dev)
    r = ct.async_save({"t": t}, checkpoint_id=os.path.join(daemon.root, "kept"), step=1)
    del t
    junk = [torch.full((1 << 22,), -1.0, device=dev) for _ in range(8)]  # reuse pressure
    r.upload_completion.result(timeout=300)
    got = {"t": torch.zeros(1 << 22)}
    ct.load(got, checkpoint_id=os.path.join(daemon.root, "kept"))
    assert torch.equal(got["t"], torch.full((1 << 22,), 3.0))
    del junk
