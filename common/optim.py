"""The optimiser both parties build from the run's [optimizer] section."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from vesper.common.config import OptimizerConfig


def build_optimizer(config: OptimizerConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if config.name == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)


def carry_state(
    target: torch.optim.Optimizer, source: torch.optim.Optimizer,
    pairs: Iterable[tuple[torch.nn.Parameter, torch.nn.Parameter]],
) -> None:
    """``target`` goes on from ``source``'s state (Adam's moments and step count, copied) for each
    (its parameter, the source's parameter) of ``pairs`` that ``source`` has state for: training
    continued from another optimiser, with no restart of Adam's bias correction."""
    for mine, theirs in pairs:
        state = source.state.get(theirs)
        if state:
            target.state[mine] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
