# SPDX-License-Identifier: MIT
"""The trainer of test_resume.py (run as a program, not collected by pytest).

    resume_trainer.py ROOT STEPS EVERY LIFE LOG FINAL [KILL_AT]

Trains a small model for STEPS steps from ckptd.latest(ROOT) (or from the
start), saving asynchronously every EVERY steps to ROOT/step-NNNNN-LIFE, with
the exact-resume recipe: LoaderState over a StatefulDataLoader (2 workers,
shuffle, prefetch) whose dataset draws noise in the workers (worker_rng),
dropout in the main process (RNGState), Adam.  Appends "step loss" (the loss
as float.hex) to LOG after every step.  With KILL_AT, after that step it
waits until its last save is staged (ckptd then commits it without the
trainer), writes "stop" to LOG and waits to be killed.  At the end it writes the final
parameters and optimizer state to FINAL (torch.save).
"""
import sys
import time

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import ckptd
import ckptd.data
import ckptd.rng
import ckptd.torch


class Noisy(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(40, 8, generator=g)
        self.y = torch.randn(40, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(8), self.y[i]


def main():
    root, steps, every, life, log, final = sys.argv[1:7]
    steps, every = int(steps), int(every)
    kill_at = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = StatefulDataLoader(ckptd.data.worker_rng(Noisy()), batch_size=4, shuffle=True,
                                num_workers=2, prefetch_factor=2)
    state = {"model": model, "optim": opt, "data": ckptd.data.LoaderState(loader),
             "rng": ckptd.rng.RNGState(), "step": 0}
    latest = ckptd.latest(root)
    if latest:
        ckptd.torch.load(state, checkpoint_id=latest)
    step = state["step"]

    def batches():
        while True:
            yield from loader

    it = batches()
    pending = None
    with open(log, "a") as out:
        while step < steps:
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if pending is not None:  # the saved tensors must not change until staged
                pending.staging_completion.result()
            opt.step()
            step += 1
            out.write("%d %s\n" % (step, loss.item().hex()))
            out.flush()
            if step % every == 0:
                state["step"] = step
                pending = ckptd.torch.async_save(
                    state, checkpoint_id="%s/step-%05d-%s" % (root, step, life), step=step)
            if step == kill_at:
                if pending is not None:  # ckptd owns its bytes: it commits it alone
                    pending.staging_completion.result()
                out.write("stop\n")
                out.flush()
                while True:
                    time.sleep(1)
    if pending is not None:
        pending.upload_completion.result()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, final)


if __name__ == "__main__":
    main()
