"""Ray Train's TorchTrainer running an unmodified torchrun script, for bench/programs.py.

    RAY_ADDRESS=HOST:PORT python bench/raytrain_program.py --script train.py --workdir DIR \
        --out DIR --storage DIR -- --steps 400 --log-rate

Each of the 2 Ray Train workers calls the script's own `main()` in its worker process (torch is
already imported there, as it would be in a hand-ported Ray Train loop). Ray Train has formed a
gloo process group and set torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) before the loop starts; the script calls `dist.init_process_group`
itself, which fails on an initialised group. So the loop agrees a fresh rendezvous port over Ray
Train's group, closes that group, and lets the script form its own from the same variables: the
script's code runs unchanged, at the cost of one extra gloo rendezvous (tens of ms). Rank 0's
stdout goes to OUT/rank-0.out; the driver prints `fit_called <unix time>` just before fit().
"""

from __future__ import annotations

import argparse
import os
import time


def train_loop_per_worker(config: dict) -> None:
    import contextlib
    import importlib.util
    import socket
    import sys

    import torch.distributed as dist
    from ray import train

    rank = train.get_context().get_world_rank()
    port = [None]
    if rank == 0:
        with socket.socket() as s:
            s.bind((os.environ["MASTER_ADDR"], 0))
            port[0] = s.getsockname()[1]
    dist.broadcast_object_list(port, src=0)
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port[0])

    os.chdir(config["workdir"])  # the script's ./checkpoints (outside Trainyard): a fresh directory per run
    spec = importlib.util.spec_from_file_location("torchrun_script", config["script"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.argv = [config["script"], *config["args"]]
    out = open(os.path.join(config["out"], f"rank-{rank}.out"), "w")
    with out, contextlib.redirect_stdout(out):
        module.main()


def main() -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    parser = argparse.ArgumentParser()
    parser.add_argument("--script", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    args = parser.parse_args()
    script_args = args.args[1:] if args.args[:1] == ["--"] else args.args

    # As `trainyard run` connects (service/ray_client.py): this checkout on the workers' path.
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"script": args.script, "workdir": args.workdir, "out": args.out, "args": script_args},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="programs-bench", storage_path=args.storage),
    )
    print(f"fit_called {time.time():.6f}", flush=True)
    trainer.fit()


if __name__ == "__main__":
    main()
