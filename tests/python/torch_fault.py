"""A late rank and a dead rank, in short training runs.

straggler(slow, sleep_ms, steps): DDP training where rank `slow` sleeps sleep_ms in its data
  loader before every batch, so it enters each step's first all-reduce that much after the
  others. With LOOM_TRACE_DIR set the backend's communicators dump their flight recorders
  at destroy; the test then runs loom-trace over that folder.

kill(victim, step): training with explicit gradient all-reduces (async_op=True, then
  wait()); at `step` the victim writes the time and SIGKILLs itself before its all-reduce.
  Every other rank records where its step failed (the all_reduce call or wait()), the
  exception's text, and the seconds from the kill to the failure."""

import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

from torch_train import batch, mlp


class SlowLoader(IterableDataset):
    def __init__(self, rank, slow, sleep_ms, steps):
        self.rank, self.slow, self.sleep_ms, self.steps = rank, slow, sleep_ms, steps

    def __iter__(self):
        for step in range(self.steps):
            if self.rank == self.slow:
                time.sleep(self.sleep_ms / 1000.0)
            yield batch(step, self.rank)


def straggler(slow, sleep_ms, steps):
    rank = dist.get_rank()
    model = mlp()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    t0 = time.monotonic()
    for x, y in DataLoader(SlowLoader(rank, slow, sleep_ms, steps), batch_size=None, num_workers=0):
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "train_s": time.monotonic() - t0}


def kill(victim, step_to_die, max_steps=100000):
    rank = dist.get_rank()
    stamp = os.path.abspath("killed_at")  # the launcher runs every rank in its work folder
    model = mlp()
    params = list(model.parameters())
    dist.broadcast(torch.cat([p.detach().reshape(-1) for p in params]), 0)
    opt = torch.optim.SGD(params, lr=0.01)
    world = dist.get_world_size()
    result = {"steps": 0}
    for step in range(max_steps):
        opt.zero_grad()
        x, y = batch(step % 50, rank)
        F.mse_loss(model(x), y).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        if rank == victim and step == step_to_die:
            with open(stamp + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.replace(stamp + ".tmp", stamp)
            os.kill(os.getpid(), signal.SIGKILL)
        phase = "all_reduce"
        try:
            work = dist.all_reduce(grads, async_op=True)
            phase = "wait"
            work.wait()
        except Exception as e:  # noqa: BLE001  what the test is about
            now = time.time()
            killed_at = None
            if os.path.exists(stamp):
                with open(stamp) as f:
                    killed_at = float(f.read())
            result.update(phase=phase, error="%s: %s" % (type(e).__name__, e), failed_step=step,
                          after_kill_s=None if killed_at is None else now - killed_at)
            return result
        off = 0
        for p in params:
            p.grad.copy_(grads[off:off + p.numel()].view_as(p) / world)
            off += p.numel()
        opt.step()
        result["steps"] = step + 1
    result["error"] = None
    return result
