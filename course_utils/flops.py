"""Counting floating-point operations (FLOPs) of a model.

:func:`count_flops` runs a model once under ``torch.utils.flop_counter.FlopCounterMode``
and returns the FLOPs of the forward pass, or of forward plus backward (a training
step, about 3x the forward). One multiply-add counts as 2 FLOPs, the convention of
datasheet peaks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_flops(
    model: nn.Module | Callable[..., Any],
    *inputs: Any,
    training: bool = False,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> int:
    """FLOPs of one call of ``model(*inputs)`` (with ``training=True``: plus backward).

    For the backward pass the output (or ``loss_fn(output)``) is summed to a scalar.
    Gradients the call creates are left on the parameters; zero them if you train after.

    >>> count_flops(nn.Linear(4, 3, bias=False), torch.ones(2, 4))  # 2 * 2*4*3
    48
    """
    with FlopCounterMode(display=False) as counter:
        if training:
            output = model(*inputs)
            loss = loss_fn(output) if loss_fn is not None else output.float().sum()
            loss.backward()
        else:
            with torch.no_grad():
                model(*inputs)
    return int(counter.get_total_flops())
