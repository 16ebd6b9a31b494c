"""A release whose backward is the extractor's own private gradient (DP-SGD at party A).

The trainer back-propagates B's gradient into every release and steps its optimiser. For
an extractor that trains A's parameters with DP-SGD (dpar-node, heterpoisson), the exact
gradient must never reach them: this autograd function is the identity on the (already
noised) release, and its backward returns ``step.extractor.private_gradient(step,
grad_output)`` — clipped, noised parameter gradients, or None until an update is complete.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class PrivateStep(Protocol):
    """What the release remembers of its step: at least the extractor that made it."""

    extractor: Any


class PrivateBackward(torch.autograd.Function):
    """``PrivateBackward.apply(released, step, *params)``: released, with a private backward."""

    @staticmethod
    def forward(ctx: Any, released: torch.Tensor, step: PrivateStep, *params: torch.Tensor) -> torch.Tensor:
        ctx.step = step
        return released.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        step = ctx.step
        return (None, None, *step.extractor.private_gradient(step, grad_output))
