"""Values derived from a spec that the rules, the planner and the strategies share."""

from __future__ import annotations

from dataclasses import dataclass

from workers.spec.data import ClicksDataSpec, FileDataSpec, TextDataSpec
from workers.spec.job import JobSpec
from workers.spec.model import (
    DEFAULT_TABLE_SIZES,
    DLRMModelSpec,
    GPTModelSpec,
    MLPModelSpec,
    ModelEntrypointSpec,
    hf_facts_of,
)


@dataclass(frozen=True)
class ModelStructure:
    """What the spec rules know of a model before it is built (None: known only once it is built)."""
    name: str  # gpt | mlp | dlrm | entrypoint | hf
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    vocab: int | None = None
    tp_plan: bool | None = None  # a tensor-parallel plan exists (the spec's, the model's own)
    tied_embeddings: bool = False


def structure_of(spec: JobSpec) -> ModelStructure:
    m = spec.model
    if isinstance(m, DLRMModelSpec):  # no repeated blocks, no tensor-parallel plan
        return ModelStructure("dlrm", tp_plan=False)
    given = m.tp_plan is not None
    if isinstance(m, GPTModelSpec):
        return ModelStructure("gpt", m.n_layers, m.n_heads, m.n_heads, m.vocab_size, True)
    if isinstance(m, MLPModelSpec):
        return ModelStructure("mlp", m.n_layers, tp_plan=given)
    if isinstance(m, ModelEntrypointSpec):
        return ModelStructure("entrypoint", tp_plan=True if given else None)
    facts = hf_facts_of(m)
    if facts is None:  # a pretrained directory the service cannot read yet: checked when the job builds it
        return ModelStructure("hf", tp_plan=True if given else None)
    return ModelStructure("hf", facts.n_layers, facts.n_heads, facts.n_kv_heads, facts.vocab_size,
                          given or facts.has_tp_plan, facts.tied_embeddings)




def sequence_length(spec: JobSpec) -> int | None:
    """Tokens per sample: data.files.seq_len; of the built-in corpus data.seq_len, else the built-in gpt's
    model.seq_len."""
    d, m = spec.data, spec.model
    if isinstance(d, FileDataSpec):
        return d.files.seq_len
    if isinstance(d, TextDataSpec) and d.seq_len is not None:
        return d.seq_len
    return m.seq_len if isinstance(m, GPTModelSpec) else None



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
    m, sdp = spec.model, spec.parallel.sdp
    assert sdp is not None  # the SDP code runs only for a spec with parallel.sdp
    mode = sdp.mode
    if mode == "block":
        if n_blocks is None and getattr(m, "blocks", None) is not None:
            return None, "block"  # the user named the blocks: counted on the built model
        return (n_blocks if n_blocks is not None else structure_of(spec).layers), "block"
    assert isinstance(m, GPTModelSpec)  # the spec rules allow neuron mode only on the built-in gpt
    return 4 * m.d_model, "MLP hidden unit"


def clicks_shape(data: ClicksDataSpec, model: object) -> tuple[int, list[int]]:
    """(dense features, table sizes) the click logs are generated with: the data's own, else the dlrm's."""
    dense = data.dense_features or (model.dense_features if isinstance(model, DLRMModelSpec) else 8)
    tables = data.table_sizes or (list(model.table_sizes) if isinstance(model, DLRMModelSpec)
                                  else list(DEFAULT_TABLE_SIZES))
    return dense, list(tables)
