"""Sharded training and inference over a CPU DeviceMesh of the whole group:

  fsdp        FSDP2 (fully_shard on every Linear, then on the model), fp32, SGD with momentum
  fsdp_bf16   the same with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16):
              bfloat16 compute and gradient reduce-scatter, fp32 sharded master parameters
  tp          a transformer block (attention with 4 heads, MLP) split with parallelize_module
              (q, k, v and up ColwiseParallel; o and down RowwiseParallel), inference only
  tp_compiled the same block under torch.compile (inductor, one graph), on loom's 2 ranks only
              (each rank compiles, 25-40 s on 2 cores): its all-reduces are the functional
              collectives (_c10d_functional.all_reduce_, wait_tensor) that the compiled graph
              calls on the group's backend

run() returns {"variants": {name: {"losses"/"output": ..., "params": ...}}, "reference": ...}:
the unsharded block's output on the same input and, on rank 0, the fsdp model trained in
one process on every rank's batches."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from torch_train import LR, STEPS, batch, flat, mlp


def full_params(model):
    return flat([p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()])


def train_fsdp(mesh, rank, bf16):
    model = mlp()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else \
        MixedPrecisionPolicy()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, rank)
        loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    return {"losses": losses, "params": full_params(model), "param_dtypes": dtypes,
            "sharded": all(isinstance(p, DTensor) for p in model.parameters())}


def reference_fsdp(world):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        xs, ys = zip(*[batch(step, r) for r in range(world)])
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat(model.parameters())


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: the sharded q, k and v hold heads / world of them.
        q, k, v = (m(x).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim=32, heads=4, hidden=64):
        super().__init__()
        torch.manual_seed(1)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def tp_inference(mesh, compiled):
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = Block()(x)
        block = parallelize_module(Block(), mesh, {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
        run = torch.compile(block, fullgraph=True) if compiled else block
        got = run(x)
    local = block.up.weight.to_local().shape[0]
    return {"output": got.reshape(-1).tolist(), "local_up_rows": local}, want.reshape(-1).tolist()


def run():
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    variants = {"fsdp": train_fsdp(mesh, rank, False), "fsdp_bf16": train_fsdp(mesh, rank, True)}
    variants["tp"], tp_want = tp_inference(mesh, False)
    if world == 2 and dist.get_backend() == "loom":
        variants["tp_compiled"], _ = tp_inference(mesh, True)
    return {"variants": variants, "reference": {
        "fsdp": reference_fsdp(world) if rank == 0 else None, "tp": tp_want}}
