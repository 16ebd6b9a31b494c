"""Parameter gradients as one flat tensor, so a rank's share is summed into rank 0's by one reduce."""

from __future__ import annotations

import torch
from torch import nn


def flat_gradients(parameters: list[nn.Parameter]) -> torch.Tensor:
    """[has-gradient flags..., every gradient flattened] on the CPU, float64 (exact sums of float32
    parts for W below 2²⁹); a parameter without a gradient contributes a 0 flag and zeros."""
    flags = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float64)
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).to("cpu", torch.float64)
        for p in parameters
    ]
    return torch.cat([flags, *parts])


def apply_gradients(parameters: list[nn.Parameter], flat: torch.Tensor) -> None:
    """Set each parameter's gradient to its slice of the summed ``flat``; one no rank had stays None."""
    flags, offset = flat[: len(parameters)], len(parameters)
    for index, p in enumerate(parameters):
        size = p.numel()
        if flags[index] > 0:
            p.grad = flat[offset: offset + size].reshape(p.shape).to(p.device, p.dtype)
        offset += size
    if offset != flat.numel():
        raise ValueError(f"a gradient of {flat.numel()} values for parameters of {offset}: the ranks' extractors differ")
