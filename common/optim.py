"""The optimiser both parties build from the run's [optimizer] section."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from vesper.common.config import OptimizerConfig


def build_optimizer(config: OptimizerConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if config.name == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
