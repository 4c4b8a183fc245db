"""JobSpec: the one description of a training job, and its training, resource and fault sections.

It is the REST request body, the CLI input, the database payload and what the worker actors
receive. Unknown keys are errors. This module checks each field on its own; the rules that
span several fields (spec/rules.py) and each strategy's own (workers/parallel/registry.py)
run in workers/spec_checks.py, so a stored, already admitted spec loads with
`JobSpec.model_validate` alone.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from workers.spec.base import Strict
from workers.spec.data import DataSpec, TextDataSpec
from workers.spec.dims import ParallelDims
from workers.spec.errors import FieldError
from workers.spec.model import GPTModelSpec, ModelSpec
from workers.spec.parallel import ParallelSpec
from workers.spec.program import ProgramSpec
from workers.spec.tracking import TrackingSpec


def _eval_batches(value: object) -> object:
    """train.eval_batches: a number >= 1, "auto", "all" or null, refused in one sentence that names them."""
    if value is None or value in ("auto", "all") or (isinstance(value, int) and not isinstance(value, bool)
                                                      and value >= 1):
        return value
    raise FieldError("train.eval_batches", f"must be a number of global batches >= 1, 'auto' or 'all' "
                                           f"(got {value!r})")


class TrainSpec(Strict):
    steps: int = Field(100, ge=1, le=10_000_000, description="optimizer steps to train for; each step consumes "
                       "one global batch, and the cosine schedule decays over them")
    global_batch_size: int = Field(32, ge=1, description="samples per optimizer step over all ranks; must be "
                                   "divisible by parallel.dp x micro_batch_size (the rest is gradient accumulation)")
    micro_batch_size: int = Field(8, ge=1, description="samples per forward/backward pass on one rank; a step runs "
                                  "global_batch_size / (dp x micro_batch_size) of them per rank and accumulates "
                                  "their gradients")
    lr: float = Field(3e-3, gt=0.0, le=10.0, description="peak learning rate of AdamW, reached after warmup_steps "
                                             "and then kept (constant) or decayed (cosine)")
    warmup_steps: int = Field(0, ge=0, description="steps of linear warmup from lr / warmup_steps up to lr; "
                                       "at most steps")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="after warmup: cosine decays from lr towards lr x min_lr_ratio at the last step; "
                              "constant keeps lr")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine floor as a fraction of lr")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW's decoupled weight decay, applied to every "
                                             "parameter; 0 disables")
    grad_clip: float | None = Field(1.0, gt=0.0, description="max global grad norm; null disables")
    seed: int = Field(0, ge=0, description="seeds the model's initial weights, the order of the batches and every "
                                 "step's randomness, so a resumed run repeats the uninterrupted one")
    eval_every: int = Field(0, ge=0, description="validation loss every N steps; 0 disables")
    eval_batches: Annotated[int | Literal["auto", "all"] | None, BeforeValidator(_eval_batches)] = Field(
        "auto", description="global batches (of global_batch_size samples) per validation. auto: 8, whose "
        "forward-only cost is ~8/3 of a training step (a forward is ~1/3 of a forward+backward), so evaluating "
        "every N >= 27 steps stays under ~10% of training time and the final validation is as bounded, "
        "whatever the split's size (2 when the validation set is the training set); all: the whole "
        "validation split; null: as before, the whole split (2 when it is the training set)")
    eval_micro_batch_size: int | None = Field(None, ge=1, description="samples per forward pass on a rank in "
                                              "validation; null: 2 x micro_batch_size (no backward keeps nothing "
                                              "for a gradient, so even the fp32 logits stay below a training "
                                              "step's three copies of them)")
    loss: Literal["cross_entropy", "mse", "bce", "model"] = Field(
        "cross_entropy", description="cross_entropy on class-last logits (..., classes); mse; bce: binary "
                                     "cross-entropy on one logit per sample against 0/1 targets (validation also "
                                     "reports the AUC); model: the loss the model itself returns (batches that "
                                     "carry its labels)")
    init_from: str | None = Field(None, description="checkpoint directory or exported .safetensors to start from")
    compile: bool = Field(False, description="torch.compile each repeated block in place (regional compilation, "
                          "after tp/cp/ep and activation checkpointing, before the data-parallel step); parameter "
                          "names and checkpoints stay the eager model's, and a restarted rank reuses the job's "
                          "node-local compile cache. Not with parallel.tp or parallel.pp (docs/parallel.md)")



class ResourcesSpec(Strict):
    workers: int = Field(1, ge=1, le=4096, description="ranks (Ray actors) the job runs; must equal "
                                          "parallel.dp x tp x pp x cp, and lie within min_workers..max_workers")
    min_workers: int | None = Field(None, ge=1, description="elastic floor: shrink to no fewer; default workers")
    max_workers: int | None = Field(None, ge=1, description="elastic ceiling: grow to no more; default workers")
    cpus_per_worker: float = Field(1.0, gt=0.0, description="CPUs the scheduler reserves for each rank; a rank "
                                              "also runs this many torch threads (whole CPUs, at least 1)")
    gpus_per_worker: float = Field(0.0, ge=0.0, description="GPUs reserved for each rank; 0 trains on CPU, a "
                                              "fraction shares one GPU between ranks, above 1 only for a "
                                              "program.function (one rank per GPU otherwise)")
    memory_per_worker_gib: float | None = Field(None, gt=0.0, description="per-worker memory budget that "
                                                "parallel: auto and trainyard plan must fit, and that submit and "
                                                "trainyard validate refuse a job's predicted peak per worker over; "
                                                "default: the largest node's memory (validate: this host's)")

    @property
    def elastic_range(self) -> tuple[int, int]:
        return (self.min_workers or self.workers, self.max_workers or self.workers)


class CheckpointSpec(Strict):
    every_steps: int = Field(0, ge=0, description="save a checkpoint every N steps (restarts and rollbacks resume "
                                      "from the last one); 0: only at the end")
    keep: int = Field(2, ge=1, description="newest checkpoints kept in the job's storage; older ones are deleted")


class LossSpikeSpec(Strict):
    factor: float = Field(3.0, gt=1.0, description="a step whose loss exceeds factor x the median of the "
                                                   "last `window` good steps' losses is a spike")
    window: int = Field(10, ge=2, le=10_000, description="good steps the running median is taken over "
                                                        "(no spike is called before the window is full)")


class FaultToleranceSpec(Strict):
    max_restarts: int = Field(3, ge=0, description="restarts after the job's own failures (a rank's error, "
                                                   "crash or hang, a group that did not form), over the whole job")
    max_infra_restarts: int = Field(10, ge=0, description="restarts after the cluster's failures (a Ray node or "
                                                         "the job's supervisor lost), counted apart from "
                                                         "max_restarts")
    hang_timeout_s: float = Field(120.0, gt=0.0, description="no progress for this long = hung, in any phase: "
                                                             "steps, set-up, validation batches, checkpoint bytes, "
                                                             "export (docs/observability.md)")
    max_skipped_steps: int = Field(3, ge=0, description="consecutive bad steps (non-finite gradients or loss "
                                                       "spikes) skipped before rolling back to the last checkpoint")
    loss_spike: LossSpikeSpec | None = Field(None, description="skip the update of a step whose loss spikes; "
                                                               "null: only non-finite steps are bad")
    skip_data_on_rollback: bool = Field(True, description="after a rollback, skip the batches of the bad steps "
                                                         "that caused it (resumed steps draw the next batches)")
    lr_backoff: float | None = Field(None, gt=0.0, le=1.0, description="multiply the learning rate by this "
                                                                      "after each rollback; null keeps it")
    integrity_check_every: int = Field(0, ge=0, description="compare parameter hashes within each replica group "
                                                           "(ranks holding the same state) every N steps, and "
                                                           "(any N) verify every rank's own state at rest before "
                                                           "each step and each save; 0 disables")


class FaultSpec(Strict):
    at_step: int = Field(ge=1, description="the step (1-based) at which the fault strikes")
    rank: int = Field(0, ge=0, description="the rank the fault strikes, 0 .. resources.workers - 1")
    kind: Literal["crash", "hang", "slow", "nan", "spike", "bitflip", "slow_upload", "stall_upload", "oom"] = Field(
        description="what goes wrong: the rank exits, stops progressing, slows down, gets non-finite gradients, a "
                    "loss spike, a flipped bit, a slow or stalled checkpoint upload, or runs out of memory")
    factor: float = Field(2.0, ge=1.0, description="kind=slow: slow-down factor; kind=spike: loss multiplier; "
                                                   "kind=slow_upload: seconds the rank's part of the checkpoint at "
                                                   "step at_step takes to write (progressing); kind=stall_upload "
                                                   "stops it halfway (no progress); kind=oom: the rank allocates "
                                                   "more memory than any machine has at step at_step")
    steps: int = Field(1, ge=1, description="kind=nan/spike: consecutive steps the fault lasts from at_step")
    target: Literal["parameters", "optimizer"] = Field(
        "parameters", description="kind=bitflip: flip a bit in the rank's own part of the parameters (ZeRO "
                                  "rows, FSDP/TP shard, pipeline stage) or of its optimizer state")
    during: Literal["step", "final_validation"] = Field(
        "step", description="kind=crash: before step at_step, or halfway through the final validation after the "
                            "last step (at_step must then be train.steps)")


class StragglerSpec(Strict):
    policy: Literal["off", "report", "rebalance", "replace"] = Field(
        "report", description="report: event and metric; rebalance: also shift data away from the slow rank (live); "
                              "replace: move the slow rank off its node (at the next checkpoint)")
    threshold: float = Field(0.6, gt=0.0, lt=1.0,
                             description="slow when median compute time / this rank's is below this")
    recover: float = Field(0.8, gt=0.0, le=1.0, description="no longer slow once the score is back above this")
    window: int = Field(8, ge=2, le=1000, description="steps the score is averaged over")
    cooldown: int | None = Field(None, ge=1, description="replace: steps after a replacement before the next "
                                                         "one may start; default 2 x window")

    @property
    def needs_uneven_shares(self) -> bool:
        """Whether the policy re-splits the global batch unevenly between data-parallel ranks: the spec rules
        ask the data-parallel step's typed capability (workers/parallel/layouts/), not this name."""
        return self.policy == "rebalance"


