"""The configurations the device check trains (bench/device_check.py), as plain spec dicts.

Every strategy that can run at world size 1, on the built-in GPT and on a Hugging Face Llama, in
fp32 and bf16; and the crash-restart pair. Built from dicts so that the check needs nothing beyond
what workers/spec validates them with.
"""

from __future__ import annotations

import copy

from workers.spec_loading import parse_spec

GPT = {"name": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64}
LLAMA = {"hf": {"model_type": "llama", "config": {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}}}
MODELS = {"gpt": (GPT, {"name": "text:pystdlib", "max_bytes": 400_000}),
          "llama": (LLAMA, {"name": "text:pystdlib", "max_bytes": 400_000, "seq_len": 64})}

# name -> the `parallel` section at world size 1 (HSDP 1x1: one shard group of one rank).
STRATEGIES: dict[str, dict] = {
    "ddp": {},
    "zero1": {"zero": 1},
    "zero2": {"zero": 2},
    "fsdp2": {"zero": 3},
    "hsdp1x1": {"zero": 3, "dp_shard": 1},
    "tp1": {"tp": 1},
    "sdp_block": {"sdp": {"mode": "block", "coverage": 1.0}},
    "fp16_compression": {"compression": {"kind": "fp16"}},
    "bf16_compression": {"compression": {"kind": "bf16"}},  # needs NCCL: refused on CPU workers
    "powersgd": {"compression": {"kind": "powersgd", "rank": 2}},
    "onebit_compression": {"compression": {"kind": "onebit"}},  # packed signs: the encode/decode on the device
    "signsgd_compression": {"compression": {"kind": "signsgd"}},
    "local_sgd": {"local_sgd": {"period": 2}},
}
NEEDS_NCCL = {"bf16_compression"}
DTYPES = ("fp32", "bf16")


def spec_dict(model: str, strategy: str, dtype: str, steps: int, gpu: bool, **extra) -> dict:
    model_section, data = MODELS[model]
    spec = {
        "name": f"{model}-{strategy}-{dtype}",
        "model": copy.deepcopy(model_section), "data": copy.deepcopy(data),
        "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2,
                  "seed": 0},
        "parallel": {**copy.deepcopy(STRATEGIES[strategy]), "mixed_precision": dtype},
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 1 if gpu else 0},
    }
    spec.update(extra)
    return spec


def matrix(steps: int, gpu: bool) -> list[tuple[str, dict]]:
    """(name, spec dict) of every strategy x model x dtype the device runs (bf16 compression: GPU only)."""
    return [(f"{m}-{s}-{d}", spec_dict(m, s, d, steps, gpu)) for m in MODELS for s in STRATEGIES for d in DTYPES
            if gpu or s not in NEEDS_NCCL]


def restart_pair(steps: int, gpu: bool) -> list[tuple[str, dict]]:
    """A fault-free run and its twin that crashes mid-run (resumed from its checkpoint by the check)."""
    every = max(1, steps // 4)
    base = spec_dict("gpt", "ddp", "fp32", steps, gpu, checkpoint={"every_steps": every, "keep": 2})
    crash = copy.deepcopy(base)
    crash["fault_injection"] = [{"at_step": every * 2 + 1, "rank": 0, "kind": "crash"}]
    return [("restart-twin", base), ("restart-crash", crash)]


def build(cases: list[tuple[str, dict]]) -> list[tuple[str, object]]:
    """Every configuration as a validated JobSpec (raises naming the job and the rule otherwise)."""
    specs = []
    for name, data in cases:
        try:
            specs.append((name, parse_spec(data, allow_fault_injection=True)))
        except Exception as exc:
            raise SystemExit(f"{name}: invalid configuration: {exc}") from exc
    return specs
