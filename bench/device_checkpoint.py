"""The device check's checkpoint row: how long a DCP save blocks the training loop, asynchronously
(Trainyard's Checkpointer, workers/checkpointing/saver.py) against a synchronous `dcp.save` of the
same model and optimiser state, in one process (world size 1: gloo on the CPU, NCCL on a GPU).

Issue 21's target: blocked <= 1/10 of the synchronous save (published: 148.8 s -> 6.3 s for a 7B
model). On a GPU the model is a ~350M-parameter HF Llama; a dry run uses a tiny one on the CPU,
which checks that the path works, not the figure.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict

from workers.checkpointing.saver import OPTIM_OPTIONS, Checkpointer

LLAMA_350M = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
LLAMA_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)


def _model_and_optimizer(device: str, tiny: bool):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model("llama", **(LLAMA_TINY if tiny else LLAMA_350M))
    model = AutoModelForCausalLM.from_config(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (1, 16), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()  # the optimiser's state exists, as in a checkpoint taken during training
    return model, optimizer


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(device: str, tiny: bool, workdir: Path) -> dict:
    """Seconds: the synchronous save, the async save's blocking part and its time to durable (second of two
    rounds each: the first pays DCP's one-time planning)."""
    workdir.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1,
                            store=dist.FileStore(str(workdir / "store"), 1))
    try:
        model, optimizer = _model_and_optimizer(device, tiny)
        params = sum(p.numel() for p in model.parameters())
        checkpointer = Checkpointer(str(workdir / "async"), keep=2, rank=0)
        out: dict = {"params": params}
        for round_ in (1, 2):
            _sync(device)
            started = time.monotonic()
            model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIM_OPTIONS)
            dcp.save({"model": model_sd, "optim": optim_sd},
                     storage_writer=FileSystemWriter(str(workdir / f"sync-{round_}")))
            out["sync_s"] = time.monotonic() - started
            _sync(device)
            started = time.monotonic()
            checkpointer.save(model, optimizer, step=round_)
            out["blocked_s"] = time.monotonic() - started  # the loop would go on from here
            checkpointer.wait()
            out["durable_s"] = time.monotonic() - started
        dist.destroy_process_group(checkpointer.group)
        return out
    finally:
        dist.destroy_process_group()


def checkpoint_row(device: str, dry_run: bool, workdir: str) -> str:
    m = measure(device, dry_run, Path(workdir) / f"checkpoint-{os.getpid()}")
    ratio = m["blocked_s"] / m["sync_s"]
    verdict = "dry run: a tiny model on the CPU, not the issue's figure" if dry_run else (
        f"target <= 0.1: {'met' if ratio <= 0.1 else 'not met'}")
    return (f"DCP checkpoint of {m['params'] / 1e6:.1f}M parameters + AdamW state: synchronous save "
            f"{m['sync_s']:.2f} s; async save blocks the loop {m['blocked_s']:.3f} s ({ratio:.3f} of it), "
            f"durable after {m['durable_s']:.2f} s ({verdict})")
