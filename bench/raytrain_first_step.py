"""The Ray Jobs baseline for bench/api_load.py: the same tiny GPT on the same byte-level
corpus, 2 data-parallel workers with Ray Train's TorchTrainer. Rank 0 writes the wall
time of its first finished step to --out. Run with `ray job submit -- python this.py --out F`."""

from __future__ import annotations

import argparse
import json
import time


def train_loop(config: dict) -> None:
    import torch
    import torch.nn.functional as F
    from ray import train
    from ray.train.torch import prepare_model

    from workers.data.pystdlib_text import pystdlib_splits
    from workers.models.gpt import GPT

    torch.manual_seed(0)
    model = prepare_model(GPT(vocab_size=256, seq_len=32, n_layers=1, d_model=32, n_heads=2, dropout=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, _ = pystdlib_splits(200_000, 0.05, 32)
    rank = train.get_context().get_world_rank()
    for step in range(1, config["steps"] + 1):
        idx = torch.randint(len(data), (8,))
        x = torch.stack([data[int(i)][0] for i in idx])
        y = torch.stack([data[int(i)][1] for i in idx])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1 and rank == 0:
            with open(config["out"], "w") as f:
                json.dump({"first_step_ts": time.time(), "loss": loss.item()}, f)


def main() -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    trainer = TorchTrainer(train_loop, train_loop_config={"out": args.out, "steps": args.steps},
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                           torch_config=TorchConfig(backend="gloo"), run_config=RunConfig(name="first-step-baseline"))
    trainer.fit()


if __name__ == "__main__":
    main()
