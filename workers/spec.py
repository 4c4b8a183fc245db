"""JobSpec: the one description of a training job.

It is the REST request body, the CLI input, the database payload and what the
worker actors receive. Unknown keys are errors. Every rule that spans several
fields lives in `JobSpec._check_cross_field_rules`, and each message starts with
the dotted field name, states the rule and prints the values.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    model_validator,
)

ENTRYPOINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
FAULT_INJECTION_ENV = "TRAINYARD_ALLOW_FAULT_INJECTION"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- model -----------------------------------------------------------------


TP_STYLES = ("colwise", "rowwise", "colwise_gather_output", "embedding_rowwise", "sequence_parallel")
FQN_PATTERN = r"^[A-Za-z_]\w*(\.\w+)*$"
TP_PLAN_KEY = r"^[\w*]+(\.[\w*]+)*$"


class _ModelStructure(_Strict):
    """What the strategies need of any model (workers/models/description.py finds it when left out)."""
    blocks: str | None = Field(None, pattern=FQN_PATTERN, description="FQN of the repeated layers, e.g. "
                               "'model.layers'; default: the largest ModuleList of same-class children")
    tp_plan: dict[Annotated[str, Field(pattern=TP_PLAN_KEY)], Literal[TP_STYLES]] | None = Field(  # type: ignore[valid-type]
        None, description="tensor-parallel plan {module FQN glob: colwise | rowwise | colwise_gather_output | "
                          "embedding_rowwise | sequence_parallel}; default: the model's own "
                          "(transformers' base_model_tp_plan, the built-in gpt's)")


class GPTModelSpec(_ModelStructure):
    name: Literal["gpt"] = "gpt"
    n_layers: int = Field(2, ge=1, le=256, description="transformer blocks")
    d_model: int = Field(64, ge=8, le=16384, description="embedding width")
    n_heads: int = Field(4, ge=1, le=256, description="attention heads; must divide d_model")
    seq_len: int = Field(64, ge=2, le=65536, description="context length in tokens")
    vocab_size: int = Field(256, ge=2, description="byte-level vocabulary by default")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "GPTModelSpec":
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model must be divisible by model.n_heads "
                f"(d_model={self.d_model}, n_heads={self.n_heads})"
            )
        return self


class MLPModelSpec(_ModelStructure):
    name: Literal["mlp"]
    in_features: int = Field(16, ge=1)
    hidden: int = Field(64, ge=1)
    out_features: int = Field(1, ge=1)
    n_layers: int = Field(2, ge=1, le=64, description="hidden layers")


class EntrypointSpec(_Strict):
    entrypoint: str = Field(pattern=ENTRYPOINT_PATTERN, description="'package.module:factory'")
    args: dict[str, Any] = Field(default_factory=dict)


class ModelEntrypointSpec(EntrypointSpec, _ModelStructure):
    """Any nn.Module a user factory returns."""


class HFConfigSource(_Strict):
    model_type: str = Field(min_length=1, description="a transformers model type, e.g. 'llama', 'gpt2'")
    config: dict[str, Any] = Field(default_factory=dict, description="fields of that model type's config")


class HFPretrainedSource(_Strict):
    pretrained: str = Field(min_length=1, description="a local save_pretrained directory under the storage root "
                                                      "(never a hub download)")


def _hf_source(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return "pretrained" if isinstance(value, HFPretrainedSource) else "config"
    return ("pretrained" if "pretrained" in value else "config") if isinstance(value, dict) else None


class HFModelSpec(_ModelStructure):
    """A Hugging Face transformers causal LM (the optional extra `trainyard[hf]`)."""
    hf: Annotated[Union[Annotated[HFConfigSource, Tag("config")], Annotated[HFPretrainedSource, Tag("pretrained")]],
                  Discriminator(_hf_source, custom_error_type="model.hf",
                                custom_error_message="model.hf must give model_type (and config) or pretrained")]

    @model_validator(mode="after")
    def _config_builds(self) -> "HFModelSpec":
        _hf_facts(self)  # an unknown model type or config field is refused here, by name
        return self


def _name_or_entrypoint(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if not isinstance(value, dict):
        return None
    if "entrypoint" in value:
        return "entrypoint"
    if "hf" in value:
        return "hf"
    return value.get("name", "gpt")


ModelSpec = Annotated[
    Union[
        Annotated[GPTModelSpec, Tag("gpt")],
        Annotated[MLPModelSpec, Tag("mlp")],
        Annotated[ModelEntrypointSpec, Tag("entrypoint")],
        Annotated[HFModelSpec, Tag("hf")],
    ],
    Discriminator(_name_or_entrypoint, custom_error_type="model.name",
                  custom_error_message="model.name must be 'gpt' or 'mlp', or give model.hf or model.entrypoint"),
]
USER_MODELS = (ModelEntrypointSpec, HFModelSpec)  # models the strategies only know through their description


# --- data ------------------------------------------------------------------


class TextDataSpec(_Strict):
    name: Literal["text:pystdlib"]
    max_bytes: int = Field(4_000_000, ge=10_000, description="corpus size cap")
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    seq_len: int | None = Field(None, ge=2, le=65536, description="tokens per sample; required with a model "
                                                                 "other than the built-in gpt (default model.seq_len)")


class SyntheticDataSpec(_Strict):
    name: Literal["synthetic"]
    n_samples: int = Field(4096, ge=1)
    in_features: int = Field(16, ge=1)
    out_features: int = Field(1, ge=1)
    noise: float = Field(0.01, ge=0.0)


DataSpec = Annotated[
    Union[
        Annotated[TextDataSpec, Tag("text:pystdlib")],
        Annotated[SyntheticDataSpec, Tag("synthetic")],
        Annotated[EntrypointSpec, Tag("entrypoint")],
    ],
    Discriminator(_name_or_entrypoint, custom_error_type="data.name",
                  custom_error_message="data.name must be 'text:pystdlib' or 'synthetic', or give data.entrypoint"),
]


# --- the rest --------------------------------------------------------------


class TrainSpec(_Strict):
    steps: int = Field(100, ge=1, le=10_000_000)
    global_batch_size: int = Field(32, ge=1)
    micro_batch_size: int = Field(8, ge=1)
    lr: float = Field(3e-3, gt=0.0, le=10.0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine floor as a fraction of lr")
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0, description="max global grad norm; null disables")
    seed: int = Field(0, ge=0)
    eval_every: int = Field(0, ge=0, description="validation loss every N steps; 0 disables")
    eval_batches: int = Field(2, ge=1)
    loss: Literal["cross_entropy", "mse", "model"] = Field(
        "cross_entropy", description="cross_entropy on class-last logits (..., classes); mse; model: the loss the "
                                     "model itself returns (batches that carry its labels)")
    init_from: str | None = Field(None, description="checkpoint directory or exported .safetensors to start from")


PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs",
                      "zero_bubble", "zbv_zero_bubble", "dualpipe_v")
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")  # one stage per rank
V_SCHEDULES = ("zbv_zero_bubble", "dualpipe_v")  # exactly two stages per rank, V-shaped


class PipelineSpec(_Strict):
    schedule: Literal[PIPELINE_SCHEDULES] = Field(  # type: ignore[valid-type]
        "1f1b", description="gpipe | 1f1b | interleaved_1f1b | looped_bfs | zero_bubble (interleaved ZB) "
                            "| zbv_zero_bubble | dualpipe_v")
    microbatches: int | None = Field(
        None, ge=1, description="micro-batches per pipeline flush (each train.micro_batch_size samples); "
                                "default: all of the step's, global_batch_size / (dp x micro_batch_size)")
    virtual_stages: int | None = Field(
        None, ge=1, description="stages per rank; default 1 for gpipe/1f1b, 2 for the others")
    split: list[int] | None = Field(
        None, description="pin the partition: transformer blocks per stage, pp x virtual_stages entries in "
                          "stage order (embedding goes to the first stage, head to the last); "
                          "default: balanced by estimated cost")
    rebalance_threshold: float | None = Field(
        None, gt=0.0, description="gpipe/1f1b: when the slowest stage's measured busy time exceeds the fastest's "
                                  "by more than this fraction, re-split by measured cost at the next checkpoint (once)")

    @property
    def stages_per_rank(self) -> int:
        if self.virtual_stages is not None:
            return self.virtual_stages
        return 1 if self.schedule in SINGLE_STAGE_SCHEDULES else 2


class CompressionSpec(_Strict):
    kind: Literal["fp16", "bf16", "powersgd"]
    rank: int = Field(1, ge=1, le=1024, description="powersgd: matrix approximation rank")
    start_step: int = Field(2, ge=2, description="powersgd: plain all-reduce for the first steps "
                                                 "(>= 2: error feedback needs fixed bucket shapes)")


class LocalSGDSpec(_Strict):
    period: int = Field(ge=1, description="steps between parameter averages (1 = every step)")


class SDPPeriodSpec(_Strict):
    period: int = Field(ge=1, description="steps between parameter averages among each piece's holders")


class SDPSpec(_Strict):
    """Subnetwork data parallelism (docs/sdp.md): each data-parallel worker trains a subnetwork."""
    mode: Literal["block", "neuron"] = Field(
        "block", description="block: each worker keeps a subset of the transformer blocks; neuron: a subset "
                             "of every MLP's hidden units (embeddings, attention, norms and head always kept)")
    masking: Literal["forward", "backward"] = Field(
        "forward", description="forward: masked components are dropped from the worker's model (saves parameters, "
                               "gradients, optimiser state, activations); backward: full forward, gradients and "
                               "optimiser state only for held components (an unbiased gradient estimate)")
    coverage: float = Field(0.5, gt=0.0, le=1.0, description="C: fraction of the maskable components each worker holds")
    sync: Literal["every_step"] | SDPPeriodSpec = Field(
        "every_step", description="every_step: average gradients among holders; {period: H}: average parameters "
                                  "among holders every H steps")
    seed: int = Field(0, ge=0, description="the mask assignment is a pure function of this seed")


class ParallelSpec(_Strict):
    dp: int | None = Field(None, ge=1, description="data-parallel degree; default workers / (tp x pp)")
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    zero: int = Field(0, ge=0, le=3, description="0 DDP; 1 shard optimiser state; 2 + gradients; 3 + parameters (FSDP2)")
    pipeline: PipelineSpec | None = Field(None, description="pipeline schedule; only with pp > 1")
    dp_shard: int | None = Field(None, ge=1, description="zero 3: shard within groups of this many dp ranks and "
                                                         "replicate across groups (HSDP); default dp")
    reshard_after_forward: bool = Field(True, description="zero 3: free gathered parameters after forward "
                                                          "(re-gather in backward: 1.5x DDP traffic, less memory)")
    offload_optimizer: bool = Field(False, description="zero 1/2: keep optimiser state in host memory")
    sequence_parallel: bool = Field(False, description="tp > 1: split LayerNorm/residual activations along the sequence")
    activation_checkpointing: bool = Field(False, description="recompute each transformer block in backward")
    mixed_precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16: autocast with fp32 master weights (FSDP: bf16 gathers, fp32 reduction); "
                            "fp16: the same in fp16, with a dynamic loss scaler")
    compression: CompressionSpec | None = Field(None, description="zero 0, tp 1: compress DDP gradient all-reduces")
    local_sgd: LocalSGDSpec | None = Field(None, description="zero 0, tp 1: average parameters every `period` steps")
    sdp: SDPSpec | None = Field(None, description="subnetwork data parallelism over the dp workers (tp 1, pp 1, "
                                                  "zero 0, or zero 3 with dp_shard ranks per subnetwork)")


class ResourcesSpec(_Strict):
    workers: int = Field(1, ge=1, le=4096)
    min_workers: int | None = Field(None, ge=1, description="elastic floor: shrink to no fewer; default workers")
    max_workers: int | None = Field(None, ge=1, description="elastic ceiling: grow to no more; default workers")
    cpus_per_worker: float = Field(1.0, gt=0.0)
    gpus_per_worker: float = Field(0.0, ge=0.0)
    memory_per_worker_gib: float | None = Field(None, gt=0.0, description="per-worker memory budget that "
                                                "parallel: auto and trainyard plan must fit; default no limit")

    @property
    def elastic_range(self) -> tuple[int, int]:
        return (self.min_workers or self.workers, self.max_workers or self.workers)


class CheckpointSpec(_Strict):
    every_steps: int = Field(0, ge=0, description="0 = only at the end")
    keep: int = Field(2, ge=1)


class LossSpikeSpec(_Strict):
    factor: float = Field(3.0, gt=1.0, description="a step whose loss exceeds factor x the median of the "
                                                   "last `window` good steps' losses is a spike")
    window: int = Field(10, ge=2, le=10_000, description="good steps the running median is taken over "
                                                        "(no spike is called before the window is full)")


class FaultToleranceSpec(_Strict):
    max_restarts: int = Field(3, ge=0)
    hang_timeout_s: float = Field(120.0, gt=0.0, description="no step finished for this long = hung")
    max_skipped_steps: int = Field(3, ge=0, description="consecutive bad steps (non-finite gradients or loss "
                                                       "spikes) skipped before rolling back to the last checkpoint")
    loss_spike: LossSpikeSpec | None = Field(None, description="skip the update of a step whose loss spikes; "
                                                               "null: only non-finite steps are bad")
    skip_data_on_rollback: bool = Field(True, description="after a rollback, skip the batches of the bad steps "
                                                         "that caused it (resumed steps draw the next batches)")
    lr_backoff: float | None = Field(None, gt=0.0, le=1.0, description="multiply the learning rate by this "
                                                                      "after each rollback; null keeps it")
    integrity_check_every: int = Field(0, ge=0, description="compare parameter hashes across data-parallel "
                                                           "replicas every N steps; 0 disables")


class FaultSpec(_Strict):
    at_step: int = Field(ge=1)
    rank: int = Field(0, ge=0)
    kind: Literal["crash", "hang", "slow", "nan", "spike", "bitflip"]
    factor: float = Field(2.0, ge=1.0, description="kind=slow: slow-down factor; kind=spike: loss multiplier")
    steps: int = Field(1, ge=1, description="kind=nan/spike: consecutive steps the fault lasts from at_step")


class StragglerSpec(_Strict):
    policy: Literal["off", "report", "rebalance", "replace"] = Field(
        "report", description="report: event and metric; rebalance: also shift data away from the slow rank (live); "
                              "replace: move the slow rank off its node (at the next checkpoint)")
    threshold: float = Field(0.6, gt=0.0, lt=1.0, description="slow when median compute time / this rank's is below this")
    recover: float = Field(0.8, gt=0.0, le=1.0, description="no longer slow once the score is back above this")
    window: int = Field(8, ge=2, le=1000, description="steps the score is averaged over")
    cooldown: int | None = Field(None, ge=1, description="replace: steps after a replacement before the next "
                                                         "one may start; default 2 x window")


class SupervisorSpec(_Strict):
    straggler: StragglerSpec = Field(default_factory=StragglerSpec)


class JobSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="lower-case job name")
    model: ModelSpec = Field(default_factory=GPTModelSpec)
    data: DataSpec = Field(default_factory=lambda: TextDataSpec(name="text:pystdlib"))
    train: TrainSpec = Field(default_factory=TrainSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec, description="the layout, or 'auto': "
                                   "the planner's cheapest layout that fits resources.memory_per_worker_gib")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    fault_tolerance: FaultToleranceSpec = Field(default_factory=FaultToleranceSpec)
    fault_injection: list[FaultSpec] = Field(default_factory=list)
    supervisor: SupervisorSpec = Field(default_factory=SupervisorSpec)

    @property
    def dp(self) -> int:
        p = self.parallel
        return p.dp if p.dp is not None else max(1, self.resources.workers // (p.tp * p.pp))

    @property
    def world_size(self) -> int:
        return self.resources.workers

    @property
    def grad_accum_steps(self) -> int:
        return self.train.global_batch_size // (self.dp * self.train.micro_batch_size)

    @model_validator(mode="before")
    @classmethod
    def _resolve_auto_layout(cls, data: Any) -> Any:
        # `parallel: auto` becomes the planner's choice before validation, so the stored spec is explicit.
        if isinstance(data, dict) and data.get("parallel") == "auto":
            from workers.parallel.planner import resolve_auto

            data = {**data, "parallel": resolve_auto(data)}
        return data

    @model_validator(mode="after")
    def _check_cross_field_rules(self, info: ValidationInfo) -> "JobSpec":
        errors = list(_cross_field_errors(self, info.context or {}))
        if errors:
            raise ValueError("\n".join(errors))  # messages may hold "; "
        return self


def _cross_field_errors(spec: JobSpec, context: dict[str, Any]):
    p, r, t = spec.parallel, spec.resources, spec.train
    dp = spec.dp
    if dp * p.tp * p.pp != r.workers:
        yield (f"parallel: dp x tp x pp must equal resources.workers "
               f"(dp={dp} x tp={p.tp} x pp={p.pp} = {dp * p.tp * p.pp}, workers={r.workers})")
    elif t.global_batch_size % (dp * t.micro_batch_size):
        yield (f"train.global_batch_size must be divisible by parallel.dp x train.micro_batch_size "
               f"(global_batch_size={t.global_batch_size}, dp={dp}, micro_batch_size={t.micro_batch_size})")
    low, high = r.elastic_range
    if not low <= r.workers <= high:
        yield (f"resources.workers must lie within resources.min_workers..max_workers "
               f"(min_workers={low}, workers={r.workers}, max_workers={high})")
    straggler = spec.supervisor.straggler
    if straggler.recover <= straggler.threshold:
        yield (f"supervisor.straggler.recover must exceed supervisor.straggler.threshold "
               f"(recover={straggler.recover}, threshold={straggler.threshold})")
    if straggler.policy == "replace" and spec.checkpoint.every_steps == 0:
        yield ("supervisor.straggler.policy 'replace' needs checkpoint.every_steps > 0: the moved rank resumes "
               "from the next checkpoint (every_steps=0)")
    if straggler.policy == "rebalance" and (p.tp > 1 or p.local_sgd is not None):
        # Shares are per data-parallel rank and weight each rank's gradient in the all-reduced mean.
        yield ("supervisor.straggler.policy 'rebalance' needs pure data parallelism that averages gradients "
               f"(tp 1, no local_sgd); use 'report' or 'replace' (tp={p.tp}, "
               f"local_sgd={'set' if p.local_sgd is not None else 'none'})")
    if t.warmup_steps > t.steps:
        yield f"train.warmup_steps must not exceed train.steps (warmup_steps={t.warmup_steps}, steps={t.steps})"
    yield from _model_data_errors(spec)
    yield from _model_structure_errors(spec)
    # Each strategy checks its own options (workers/parallel/registry.py); imported here, at validation
    # time, because the strategies build on this module.
    from workers.parallel.registry import layout_errors

    yield from layout_errors(spec)
    yield from _fault_injection_errors(spec, context)


def _model_structure_errors(spec: JobSpec):
    if spec.parallel.activation_checkpointing and structure_of(spec).name == "mlp":
        yield "parallel.activation_checkpointing needs a model with repeated blocks to recompute (model 'mlp' has none)"


@dataclass(frozen=True)
class ModelStructure:
    """What the spec rules know of a model before it is built (None: known only once it is built)."""
    name: str  # gpt | mlp | entrypoint | hf
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    vocab: int | None = None
    tp_plan: bool | None = None  # a tensor-parallel plan exists (the spec's, the model's own)
    tied_embeddings: bool = False


def structure_of(spec: JobSpec) -> ModelStructure:
    m = spec.model
    given = m.tp_plan is not None
    if isinstance(m, GPTModelSpec):
        return ModelStructure("gpt", m.n_layers, m.n_heads, m.n_heads, m.vocab_size, True)
    if isinstance(m, MLPModelSpec):
        return ModelStructure("mlp", m.n_layers, tp_plan=given)
    if isinstance(m, ModelEntrypointSpec):
        return ModelStructure("entrypoint", tp_plan=True if given else None)
    facts = _hf_facts(m)
    if facts is None:  # a pretrained directory the service cannot read yet: checked when the job builds it
        return ModelStructure("hf", tp_plan=True if given else None)
    return ModelStructure("hf", facts.n_layers, facts.n_heads, facts.n_kv_heads, facts.vocab_size,
                          given or facts.has_tp_plan, facts.tied_embeddings)


def _hf_facts(m: "HFModelSpec"):
    src = m.hf
    if isinstance(src, HFPretrainedSource):
        return _cached_hf_facts(None, "{}", src.pretrained)
    return _cached_hf_facts(src.model_type, json.dumps(src.config, sort_keys=True, default=str), None)


@functools.lru_cache(maxsize=64)
def _cached_hf_facts(model_type: str | None, config: str, pretrained: str | None):
    from workers.models.hf_config import hf_config, hf_facts, readable_pretrained

    if pretrained is not None and not readable_pretrained(pretrained):
        return None
    return hf_facts(hf_config(model_type, json.loads(config), pretrained))


def sequence_length(spec: JobSpec) -> int | None:
    """Tokens per sample of the built-in corpus: data.seq_len, else the built-in gpt's model.seq_len."""
    d, m = spec.data, spec.model
    if isinstance(d, TextDataSpec) and d.seq_len is not None:
        return d.seq_len
    return m.seq_len if isinstance(m, GPTModelSpec) else None


