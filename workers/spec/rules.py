"""The rules that span several fields of a spec. Each yields a Violation naming the field to change;
its message starts with that field, states the rule and prints the values."""

from __future__ import annotations

import os
from collections.abc import Iterator

from workers.spec.data import EntrypointSpec, FileDataSpec, SyntheticDataSpec, TextDataSpec
from workers.spec.data_files import file_violations
from workers.spec.derived import structure_of
from workers.spec.errors import Violation
from workers.spec.job import JobSpec
from workers.spec.model import USER_MODELS, GPTModelSpec, HFModelSpec, MLPModelSpec
from workers.spec.parameter_server import parameter_server_violations
from workers.spec.program_rules import program_violations
from workers.spec.recommendation_rules import recommendation_violations

FAULT_INJECTION_ENV = "TRAINYARD_ALLOW_FAULT_INJECTION"


def rule_violations(spec: JobSpec, *, allow_fault_injection: bool | None = None) -> Iterator[Violation]:
    """Every broken cross-field rule of the spec (the strategies' own rules are in workers/parallel/)."""
    yield from _size_and_policy_errors(spec)
    yield from _gpu_count_errors(spec)
    if spec.program is not None:
        yield from program_violations(spec)
    else:  # the model and data rules are about Trainyard's own loop
        yield from _model_data_errors(spec)
        yield from _file_data_errors(spec)
        yield from _model_structure_errors(spec)
        yield from recommendation_violations(spec)
    yield from parameter_server_violations(spec)
    yield from _fault_injection_errors(spec, allow_fault_injection)


def degree_violations(spec: JobSpec) -> Iterator[Violation]:
    """The rules a layout's degrees obey: they multiply to the workers, and dp x micro-batch divides the
    global batch (what an elastic resize re-checks, with the layouts' own rules)."""
    t, dp = spec.train, spec.dp
    degrees = [Violation(field, message) for field, message in spec.dims.violations(spec.resources.workers)]
    yield from degrees
    if not degrees and spec.program is None and t.global_batch_size % (dp * t.micro_batch_size):
        yield Violation("train.global_batch_size",
            f"train.global_batch_size must be divisible by parallel.dp x train.micro_batch_size "
            f"(global_batch_size={t.global_batch_size}, dp={dp}, micro_batch_size={t.micro_batch_size})")


def _size_and_policy_errors(spec: JobSpec) -> Iterator[Violation]:
    r, t = spec.resources, spec.train
    yield from degree_violations(spec)
    low, high = r.elastic_range
    if not low <= r.workers <= high:
        yield Violation("resources.workers",
            f"resources.workers must lie within resources.min_workers..max_workers "
            f"(min_workers={low}, workers={r.workers}, max_workers={high})")
    straggler = spec.supervisor.straggler
    if straggler.recover <= straggler.threshold:
        yield Violation("supervisor.straggler.recover",
            f"supervisor.straggler.recover must exceed supervisor.straggler.threshold "
            f"(recover={straggler.recover}, threshold={straggler.threshold})")
    if straggler.policy == "replace" and spec.checkpoint.every_steps == 0 and spec.program is None:
        yield Violation("supervisor.straggler.policy",
            "supervisor.straggler.policy 'replace' needs checkpoint.every_steps > 0: the moved rank resumes "
            "from the next checkpoint (every_steps=0)")
    check, save = spec.fault_tolerance.integrity_check_every, spec.checkpoint.every_steps
    if check and save and save % check and spec.program is None:
        # Chosen over a check before every save: the schedules stay the user's, and each periodic
        # checkpoint is the state a check has just verified (the final one is checked when it is saved).
        yield Violation("checkpoint.every_steps",
            f"checkpoint.every_steps must be a multiple of fault_tolerance.integrity_check_every, so that every "
            f"checkpoint holds a verified state (every_steps={save}, integrity_check_every={check})")
    if t.warmup_steps > t.steps and spec.program is None:
        yield Violation("train.warmup_steps",
            f"train.warmup_steps must not exceed train.steps (warmup_steps={t.warmup_steps}, steps={t.steps})")


