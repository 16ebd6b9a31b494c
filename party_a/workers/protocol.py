"""What rank 0 and the workers say to each other: the set-up and the per-release commands.

The set-up is a pydantic model (it crosses a process boundary, perhaps a host's); the per-release
commands carry tensors (root shares, generator states, parameters, B's gradient) and travel as
torch.distributed objects between processes of one party A.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

PER_STEP_EXTRACTORS = ("mlp", "pmp-gin", "pmp-gcn")
# GAP's one-shot hops, each a sparse product over all N rows split by rows over the ranks
# (party_a.extractors.gap_hops); relational-gap's DP-SGD pre-training runs on rank 0 alone
ONE_SHOT_EXTRACTORS = ("gap", "relational-gap")


class WorkerSetup(BaseModel):
    """What a worker needs to build the run's extractor as rank 0 built it."""

    model_config = ConfigDict(extra="forbid")

    run_config_json: str = Field(description="the run's RunConfig, defaults applied, as JSON")
    dataset: Path = Field(description="the dataset's file at party A (its CSR cache is memory-mapped): the same path on every host")
    device: str = Field(description="party A's device; a CUDA worker takes cuda:(rank mod GPUs)")
    delta: float
    torch_threads: int | None = None
    edge_free_key: tuple[int, int] | None = Field(
        None, description="the edge-free layers' dropout secret (party_a.run.secrets); its stream's position comes with the state dict",
    )


@dataclass(frozen=True)
class ReleaseCommand:
    """One release: every rank releases ``shares[rank]`` from the generators' ``states``."""

    kind: str
    training: bool
    noise_std: float
    shares: list[torch.Tensor]
    sampling_state: torch.Tensor
    noise_state: torch.Tensor
    parameters: dict[str, torch.Tensor] | None  # the state dict, when it changed since the last command
    op: Literal["release"] = "release"


@dataclass(frozen=True)
class BackwardCommand:
    """B's gradient of the last release: each rank back-propagates its share's rows."""

    gradient: torch.Tensor
    op: Literal["backward"] = "backward"


@dataclass(frozen=True)
class HopCommand:
    """One of GAP's hops: rank 0 broadcasts x̃_{hop-1} ([rows, width], float32) next; every rank
    computes its block of rows of A x̃_{hop-1} + N(0, std² I), keyed by (``key``, ``hop``, node),
    and rank 0 gathers the blocks (party_a.workers.hops)."""

    hop: int
    std: float
    key: tuple[int, int] | None
    rows: int
    width: int
    op: Literal["hop"] = "hop"


@dataclass(frozen=True)
class StopCommand:
    op: Literal["stop"] = "stop"


Command = ReleaseCommand | BackwardCommand | HopCommand | StopCommand


def split_roots(roots: torch.Tensor, world: int) -> list[torch.Tensor]:
    """The roots in ``world`` contiguous shares (the first the largest), concatenated in root order."""
    return [share.clone() for share in torch.tensor_split(roots, world)]


def share_bounds(shares: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Where each share's rows lie in the release: (start, end) per rank."""
    bounds, start = [], 0
    for share in shares:
        bounds.append((start, start + share.numel()))
        start += share.numel()
    return bounds


def cpu_state(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu() for name, value in state.items()}