def _model_data_errors(spec: JobSpec):
    m, d, loss = spec.model, spec.data, spec.train.loss
    if isinstance(m, USER_MODELS) and isinstance(d, TextDataSpec):
        if d.seq_len is None:
            yield (f"data.seq_len is required with a model other than the built-in gpt: the tokens per sample "
                   f"of {d.name!r} (model={type(m).__name__})")
        vocab = structure_of(spec).vocab
        if vocab is not None and vocab < 256:
            yield f"model.hf.config.vocab_size must be >= 256 for byte-level 'text:pystdlib' (vocab_size={vocab})"
    if isinstance(m, GPTModelSpec) and isinstance(d, TextDataSpec) and d.seq_len and d.seq_len > m.seq_len:
        yield (f"data.seq_len must be <= model.seq_len, the built-in gpt's context "
               f"(data.seq_len={d.seq_len}, model.seq_len={m.seq_len})")
    if loss == "model" and not isinstance(d, EntrypointSpec):
        yield (f"train.loss 'model' needs batches that carry the model's own labels (a data.entrypoint whose "
               f"samples are dicts with 'labels'); {d.name!r} gives (input, target) pairs: use 'cross_entropy'")
    if loss == "model" and not isinstance(m, USER_MODELS):
        yield f"train.loss 'model' needs a model that returns its own loss (model.hf or model.entrypoint), not {m.name!r}"
    if isinstance(m, GPTModelSpec):
        if isinstance(d, SyntheticDataSpec):
            yield "data.name 'synthetic' is a regression set: model 'gpt' needs token data (data.name 'text:pystdlib' or an entrypoint)"
        if loss == "mse":
            yield f"train.loss must be 'cross_entropy' for model 'gpt' (loss={loss!r})"
        if isinstance(d, TextDataSpec) and m.vocab_size < 256:
            yield f"model.vocab_size must be >= 256 for byte-level 'text:pystdlib' (vocab_size={m.vocab_size})"
    if isinstance(m, MLPModelSpec):
        if isinstance(d, TextDataSpec):
            yield "data.name 'text:pystdlib' is token data: model 'mlp' needs vector data (data.name 'synthetic' or an entrypoint)"
        if isinstance(d, SyntheticDataSpec):
            if d.in_features != m.in_features or d.out_features != m.out_features:
                yield (f"model.in_features/out_features must match data.in_features/out_features "
                       f"(model {m.in_features}->{m.out_features}, data {d.in_features}->{d.out_features})")
            if loss != "mse":
                yield f"train.loss must be 'mse' for regression data 'synthetic' (loss={loss!r})"