def _gpu_count_errors(spec: JobSpec) -> Iterator[Violation]:
    """One rank per GPU, as under torchrun, except for a train function, which gets its worker's GPUs
    as a Ray Train worker does (`cuda:0` is its own first; the others are the function's to use)."""
    gpus = spec.resources.gpus_per_worker
    if gpus <= 1:
        return  # a fraction shares one GPU between ranks
    if gpus != int(gpus):
        yield Violation("resources.gpus_per_worker",
            f"resources.gpus_per_worker above 1 must be a whole number of GPUs (gpus_per_worker={gpus})")
    elif spec.program is None or spec.program.command is not None:
        loop = "Trainyard's own loop" if spec.program is None else "a program.command (torchrun-style)"
        yield Violation("resources.gpus_per_worker",
            f"resources.gpus_per_worker must be at most 1 for {loop}: it runs one rank per GPU on "
            f"cuda:LOCAL_RANK; for {int(gpus)} GPUs per machine set resources.workers to machines x {int(gpus)} "
            f"(gpus_per_worker={gpus}); only a program.function takes several GPUs per rank")


def _model_structure_errors(spec: JobSpec) -> Iterator[Violation]:
    name = structure_of(spec).name
    if spec.parallel.activation_checkpointing and name in ("mlp", "dlrm"):
        yield Violation("parallel.activation_checkpointing",
            f"parallel.activation_checkpointing needs a model with repeated blocks to recompute (model {name!r} "
            f"has none)")


def _model_data_errors(spec: JobSpec) -> Iterator[Violation]:
    m, d, loss = spec.model, spec.data, spec.train.loss
    if isinstance(m, USER_MODELS) and isinstance(d, TextDataSpec):
        if d.seq_len is None:
            given = "model.hf" if isinstance(m, HFModelSpec) else "model.entrypoint"
            yield Violation("data.seq_len",
                f"data.seq_len is required with {given}, a model other than the built-in gpt: the tokens "
                f"per sample of {d.name!r} (data.seq_len is not set)")
        vocab = structure_of(spec).vocab
        if vocab is not None and vocab < 256:
            yield Violation("model.hf.config.vocab_size",
                f"model.hf.config.vocab_size must be >= 256 for byte-level 'text:pystdlib' (vocab_size={vocab})")
    if isinstance(m, GPTModelSpec) and isinstance(d, TextDataSpec) and d.seq_len and d.seq_len > m.seq_len:
        yield Violation("data.seq_len",
            f"data.seq_len must be <= model.seq_len, the built-in gpt's context "
            f"(data.seq_len={d.seq_len}, model.seq_len={m.seq_len})")
    if loss == "model" and not isinstance(d, EntrypointSpec):
        yield Violation("train.loss",
            f"train.loss 'model' needs batches that carry the model's own labels (a data.entrypoint whose "
            f"samples are dicts with 'labels'); {getattr(d, 'name', 'data.files')!r} "
            f"gives (input, target) pairs: use 'cross_entropy'")
    if loss == "model" and not isinstance(m, USER_MODELS):
        yield Violation("train.loss",
            f"train.loss 'model' needs a model that returns its own loss (model.hf or model.entrypoint), "
            f"not {m.name!r}")
    if isinstance(m, GPTModelSpec):
        if isinstance(d, SyntheticDataSpec):
            yield Violation("data.name",
                "data.name 'synthetic' is a regression set: model 'gpt' needs token data "
                "(data.name 'text:pystdlib' or an entrypoint)")
        if loss == "mse":
            yield Violation("train.loss", f"train.loss must be 'cross_entropy' for model 'gpt' (loss={loss!r})")
        if isinstance(d, TextDataSpec) and m.vocab_size < 256:
            yield Violation("model.vocab_size",
                f"model.vocab_size must be >= 256 for byte-level 'text:pystdlib' (vocab_size={m.vocab_size})")
    if isinstance(m, MLPModelSpec):
        if isinstance(d, TextDataSpec):
            yield Violation("data.name",
                "data.name 'text:pystdlib' is token data: model 'mlp' needs vector data "
                "(data.name 'synthetic' or an entrypoint)")
        if isinstance(d, SyntheticDataSpec):
            if d.in_features != m.in_features or d.out_features != m.out_features:
                yield Violation("model.in_features/out_features",
                    f"model.in_features/out_features must match data.in_features/out_features "
                    f"(model {m.in_features}->{m.out_features}, data {d.in_features}->{d.out_features})")
            if loss != "mse":
                yield Violation("train.loss",
                    f"train.loss must be 'mse' for regression data 'synthetic' (loss={loss!r})")


