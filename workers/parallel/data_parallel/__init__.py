"""The data-parallel step: the last parallelism `parallelize` applies (workers/parallel/parallelize.py), built
from the spec's DataParallelOptions (workers/parallel/layouts/data_parallel_options.py).

step.py      the step's interface and `apply_data_parallel`, by the options' kind
replicate.py the replicate step (plain data parallelism, and dp over tensor-parallel shards)
reducers.py  how the replicate step reduces gradients: DDP, or an all-reduce of local DTensor pieces

ZeRO-1/2, FSDP2/HSDP, local SGD and SDP still run as whole strategies (workers/parallel/registry.py)."""
