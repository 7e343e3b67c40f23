"""Data-parallel training on the process group in use, every variant from the same seed
and the same per-rank batches, so that two backends can be compared step by step:

  ddp           DistributedDataParallel with bucket_cap_mb 0.0001 (a bucket per layer),
                a no_sync() micro-batch accumulated into every 4th step
  ddp_unused    find_unused_parameters=True: one branch used on even steps only, one never
  hook_allreduce  default_hooks.allreduce_hook, gradient_as_bucket_view=True
  hook_bf16     default_hooks.bf16_compress_hook (gradients cross in bfloat16)
  bf16_master   a bfloat16 model whose gradients are all-reduced in bfloat16 and applied
                to an fp32 master copy (SGD with momentum), copied back every step
  zero          ZeroRedundancyOptimizer (Adam) over DDP; parameters broadcast by their owner
  pipeline      torch.distributed.pipelining's GPipe: the MLP split into one stage per rank,
                activations and gradients sent between stages (4 micro-batches a step)

run() returns {"variants": {name: {"losses": [this rank's], "params": [...], ...}},
"reference": {"ddp": ...}}: on rank 0, the ddp variant trained in one process on every rank's
batches at once (the same mean gradient, summed in another order), the independent check
that data parallelism happened at all."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 20
BATCH = 8
LR = 0.05


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


class Branchy(nn.Module):
    """side is used on even steps only; never is never used."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.head = nn.Linear(16, 32), nn.Linear(32, 4)
        self.side, self.never = nn.Linear(32, 4), nn.Linear(32, 4)

    def forward(self, x, use_side):
        h = torch.tanh(self.trunk(x))
        return self.head(h) + self.side(h) if use_side else self.head(h)


def batch(step, rank, micro=0):
    g = torch.Generator().manual_seed(100003 * micro + 1000 * step + rank)
    x = torch.randn(BATCH, 16, generator=g)
    y = torch.stack([x[:, :4].sum(1), x[:, 4:8].prod(1), x[:, 8:12].max(1).values, x[:, 12:].mean(1)], 1)
    return x, y


def bf16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """default_hooks.bf16_compress_hook under another name: DDP refuses that name unless CUDA
    and NCCL are present (a check by name alone); the hook itself runs on any backend."""
    return default_hooks.bf16_compress_hook(state, bucket)


def flat(params):
    return torch.cat([p.detach().float().reshape(-1) for p in params]).tolist()


def num_buckets(model):
    data = model._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return len([s for s in str(sizes).split(",") if s.strip()])


def train_ddp(variant, rank):
    """One of the DDP variants; returns its record."""
    branchy = variant == "ddp_unused"
    model = Branchy() if branchy else mlp()
    kw = {"bucket_cap_mb": 0.0001}
    if branchy:
        kw["find_unused_parameters"] = True
    if variant == "hook_allreduce":
        kw["gradient_as_bucket_view"] = True
    ddp = DDP(model, **kw)
    if variant == "hook_allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant == "hook_bf16":
        ddp.register_comm_hook(None, bf16_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        if variant == "ddp" and step % 4 == 0:
            with ddp.no_sync():  # a micro-batch whose gradient waits for the next backward
                x, y = batch(step, rank, micro=1)
                F.mse_loss(ddp(x), y).backward()
        x, y = batch(step, rank)
        loss = F.mse_loss(ddp(x, step % 2 == 0) if branchy else ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": flat(model.parameters()), "buckets": num_buckets(ddp)}


def reference_ddp(world):
    """The ddp variant in one process, on every rank's batches at once."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        if step % 4 == 0:
            xs, ys = zip(*[batch(step, r, micro=1) for r in range(world)])
            F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        xs, ys = zip(*[batch(step, r) for r in range(world)])
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat(model.parameters())


def train_bf16_master(rank, world):
    model = mlp().to(torch.bfloat16)
    params = list(model.parameters())
    master = [p.detach().float().clone() for p in params]
    momentum = [torch.zeros_like(m) for m in master]
    losses = []
    for step in range(STEPS):
        for p in params:
            p.grad = None
        x, y = batch(step, rank)
        loss = F.mse_loss(model(x.to(torch.bfloat16)).float(), y)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params])  # bfloat16
        work = dist.all_reduce(grads, async_op=True)
        work.wait()
        grads = grads.float() / world
        off = 0
        with torch.no_grad():
            for p, m, v in zip(params, master, momentum):
                g = grads[off:off + p.numel()].view_as(m)
                off += p.numel()
                v.mul_(0.9).add_(g)
                m.add_(v, alpha=-LR)
                p.copy_(m)
        losses.append(loss.item())
    return {"losses": losses, "params": flat(master), "model": flat(params)}


def train_zero(rank):
    model = mlp()
    ddp = DDP(model, bucket_cap_mb=0.0001)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, rank)
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    owned = sum(p.numel() for p in opt.optim.param_groups[0]["params"])
    return {"losses": losses, "params": flat(model.parameters()), "owned": owned}


def stage_of(model, stage, stages):
    """The mlp's layers of one pipeline stage: its 4 linears (each with the Tanh after it)
    shared out in order, 4 / stages to a stage."""
    layers = list(model)
    per = 8 // stages
    return nn.Sequential(*layers[stage * per:(stage + 1) * per])


def train_pipeline(rank, world):
    """GPipe over one stage per rank: rank 0 feeds the batch, the last rank computes the loss;
    every rank returns every stage's parameters (gathered) and the last rank's losses."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    module = stage_of(mlp(), rank, world)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, 0)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            micro = []
            schedule.step(target=y, losses=micro)
            losses.append(sum(m.item() for m in micro) / len(micro))
        else:
            schedule.step()
        opt.step()
    mine = flat(module.parameters())
    stages = [None] * world
    dist.all_gather_object(stages, mine)
    last = [losses]
    dist.broadcast_object_list(last, src=world - 1)
    return {"losses": last[0], "params": [v for s in stages for v in s]}


def reference_pipeline():
    """The pipeline variant in one process: the whole mlp on the same batches."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, 0)
        F.mse_loss(model(x), y).backward()
        opt.step()
    return flat(model.parameters())


def run():
    rank, world = dist.get_rank(), dist.get_world_size()
    variants = {}
    for v in ("ddp", "ddp_unused", "hook_allreduce", "hook_bf16"):
        variants[v] = train_ddp(v, rank)
    variants["bf16_master"] = train_bf16_master(rank, world)
    variants["zero"] = train_zero(rank)
    variants["pipeline"] = train_pipeline(rank, world)
    return {"variants": variants,
            "reference": {"ddp": reference_ddp(world) if rank == 0 else None,
                          "pipeline": reference_pipeline() if rank == 0 else None}}
