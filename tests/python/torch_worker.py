"""One rank of the PyTorch backend tests, started by test_torch_backend.py.
usage: torch_worker.py BACKEND RANK WORLD INIT_FILE OUT_JSON MODE
  MODE train: 50 steps of DistributedDataParallel, then 50 ZeRO-style steps
              (reduce-scatter of gradients, all-gather of parameters); writes
              the losses and final parameters.
  MODE colls: every collective the backend offers, checked here against
              values computed from the ranks' known inputs; writes failures."""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

backend, rank, world, init_file, out_path, mode = sys.argv[1:7]
rank, world = int(rank), int(world)
torch.set_num_threads(1)
if backend == "loom":
    import loom.torch_backend  # noqa: F401  registers "loom"
dist.init_process_group(backend, init_method="file://" + init_file, rank=rank, world_size=world)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4), nn.Tanh(), nn.Linear(4, 1))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return x, (x[:, :4].sum(1, keepdim=True) - x[:, 4:].prod(1, keepdim=True)) * 0.5


def train_ddp(steps=50):
    model = nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


# The ZeRO step's two collectives. Gloo (torch 1.13) has neither _reduce_scatter_base nor
# _all_gather_base, so its reference run computes the same sums with all_reduce and all_gather.
def reduce_scatter(flat, shard):
    if backend == "gloo":
        dist.all_reduce(flat)
        return flat[rank * shard:(rank + 1) * shard].clone()
    mine = torch.zeros(shard)
    dist._reduce_scatter_base(mine, flat)
    return mine


def all_gather(full, mine):
    if backend == "gloo":
        parts = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        full.copy_(torch.cat(parts))
    else:
        dist._all_gather_base(full, mine)


def train_zero(steps=50, lr=0.05):
    model = make_model()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    shard = (n + world - 1) // world
    full = torch.zeros(shard * world)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        for p in params:
            p.grad = None
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = torch.zeros(shard * world)
        grads[:n] = torch.cat([p.grad.reshape(-1) for p in params])
        mine = reduce_scatter(grads, shard) / world  # mean of every rank's gradients, my shard
        flat = torch.zeros(shard * world)
        flat[:n] = torch.cat([p.detach().reshape(-1) for p in params])
        my_params = flat[rank * shard:(rank + 1) * shard] - lr * mine
        all_gather(full, my_params.contiguous())
        with torch.no_grad():
            off = 0
            for p in params:
                p.copy_(full[off:off + p.numel()].view_as(p))
                off += p.numel()
        losses.append(loss.item())
    return losses, full[:n].tolist()