def pipeline_microbatches(spec: JobSpec) -> int:
    """Micro-batches per pipeline flush (a step runs grad_accum_steps / this many flushes)."""
    pipe = spec.parallel.pipeline
    return pipe.microbatches if pipe and pipe.microbatches else max(1, spec.grad_accum_steps)


def sdp_workers(spec: JobSpec) -> int:
    """Subnetworks in an SDP layout: one per dp rank, or one per group of dp_shard ranks under zero 3."""
    p = spec.parallel
    return spec.dp // (p.dp_shard or 1) if p.zero == 3 else spec.dp


def sdp_components(spec: JobSpec, n_blocks: int | None = None) -> tuple[int | None, str]:
    """(maskable components per layer, their name) for the spec's SDP mode. Block mode counts the
    model's repeated blocks: `n_blocks` of the built model, else what the spec tells (None: an
    entrypoint model, known once built)."""
    m, mode = spec.model, spec.parallel.sdp.mode
    if mode == "block":
        if n_blocks is None and getattr(m, "blocks", None) is not None:
            return None, "block"  # the user named the blocks: counted on the built model
        return (n_blocks if n_blocks is not None else structure_of(spec).layers), "block"
    return 4 * m.d_model, "MLP hidden unit"


def fault_injection_allowed(context: dict[str, Any]) -> bool:
    if "allow_fault_injection" in context:
        return bool(context["allow_fault_injection"])
    return os.environ.get(FAULT_INJECTION_ENV, "").lower() in {"1", "true", "yes", "on"}


