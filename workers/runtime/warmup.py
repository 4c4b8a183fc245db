"""What a worker process imports before it is given a job (the bulk of a cold start)."""


def import_training_stack() -> None:
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (use_deterministic_algorithms imports it: 0.35 s)
    import torch.distributed.checkpoint  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401

    import workers.training.trainer  # noqa: F401