def _file_data_errors(spec: JobSpec) -> Iterator[Violation]:
    m, d = spec.model, spec.data
    if not isinstance(d, FileDataSpec):
        return
    yield from file_violations(d)
    if isinstance(m, MLPModelSpec):
        yield Violation("data.files", "data.files are token data: model 'mlp' needs vector data "
                                      "(data.name 'synthetic' or an entrypoint)")
    if isinstance(m, GPTModelSpec) and d.files.seq_len > m.seq_len:
        yield Violation("data.files.seq_len",
            f"data.files.seq_len must be <= model.seq_len, the built-in gpt's context "
            f"(data.files.seq_len={d.files.seq_len}, model.seq_len={m.seq_len})")
    vocab = structure_of(spec).vocab
    if d.files.format != "tokens" and d.tokenizer is None and vocab is not None and vocab < 256:
        yield Violation("data.tokenizer", f"data.tokenizer null reads bytes: the model's vocabulary must be >= 256 "
                                          f"(vocab_size={vocab})")


def fault_injection_allowed(allowed: bool | None = None) -> bool:
    """The server's choice (`allowed`), else the environment's."""
    if allowed is not None:
        return allowed
    return os.environ.get(FAULT_INJECTION_ENV, "").lower() in {"1", "true", "yes", "on"}


def _fault_injection_errors(spec: JobSpec, allowed: bool | None) -> Iterator[Violation]:
    if not spec.fault_injection:
        return
    if not fault_injection_allowed(allowed):
        yield Violation("fault_injection",
            f"fault_injection is refused: the server does not allow it (set {FAULT_INJECTION_ENV}=1)")
        return
    for i, fault in enumerate(spec.fault_injection):
        if fault.at_step > spec.train.steps:
            yield Violation(f"fault_injection[{i}].at_step",
                f"fault_injection[{i}].at_step must be <= train.steps "
                f"(at_step={fault.at_step}, steps={spec.train.steps})")
        if fault.rank >= spec.resources.workers:
            yield Violation(f"fault_injection[{i}].rank",
                f"fault_injection[{i}].rank must be < resources.workers "
                f"(rank={fault.rank}, workers={spec.resources.workers})")
        if fault.during != "step" and (fault.kind != "crash" or fault.at_step != spec.train.steps):
            yield Violation(f"fault_injection[{i}].during",
                f"fault_injection[{i}].during={fault.during!r} applies to kind 'crash' at the last step only "
                f"(kind={fault.kind!r}, at_step={fault.at_step}, train.steps={spec.train.steps})")
        if fault.steps > 1 and fault.kind not in ("nan", "spike"):
            yield Violation(f"fault_injection[{i}].steps",
                f"fault_injection[{i}].steps applies to kinds 'nan' and 'spike' only "
                f"(kind={fault.kind!r}, steps={fault.steps})")
        elif fault.at_step + fault.steps - 1 > spec.train.steps:
            yield Violation(f"fault_injection[{i}].steps",
                f"fault_injection[{i}].steps must end by train.steps: at_step + steps - 1 <= steps "
                f"(at_step={fault.at_step}, steps={fault.steps}, train.steps={spec.train.steps})")

