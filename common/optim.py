"""The optimiser both parties build from the run's [optimizer] section."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from vesper.common.config import OptimizerConfig


def build_optimizer(config: OptimizerConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Adam or SGD as ``config`` says, fused: one kernel over every parameter instead of a
    Python loop of small ops per parameter (the same update rule; on a CPU torch's default is
    that loop, and a step over A's extractor took 2.1 ms against 0.5 ms fused, over B's
    decoder 1.0 ms against 0.25 ms; docs/performance-notes.md). A torch without a fused kernel
    for these parameters' device (a GPU host's own torch before 2.4 has none for the CPU, and
    refuses ``fused`` when the optimiser is built) gets torch's loop. A checkpoint restores the
    setting it was saved with (its param_groups), so a resumed run keeps its optimiser."""
    optimizer = torch.optim.Adam if config.name == "adam" else torch.optim.SGD
    params = list(params)
    try:
        return optimizer(params, lr=config.lr, weight_decay=config.weight_decay, fused=True)
    except RuntimeError:
        return optimizer(params, lr=config.lr, weight_decay=config.weight_decay)


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