class SupervisorSpec(Strict):
    straggler: StragglerSpec = Field(default_factory=StragglerSpec, description="how the job's supervisor finds "
                                     "a rank slower than its peers, and what it does about it")


PROGRAM_REFUSES = ("model", "data", "train")  # sections of Trainyard's own loop


class JobSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="lower-case job name")
    model: ModelSpec = Field(default_factory=GPTModelSpec, description="what is trained: the built-in gpt or "
                             "mlp, a Hugging Face causal LM (hf) or your own nn.Module (entrypoint)")
    data: DataSpec = Field(default_factory=lambda: TextDataSpec(name="text:pystdlib"), description="what it is "
                           "trained on: a built-in corpus, sharded files or your own dataset factory (entrypoint)")
    train: TrainSpec = Field(default_factory=TrainSpec, description="the optimisation: steps, batch sizes, "
                             "learning rate schedule, loss and validation")
    parallel: ParallelSpec = Field(default_factory=ParallelSpec, description="the layout, or 'auto': "
                                   "the planner's cheapest layout that fits resources.memory_per_worker_gib")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="how many ranks, and the CPUs, "
                                     "GPUs and memory each one gets")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="when the training state is "
                                       "saved, and how many saves are kept")
    fault_tolerance: FaultToleranceSpec = Field(default_factory=FaultToleranceSpec, description="restarts, hang "
                                                "detection, skipped bad steps and rollbacks")
    fault_injection: list[FaultSpec] = Field(default_factory=list, description="faults to inject on purpose, for "
                                             "testing recovery; refused unless the server allows it "
                                             "(TRAINYARD_ALLOW_FAULT_INJECTION=1)")
    supervisor: SupervisorSpec = Field(default_factory=SupervisorSpec, description="what the job's supervisor "
                                       "watches while it runs")
    program: ProgramSpec | None = Field(None, description="the user's own training loop (a command or a "
                                        "function) instead of Trainyard's; then model, data and train are refused")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="also log params, per-step metrics "
                                   "and the exported model to MLflow and/or TensorBoard")

    @model_serializer(mode="wrap")
    def _without_trainer_sections(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict:
        # A program brings its own loop: the trainer's sections mean nothing for it, and leaving
        # them out keeps a stored program spec loadable by the rule that refuses them.
        out = handler(self)
        if self.program is not None:
            for section in PROGRAM_REFUSES:
                out.pop(section, None)
        return out

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims.of(self.parallel, self.resources.workers)

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def total_steps(self) -> int:
        """Steps the job trains for; 0 for a program, whose loop alone knows."""
        return self.train.steps if self.program is None else 0

    @property
    def world_size(self) -> int:
        return self.resources.workers

    @property
    def grad_accum_steps(self) -> int:
        return self.train.global_batch_size // (self.dp * self.train.micro_batch_size)
