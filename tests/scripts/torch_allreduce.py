"""A torchrun-style script, unchanged: env:// init, one all_reduce, checked against the closed form.

Run by the tests as `dp-launch -n N -- python torch_allreduce.py gloo|nccl`.
"""
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
dist.init_process_group(backend)  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"]), "rank/world disagree with env"
local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)

# Each rank contributes (rank + 1) * [1, 2, 3]; the sum is world * (world + 1) / 2 * [1, 2, 3].
t = (rank + 1) * torch.tensor([1.0, 2.0, 3.0], device=device)
dist.all_reduce(t)
expected = world * (world + 1) / 2 * torch.tensor([1.0, 2.0, 3.0])
if not torch.equal(t.cpu(), expected):
    print(f"rank {rank}: all_reduce gave {t.tolist()}, expected {expected.tolist()}", file=sys.stderr)
    sys.exit(1)
dist.barrier()
print(f"rank {rank}/{world}: all_reduce ok ({backend}) {t.tolist()}", flush=True)
dist.destroy_process_group()