def check_colls():
    bad = []

    def expect(name, got, want):
        if not torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-6):
            bad.append("%s: got %s want %s" % (name, got.tolist()[:6], want.tolist()[:6]))

    mine = lambda: torch.arange(6, dtype=torch.float32) + 10 * rank  # noqa: E731
    every = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world)]
    for op, ref in ((dist.ReduceOp.SUM, sum(every)), (dist.ReduceOp.MAX, every[-1]),
                    (dist.ReduceOp.MIN, every[0])):
        t = mine()
        work = dist.all_reduce(t, op=op, async_op=True)
        work.wait()
        expect("all_reduce %s" % op, t, ref)
        expect("all_reduce %s future" % op, work.get_future().wait()[0], ref)
    for root in range(world):
        t = mine()
        dist.broadcast(t, src=root)
        expect("broadcast %d" % root, t, every[root])
        t = mine()
        dist.reduce(t, dst=root)
        if rank == root:
            expect("reduce %d" % root, t, sum(every))
    outs = [torch.zeros(6) for _ in range(world)]
    dist.all_gather(outs, mine())
    for r in range(world):
        expect("all_gather[%d]" % r, outs[r], every[r])
    flat = torch.zeros(6 * world)
    dist._all_gather_base(flat, mine())
    expect("_all_gather_base", flat, torch.cat(every))
    out = torch.zeros(6)
    dist.reduce_scatter(out, [mine() * (j + 1) for j in range(world)])
    expect("reduce_scatter", out, sum(every) * (rank + 1))
    out = torch.zeros(2)
    dist._reduce_scatter_base(out, torch.cat([mine()[:2] for _ in range(world)]))
    expect("_reduce_scatter_base", out, sum(every)[:2])
    ins = [torch.full((3,), float(100 * rank + j)) for j in range(world)]
    outs = [torch.zeros(3) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        expect("all_to_all[%d]" % r, outs[r], torch.full((3,), float(100 * r + rank)))
    single = torch.zeros(world * 2, dtype=torch.int64)
    dist.all_to_all_single(single, torch.arange(world * 2, dtype=torch.int64) + 100 * rank)
    want = torch.tensor([100 * r + 2 * rank + k for r in range(world) for k in range(2)])
    expect("all_to_all_single", single, want)
    # Unequal splits (rows of 2 elements; rank i sends rank j i + j + 1 rows), as a list and
    # as one tensor.
    rows = lambda i, j: i + j + 1  # noqa: E731
    ins = [torch.full((rows(rank, j), 2), float(100 * rank + j)) for j in range(world)]
    outs = [torch.zeros(rows(r, rank), 2) for r in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        expect("all_to_all unequal[%d]" % r, outs[r], torch.full((rows(r, rank), 2), float(100 * r + rank)))
    out = torch.zeros(sum(rows(r, rank) for r in range(world)), 2)
    dist.all_to_all_single(out, torch.cat(ins), output_split_sizes=[rows(r, rank) for r in range(world)],
                           input_split_sizes=[rows(rank, j) for j in range(world)])
    expect("all_to_all_single splits", out, torch.cat(outs))
    for root in range(world):
        parts = [torch.zeros(4) for _ in range(world)] if rank == root else None
        dist.gather(mine()[:4] + root, parts, dst=root)
        if rank == root:
            expect("gather %d" % root, torch.cat(parts), torch.cat([e[:4] + root for e in every]))
        got = torch.zeros(3, dtype=torch.int32)
        src = [torch.arange(3, dtype=torch.int32) + 10 * j + root for j in range(world)]
        dist.scatter(got, src if rank == root else None, src=root)
        expect("scatter %d" % root, got, torch.arange(3, dtype=torch.int32) + 10 * rank + root)
    if world > 1:
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        got = torch.zeros(5, dtype=torch.float64)
        if rank % 2 == 0:
            dist.send(torch.full((5,), float(rank), dtype=torch.float64), nxt)
            dist.recv(got, prev)
        else:
            dist.recv(got, prev)
            dist.send(torch.full((5,), float(rank), dtype=torch.float64), nxt)
        expect("send/recv", got, torch.full((5,), float(prev), dtype=torch.float64))
    dist.barrier()
    bf = torch.ones(4, dtype=torch.bfloat16) * (rank + 1)
    dist.all_reduce(bf)
    expect("all_reduce bfloat16", bf.float(), torch.full((4,), float(world * (world + 1) // 2)))
    # A tensor over loom.mem_alloc memory (torch.frombuffer, no copy), large enough for the
    # direct all-reduce's slices, which read such inputs in place.
    count = 1 << 16
    shared = torch.frombuffer(loom.mem_alloc(count, "float32"), dtype=torch.float32)
    pattern = torch.arange(count, dtype=torch.float32) % 7
    shared.copy_(pattern + rank)
    dist.all_reduce(shared)
    expect("all_reduce on loom.mem_alloc memory", shared, pattern * world + sum(range(world)))
    return bad


if mode == "train":
    ddp_losses, ddp_params = train_ddp()
    zero_losses, zero_params = train_zero()
    result = {"ddp_losses": ddp_losses, "ddp_params": ddp_params,
              "zero_losses": zero_losses, "zero_params": zero_params}
else:
    result = {"failures": check_colls()}
dist.barrier()
dist.destroy_process_group()
with open(out_path, "w") as f:
    json.dump(result, f)
