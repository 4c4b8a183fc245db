"""The `parallel` section: degrees, ZeRO stage, pipeline schedule, SDP, and per-strategy options."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workers.spec.base import Strict
from workers.spec.parameter_server import ParameterServerSpec

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs",
                      "zero_bubble", "zbv_zero_bubble", "dualpipe_v", "chimera", "pipedream", "pipedream_2bw")
# one stage per rank (chimera: per direction)
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b", "chimera", "pipedream", "pipedream_2bw")
ASYNC_SCHEDULES = ("pipedream", "pipedream_2bw")  # no flush: micro-batches stay in flight across steps
V_SCHEDULES = ("zbv_zero_bubble", "dualpipe_v")  # exactly two stages per rank, V-shaped


class PipelineSpec(Strict):
    schedule: Literal[PIPELINE_SCHEDULES] = Field(  # type: ignore[valid-type]
        "1f1b", description="gpipe | 1f1b | interleaved_1f1b | looped_bfs | zero_bubble (interleaved ZB) "
                            "| zbv_zero_bubble | dualpipe_v | chimera (two pipelines in opposite directions, "
                            "each rank a stage of both; even pp and microbatches) | pipedream (1F1B without "
                            "flushes, weight stashing) | pipedream_2bw (the same, two weight versions, every "
                            "update one step late)")
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


class CompressionSpec(Strict):
    kind: Literal["fp16", "bf16", "powersgd", "onebit", "signsgd"] = Field(
        description="fp16/bf16: all-reduce gradients cast to half precision (half the bytes); powersgd: a "
                    "low-rank approximation with error feedback (rank sets the size); onebit: 1-bit SGD, each "
                    "gradient's signs packed 8 to a byte with a positive and a negative scale per 128 "
                    "elements, all-gathered and averaged (Seide et al. 2014); signsgd: signSGD with majority "
                    "vote, the sign of the sum of the ranks' signs scaled by their mean |gradient| per 128 "
                    "elements (Bernstein et al. 2018). onebit and signsgd send about 1/26 and 1/29 of fp32's "
                    "bytes on 2 ranks: an all-gather, so the fraction grows with the world (docs/parallel.md)")
    rank: int = Field(1, ge=1, le=1024, description="powersgd: matrix approximation rank")
    start_step: int = Field(2, ge=2, description="powersgd: plain all-reduce for the first steps "
                                                 "(>= 2: error feedback needs fixed bucket shapes)")
    error_feedback: bool | None = Field(
        None, description="onebit/signsgd: add each rank's quantization error (its residual) to its next "
                          "gradient before quantizing; default true for onebit (1-bit SGD is defined with it), "
                          "false for signsgd (majority vote as published; with AdamW it trained worse with it, "
                          "docs/parallel.md); only for onebit and signsgd")

    @property
    def uses_error_feedback(self) -> bool:
        """onebit/signsgd: whether residuals are kept (unset: onebit yes, signsgd no)."""
        return self.kind == "onebit" if self.error_feedback is None else self.error_feedback


class LocalSGDSpec(Strict):
    period: int = Field(ge=1, description="steps between parameter averages (1 = every step)")


class SDPPeriodSpec(Strict):
    period: int = Field(ge=1, description="steps between parameter averages among each piece's holders")


class SDPSpec(Strict):
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


class ParallelSpec(Strict):
    dp: int | None = Field(None, ge=1, description="data-parallel degree; default workers / (tp x pp x cp)")
    tp: int = Field(1, ge=1, description="tensor-parallel degree: each block's weights are split over tp ranks by "
                                         "the model's tensor-parallel plan; must divide the attention (and "
                                         "key/value) heads")
    pp: int = Field(1, ge=1, description="pipeline-parallel degree: the model is cut into pp stages at block "
                                         "boundaries, run by pipeline.schedule; needs fp32 and zero 0, or zero 3 "
                                         "(FSDP2 over each stage's replicas) with schedule gpipe or 1f1b")
    cp: int = Field(1, ge=1, description="context-parallel degree: every micro-batch's sequence is split over cp ranks "
                                         "(2 x cp chunks, load-balanced for causal attention) and attention passes "
                                         "keys and values around the cp ring; 2 x cp must divide the sequence length")
    ep: int = Field(1, ge=1, description="expert-parallel degree: each MoE layer's experts (model.moe) are split over "
                                         "groups of ep data-parallel ranks, tokens reach their experts by all-to-all; "
                                         "no ranks of its own (ep must divide dp x cp and model.moe.experts)")
    zero: int = Field(0, ge=0, le=3,
                      description="0 DDP; 1 shard optimiser state; 2 + gradients; 3 + parameters (FSDP2)")
    pipeline: PipelineSpec | None = Field(None, description="pipeline schedule; only with pp > 1")
    dp_shard: int | None = Field(None, ge=1, description="zero 3: shard within groups of this many dp ranks and "
                                                         "replicate across groups (HSDP); default dp")
    reshard_after_forward: bool = Field(True, description="zero 3: free gathered parameters after forward "
                                                          "(re-gather in backward: ~1.5x DDP traffic, less memory)")
    fsdp_accumulate: Literal["sharded", "unsharded"] = Field(
        "sharded", description="zero 3 with several micro-batches per rank: sharded reduce-scatters every "
                               "micro-batch and keeps 1/K of the gradients between them; unsharded keeps whole "
                               "gradients and reduce-scatters once per step (less traffic, 4 bytes/param more)")
    offload_optimizer: bool = Field(False, description="zero 1/2: keep optimiser state in host memory")
    sequence_parallel: bool = Field(False,
                                    description="tp > 1: split LayerNorm/residual activations along the sequence")
    activation_checkpointing: bool = Field(False, description="recompute each transformer block in backward")
    mixed_precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16: autocast with fp32 master weights (FSDP: bf16 gathers, fp32 reduction); "
                            "fp16: the same in fp16, with a dynamic loss scaler")
    compression: CompressionSpec | None = Field(None, description="zero 0, tp 1: compress DDP gradient all-reduces")
    collectives: Literal["flat", "hierarchical"] = Field(
        "flat", description="how DDP all-reduces gradients (zero 0, tp 1, pp 1, cp 1, ep 1). flat: one all-reduce over "
                            "every rank; hierarchical: from the placement's node map, reduce-scatter inside each node, "
                            "all-reduce across nodes among ranks of equal local index, all-gather inside the node "
                            "(compression fp16/bf16 then compresses only the cross-node stage; powersgd is refused)")
    local_sgd: LocalSGDSpec | None = Field(None, description="zero 0, tp 1: average parameters every `period` steps")
    sdp: SDPSpec | None = Field(None, description="subnetwork data parallelism over the dp workers (tp 1, pp 1, "
                                                  "zero 0, or zero 3 with dp_shard ranks per subnetwork)")
    parameter_server: ParameterServerSpec | None = Field(None, description="model 'dlrm': embedding tables on "
                                                         "parameter-server actors {shards, mode, staleness}")

