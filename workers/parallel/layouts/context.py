"""Context parallelism (parallel.cp): what it needs of the model, the sequence and the loss. Which other
features it composes with is the compatibility table's (compatibility.py)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.spec import GPTModelSpec, HFModelSpec, JobSpec, Violation, sequence_length


def context_rules(spec: JobSpec) -> Iterator[Violation]:
    cp = spec.parallel.cp
    if cp == 1:
        return
    m = spec.model
    if not isinstance(m, (GPTModelSpec, HFModelSpec)):
        name = getattr(m, "name", "entrypoint")
        yield Violation("parallel.cp", f"parallel.cp > 1 needs the built-in gpt or a model.hf causal LM, whose "
                                       f"attention the ring replaces (model {name!r}, cp={cp})")
    if isinstance(m, GPTModelSpec) and m.dropout:
        yield Violation("model.dropout", f"model.dropout must be 0 with parallel.cp > 1: ring attention drops no "
                                         f"attention weights (dropout={m.dropout}, cp={cp})")
    if spec.train.loss != "cross_entropy":
        yield Violation("train.loss", f"train.loss must be 'cross_entropy' with parallel.cp > 1: targets are shifted "
                                      f"before the sequence is split (loss={spec.train.loss!r}, cp={cp})")
    seq = sequence_length(spec)
    if seq and seq % (2 * cp):
        yield Violation("parallel.cp", f"parallel.cp: 2 x cp must divide the sequence length, each rank holding two "
                                       f"of 2 x cp chunks (cp={cp}, seq_len={seq})")
