"""The data-parallel step: the last parallelism `parallelize` applies (workers/parallel/parallelize.py), built
from the spec's DataParallelOptions (workers/parallel/layouts/data_parallel_options.py); the registry
(workers/parallel/registry.py) picks its kind.

replicate.py the replicate step (plain data parallelism, dp over tensor-parallel shards, ZeRO-1/2, local SGD;
             a pipeline stage's replicas, reduced after the schedule's backward)
reducers.py  how the replicate step reduces gradients: DDP, an all-reduce of local DTensor pieces, or a pipeline
             stage's flat all-reduce
sharded_optimizer.py  ZeRO-1/2: the sharded AdamW reduces (workers/parallel/zero_optimizer.py)
local_sgd.py no per-step gradient sync: parameters averaged every period
shard.py     the shard step: FSDP2 `fully_shard` per block and the root over the options' group (HSDP: 2-D)
shard_root.py the root unit's rule (torch-free: the layouts' cost reads it)

SDP (workers/parallel/sdp/) still runs as a whole strategy; it joins as a further kind of the same step."""
