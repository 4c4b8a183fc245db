"""The data-parallel step: the last parallelism `parallelize` applies (workers/parallel/parallelize.py), built
from the spec's DataParallelOptions (workers/parallel/layouts/data_parallel_options.py).

replicate.py the replicate step (plain data parallelism, dp over tensor-parallel shards, ZeRO-1/2, local SGD)
reducers.py  how the replicate step reduces gradients: DDP, or an all-reduce of local DTensor pieces
sharded_optimizer.py  ZeRO-1/2: the sharded AdamW reduces (workers/parallel/zero_optimizer.py)
local_sgd.py no per-step gradient sync: parameters averaged every period

FSDP2/HSDP, SDP and the pipeline's per-stage reducer still run as whole strategies
(workers/parallel/registry.py); they join as further kinds of the same step."""