def _fault_injection_errors(spec: JobSpec, context: dict[str, Any]):
    if not spec.fault_injection:
        return
    if not fault_injection_allowed(context):
        yield f"fault_injection is refused: the server does not allow it (set {FAULT_INJECTION_ENV}=1)"
        return
    for i, fault in enumerate(spec.fault_injection):
        if fault.at_step > spec.train.steps:
            yield (f"fault_injection[{i}].at_step must be <= train.steps "
                   f"(at_step={fault.at_step}, steps={spec.train.steps})")
        if fault.rank >= spec.resources.workers:
            yield (f"fault_injection[{i}].rank must be < resources.workers "
                   f"(rank={fault.rank}, workers={spec.resources.workers})")
        if fault.steps > 1 and fault.kind not in ("nan", "spike"):
            yield (f"fault_injection[{i}].steps applies to kinds 'nan' and 'spike' only "
                   f"(kind={fault.kind!r}, steps={fault.steps})")
        elif fault.at_step + fault.steps - 1 > spec.train.steps:
            yield (f"fault_injection[{i}].steps must end by train.steps: at_step + steps - 1 <= steps "
                   f"(at_step={fault.at_step}, steps={fault.steps}, train.steps={spec.train.steps})")


# --- loading ---------------------------------------------------------------


