"""The device check's throughput row: a ~350M-parameter HF Llama trained by Trainyard (the worker side:
Trainer and strategy, world size 1, bf16 autocast, no activation checkpointing) beside a plain
hand-written PyTorch loop of the same model on the same device, interleaved and each in its own process.

Issue 21's target: Trainyard's tokens/s >= 0.97 of the plain loop's, MFU >= 40%. The plain loop is what a
user writes: the model from its config (transformers' default attention, SDPA), bf16 autocast, AdamW with
torch's default implementation, the global-norm clip Trainyard also applies, random token ids already on the
device (no data loading: the comparison is strict). Neither side uses torch.compile (the spec has no such
key yet). The micro-batch is the largest power of two with which the plain loop's step fits, and Trainyard
trains the same one as a global batch of that size (halved for both if Trainyard's does not fit).
Steady tokens/s: tokens of the steps after the warm-up over their wall time (Trainyard's: between its step
records, so per-step reporting and its synchronisation count against it). MFU is the service's own
(service/metric_catalogue.py: 6 x parameters x tokens/s over the device's peak, workers/peak_flops.py).
A dry run trains a tiny Llama on the CPU: it checks the path, not the figure.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.device_checkpoint import LLAMA_350M, LLAMA_TINY
from service.metric_catalogue import mfu
from workers.peak_flops import peak_flops

SEQ_GPU, SEQ_DRY = 2048, 64
CANDIDATES_GPU = (1, 2, 4, 8, 16, 32, 64, 128)
WARMUP, STEPS = 5, 20  # timed steps after the warm-up (a dry run: 1 and 3)


def _llama(config: dict, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **config)).to(device)


def plain_loop(config: dict, device: str, micro_batch: int, seq: int, warmup: int, steps: int) -> dict:
    """Tokens/s of the hand-written loop over `steps` steps after `warmup` (raises on OOM)."""
    if device == "cpu":
        torch.set_num_threads(1)  # as Trainyard's ranks in a dry run (workers/runtime/local_ranks.py)
    model = _llama(config, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config["vocab_size"], (micro_batch, seq + 1), device=device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    started = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            started = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    elapsed = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {"tokens_per_s": micro_batch * seq * steps / elapsed, "params": sum(p.numel() for p in model.parameters()),
            "peak_bytes": peak}


def trainyard_spec(config: dict, micro_batch: int, seq: int, steps: int, gpu: bool) -> dict:
    return {
        "name": "llama350m-throughput",
        "model": {"hf": {"model_type": "llama", "config": dict(config)}},
        "data": {"name": "text:pystdlib", "seq_len": seq},
        "train": {"steps": steps, "global_batch_size": micro_batch, "micro_batch_size": micro_batch, "lr": 1e-4,
                  "warmup_steps": 0, "seed": 0, "eval_every": 0},
        "parallel": {"mixed_precision": "bf16"},
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 1 if gpu else 0},
    }


def trainyard_loop(config: dict, device: str, micro_batch: int, seq: int, warmup: int, steps: int,
                   workdir: str) -> dict:
    """Tokens/s of Trainyard's Trainer between its step records after `warmup` (raises with its error)."""
    from bench.device_cases import build
    from workers.runtime.local_ranks import run_jobs
    name, spec = build([("throughput", trainyard_spec(config, micro_batch, seq, warmup + steps, device == "cuda"))])[0]
    result = run_jobs([(name, spec)], 1, workdir, device, timeout_s=900)[name][0]
    if result.get("state") != "SUCCEEDED":
        raise RuntimeError(result.get("error", "no result"))
    records = result["records"]
    timed = records[warmup:]
    elapsed = timed[-1]["ts"] - records[warmup - 1]["ts"]
    peak = max((r.get("peak_memory_bytes") or 0) for r in records) or None
    return {"tokens_per_s": sum(r["tokens"] for r in timed) / elapsed, "params": records[-1]["model_params"],
            "peak_bytes": peak}


