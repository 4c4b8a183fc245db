"""How a batch reaches a model and a model's output reaches the loss, for any model.

A sample is an `(input, target)` pair, where the input is a tensor or a dict of tensors, or a
dict such as `{"input_ids", "labels", "attention_mask"}` (Hugging Face style; its `labels` are
the targets). A batch keeps that form, stacked. A tensor input is passed positionally, a dict
as keyword arguments; `labels` go into the call only when `train.loss` is `model`, the loss the
model itself returns. A model may return a tensor, a tuple (logits first) or a ModelOutput.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from workers.user_model_error import UserModelError

Inputs = torch.Tensor | dict[str, torch.Tensor]
Batch = tuple[Inputs, torch.Tensor | None]


def collate(items: list) -> Batch:
    """Stack samples of any of the documented forms into one batch of the same form."""
    first = items[0]
    if isinstance(first, Mapping):
        stacked = {k: torch.stack([item[k] for item in items]) for k in first}
        return stacked, stacked.get("labels")
    inputs, targets = zip(*items)
    if isinstance(inputs[0], Mapping):
        return {k: torch.stack([x[k] for x in inputs]) for k in inputs[0]}, torch.stack(targets)
    return torch.stack(inputs), torch.stack(targets)


def to_device(batch: Batch, device: torch.device) -> Batch:
    inputs, targets = batch
    if isinstance(inputs, dict):
        inputs = {k: v.to(device) for k, v in inputs.items()}
    else:
        inputs = inputs.to(device)
    return inputs, None if targets is None else targets.to(device)


def call_model(model: torch.nn.Module, inputs: Inputs, with_labels: bool = False) -> Any:
    if not isinstance(inputs, dict):
        return model(inputs)
    if with_labels:
        return model(**inputs)
    return model(**{k: v for k, v in inputs.items() if k != "labels"})


def primary_input(inputs: Inputs) -> torch.Tensor:
    """The tensor that carries the samples: `input_ids` of a dict batch, else its first entry."""
    if not isinstance(inputs, dict):
        return inputs
    return inputs.get("input_ids", next(iter(inputs.values())))


def samples_in(inputs: Inputs) -> int:
    return int(primary_input(inputs).shape[0])


def tokens_in(inputs: Inputs) -> int:
    x = primary_input(inputs)
    return x.numel() if x.dtype == torch.long else 0


def logits_of(output: Any) -> torch.Tensor:
    """The prediction tensor of whatever the model returned."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "logits" in output:  # transformers' ModelOutput is a Mapping
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise UserModelError(f"the model returned {type(output).__name__}: Trainyard takes a tensor, a tuple "
                         f"whose first item is the logits, or an output with .logits")


def model_loss(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise UserModelError("train.loss 'model' takes the loss the model returns, but its output has no .loss: "
                             "the batches must carry 'labels' the model understands")
    return loss
