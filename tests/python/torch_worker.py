"""One rank of the PyTorch backend tests, started by torch_launch.launch().
usage: torch_worker.py BACKEND RANK WORLD DIR MODE [ARGS...]
  Joins the process group through file://DIR/init (timeout: $TORCH_TEST_PG_TIMEOUT
  seconds, default 60), runs MODE and writes its result to DIR/outRANK.json.
  MODE colls:     every collective, checked against values computed from the ranks'
                  known inputs (torch_colls.py)
  MODE train:     DDP variants, ZeroRedundancyOptimizer, bf16 with fp32 master weights
                  (torch_train.py), FSDP2 training and tensor-parallel inference
                  (torch_shard.py); losses, final parameters, outputs, references
  MODE straggler: ARGS = SLOW_RANK SLEEP_MS STEPS: DDP training where SLOW_RANK sleeps in
                  its data loader every step (torch_fault.py)
  MODE kill:      ARGS = VICTIM STEP: DDP training where VICTIM SIGKILLs itself at STEP;
                  the others record how their wait failed (torch_fault.py)
BACKEND loom imports loom.torch, which registers the "loom" backend."""

import datetime
import faulthandler
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

backend, rank, world, workdir, mode = sys.argv[1:6]
args = sys.argv[6:]
rank, world = int(rank), int(world)
faulthandler.register(signal.SIGUSR2, all_threads=True)  # the launcher's request before a kill
torch.set_num_threads(1)
torch.set_num_interop_threads(1)
if backend == "loom":
    import loom.torch  # noqa: F401  registers "loom"

PG_TIMEOUT = float(os.environ.get("TORCH_TEST_PG_TIMEOUT", "60"))


def write(result):
    tmp = os.path.join(workdir, "out%d.json.tmp" % rank)
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(workdir, "out%d.json" % rank))


def main():
    t0 = time.monotonic()
    dist.init_process_group(backend, init_method="file://" + os.path.join(workdir, "init"), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=PG_TIMEOUT))
    t_init = time.monotonic() - t0
    if mode == "colls":
        import torch_colls
        result = torch_colls.check()
    elif mode == "mismatch":
        import torch_colls
        result = torch_colls.mismatches()
    elif mode == "train":
        import torch_shard
        import torch_train
        result = torch_train.run()
        shard = torch_shard.run()
        result["variants"].update(shard["variants"])
        result["reference"].update(shard["reference"])
    elif mode in ("straggler", "kill"):
        import torch_fault
        result = getattr(torch_fault, mode)(*[int(a) for a in args])
        if mode == "kill":  # the survivors' group is broken: write, then leave without a barrier
            write(result)
            dist.destroy_process_group()
            return
    else:
        raise SystemExit("unknown mode %r" % mode)
    result["init_s"] = t_init
    result["run_s"] = time.monotonic() - t0 - t_init
    dist.barrier()
    dist.destroy_process_group()
    write(result)


if __name__ == "__main__":
    main()
