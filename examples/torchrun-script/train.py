"""A plain torchrun DDP script (gloo on CPU, NCCL on GPU) that also runs unchanged on Trainyard.

    torchrun --nproc-per-node 2 train.py --steps 40
    trainyard run spec.yaml            # the same script, with restarts, metrics and dashboards

It imports only torch and Trainyard's session API (`trainyard`), which does nothing outside
Trainyard. It resumes from its newest complete checkpoint, so a restart loses no work.
"""

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainyard


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # The same data on any launcher: seeded by step and rank.
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 32, generator=g)
    return x, x @ torch.linspace(-1, 1, 32).unsqueeze(1) + 0.1 * torch.randn(size, 1, generator=g)


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds of extra work per step")
    args = parser.parse_args()

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's env:// variables
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    latest = trainyard.latest_checkpoint()
    if latest is not None:
        state = torch.load(latest, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}: resumed from {latest.name} (restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')})",
              flush=True)
    ddp = DistributedDataParallel(model)

    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = batch(step, rank, args.batch)
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.sleep:
            time.sleep(args.sleep)
        elapsed = time.perf_counter() - t0
        trainyard.report({"loss": loss.item(), "samples_per_s": args.batch * world / elapsed}, step=step)
        if rank == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
        # Ranks must agree before acting on a stop request (one rank leaving alone hangs the others).
        stop = torch.tensor([int(trainyard.should_stop())], device=device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if step % args.checkpoint_every == 0 or step == args.steps or stop.item():
            if rank == 0:  # DDP replicas are equal: rank 0 saves, atomically (temp name, then rename)
                path = trainyard.checkpoint_dir() / f"step-{step}.pt"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           path.with_suffix(".tmp"))
                os.replace(path.with_suffix(".tmp"), path)
            dist.barrier()
            if stop.item():
                print(f"rank {rank}: asked to stop, saved at step {step}", flush=True)
                break
    if rank == 0:
        (trainyard.checkpoint_dir() / "final.sha256").write_text(params_sha256(model))
        print(f"params_sha256 {params_sha256(model)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