def parse_spec(data: Any, *, allow_fault_injection: bool | None = None) -> JobSpec:
    context = {} if allow_fault_injection is None else {"allow_fault_injection": allow_fault_injection}
    return JobSpec.model_validate(data, context=context)


def load_spec(path: str | Path, **kwargs: Any) -> JobSpec:
    """Read a YAML or JSON spec file (JSON is valid YAML)."""
    text = Path(path).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a job spec must be a mapping, got {type(data).__name__}")
    return parse_spec(data, **kwargs)


_UNION_TAGS = {"gpt", "mlp", "entrypoint", "hf", "text:pystdlib", "synthetic"}


def format_validation_error(exc: Exception) -> list[dict[str, str]]:
    """Turn a pydantic ValidationError into [{field, message}] for humans and HTTP 422."""
    out = []
    for err in getattr(exc, "errors", lambda: [])():
        loc = list(err.get("loc", ()))
        if len(loc) > 1 and loc[0] in {"model", "data"} and loc[1] in _UNION_TAGS:
            del loc[1]  # the union member's tag is not a field the user wrote
        if loc[:2] == ["model", "hf"] and len(loc) > 2 and loc[2] in {"config", "pretrained"}:
            del loc[2]
        field = ".".join(str(p) for p in loc)
        msg = err.get("msg", "").removeprefix("Value error, ")
        if field and msg.startswith(field):
            field = msg.split(" ", 1)[0].rstrip(":")  # a sub-model rule names its own field
            out.append({"field": field, "message": msg})
        elif field:
            out.append({"field": field, "message": f"{field}: {msg}"})
            continue
        # Cross-field rules arrive joined at the root; each starts with its field name.
        for part in msg.split("\n"):
            out.append({"field": part.split(" ", 1)[0].rstrip(":"), "message": part})
    unique = [dict(t) for t in dict.fromkeys(tuple(e.items()) for e in out)]
    return unique or [{"field": "", "message": str(exc)}]
