"""A torchrun-style script: run it with `dp-launch -n 2 -- python examples/hello_distributed.py`.

It uses nothing but torch.distributed's env:// initialisation, so it runs unchanged under torchrun.
"""
import os
import socket

import torch
import torch.distributed as dist

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")

x = torch.tensor([float(rank + 1)], device=device)
dist.all_reduce(x)
print(
    f"hello from rank {rank} of {world} on {socket.gethostname()} ({backend}, {device}); "
    f"sum of 1..{world} over all ranks = {x.item():g}",
    flush=True,
)
dist.destroy_process_group()