def _run(queue, fn, args) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except Exception as exc:  # an OOM is an answer here, not a crash of the check
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def _in_own_process(fn, *args) -> dict | str:
    """`fn(*args)` in a fresh process, so each side starts with an empty GPU: its result dict, or its error."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run, args=(queue, fn, args))
    proc.start()
    kind, value = queue.get(timeout=1800)
    proc.join()
    return value if kind == "ok" else str(value)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _out_of_memory(error: str) -> bool:
    return "out of memory" in error.lower()


def _largest_fitting(config: dict, device: str, seq: int) -> int:
    """In one process (a fresh one per candidate cost ~15 s each): the plain loop's step at each candidate
    micro-batch, ascending, until one runs out of memory; the largest that ran (0: none)."""
    model = _llama(config, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fits = 0
    for candidate in CANDIDATES_GPU:
        try:
            ids = torch.randint(0, config["vocab_size"], (candidate, seq + 1), device=device)
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(input_ids=ids[:, :-1]).logits
            F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
        except torch.OutOfMemoryError:
            break
        finally:
            ids = logits = None
            torch.cuda.empty_cache()
        fits = candidate
    return fits


def largest_micro_batch(config: dict, device: str, seq: int) -> int:
    fits = _in_own_process(_largest_fitting, config, device, seq)
    if isinstance(fits, str):
        raise RuntimeError(f"the plain loop failed while sizing its micro-batch: {fits}")
    if not fits:
        raise RuntimeError("the plain loop's step does not fit at micro-batch 1")
    return fits


def measure(device: str, dry_run: bool, workdir: Path) -> dict:
    config, seq = (LLAMA_TINY, SEQ_DRY) if dry_run else (LLAMA_350M, SEQ_GPU)
    warmup, steps = (1, 3) if dry_run else (WARMUP, STEPS)
    micro_batch = 2 if dry_run else largest_micro_batch(config, device, seq)
    while True:
        plain = _in_own_process(plain_loop, config, device, micro_batch, seq, warmup, steps)
        ours = _in_own_process(trainyard_loop, config, device, micro_batch, seq, warmup, steps,
                               str(workdir / f"mb{micro_batch}"))
        if isinstance(ours, str) and _out_of_memory(ours) and micro_batch > 1:
            micro_batch //= 2
            continue
        for side, result in (("plain loop", plain), ("Trainyard", ours)):
            if isinstance(result, str):
                raise RuntimeError(f"{side} at micro-batch {micro_batch}: {result}")
        return {"plain": plain, "trainyard": ours, "micro_batch": micro_batch, "seq": seq}


def throughput_row(device: str, dry_run: bool, workdir: str) -> str:
    m = measure(device, dry_run, Path(workdir) / f"throughput-{os.getpid()}")
    peak = peak_flops(torch.device(device), half=True)
    params = m["trainyard"]["params"]
    ratio = m["trainyard"]["tokens_per_s"] / m["plain"]["tokens_per_s"]
    mfus = [mfu(m[side]["tokens_per_s"], params, peak.flops_per_s or 0.0, 1) for side in ("trainyard", "plain")]
    shown = ["unknown" if x is None else f"{x:.1%}" for x in mfus]
    verdict = "dry run: a tiny model on the CPU, not the issue's figure" if dry_run else (
        f"targets >= 0.97 and MFU >= 40%: {'met' if ratio >= 0.97 and (mfus[0] or 0) >= 0.40 else 'not met'}")
    memory = "" if m["plain"]["peak_bytes"] is None else (
        f"; peak memory {m['trainyard']['peak_bytes'] / 2**30:.1f} vs {m['plain']['peak_bytes'] / 2**30:.1f} GiB")
    return (f"throughput, {params / 1e6:.1f}M-parameter Llama, bf16, seq {m['seq']}, micro-batch "
            f"{m['micro_batch']}: Trainyard {m['trainyard']['tokens_per_s']:.0f} tokens/s (MFU {shown[0]}), plain "
            f"loop {m['plain']['tokens_per_s']:.0f} tokens/s (MFU {shown[1]}), ratio {ratio:.3f}{memory}; "
            f"peak {peak.source}{' (' + peak.reason + ')' if peak.reason else ''} ({verdict})")
