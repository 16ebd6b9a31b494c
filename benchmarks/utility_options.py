"""The options of ``vesper bench utility``: the grid's axes, the full and the quick preset, and
one invocation's resolved options (:class:`UtilityOptions`), with the command that reproduces it."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel

from vesper.benchmarks.extractor_sweep import HIDDEN, VISIBLE
from vesper.common.config import RunConfig

EPSILONS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, math.inf)
DECODERS = ("concat", "gru")
ACCOUNTINGS = (HIDDEN, VISIBLE)
DATASETS = ("cora", "tolokers", "synthetic-dense", "synthetic-sparse")
TOLOKERS = Path("/work/shared/data/tolokers.npz")
TWITCH_ENGB = Path("/work/shared/data/twitch_engb.npz")
# label -> (the generator's degree profile, edge homophily); the heterophilous graph is where an
# aggregation that assumes neighbours alike loses to the features alone (issue #21)
SYNTHETIC_PROFILES = {
    "synthetic-dense": ("dense", 0.8), "synthetic-sparse": ("sparse", 0.8),
    "synthetic-heterophilous": ("dense", 0.2),
}
# label -> (profile, edge homophily, N): graphs of a fixed size, which --synthetic-nodes does not
# change; the paper's findings are claimed for graphs of more than 100,000 nodes, where Theorem
# 2.1's γ is small (issue #21 item 4, docs/pmp-at-scale.md). Not in the default grid: a run takes
# minutes, not seconds.
SYNTHETIC_FIXED = {
    "synthetic-dense-100k": ("dense", 0.8, 100_000), "synthetic-sparse-100k": ("sparse", 0.8, 100_000),
}
# the graphs a file outside the repository provides: skipped, saying so, where it is absent
SHARED_FILES = {"tolokers": TOLOKERS, "twitch-engb": TWITCH_ENGB}
# Cora's node count: with the generator's 16 features a run then takes about as long as a
# Cora run (20 epochs at ε = 4: pmp-gcn 3.8 s dense, 6.2 s sparse, 4.3 s Cora; docs/utility.md)
SYNTHETIC_NODES = 2708
FIRST_EXTRACTORS = ("mlp", "pmp-gin", "pmp-gcn", "gap", "vfgnn")


# -- the options ----------------------------------------------------------------------------------
class Preset(BaseModel):
    """Values of the grid's options a flag left unset takes."""

    datasets: list[str]
    extractors: list[str] | None  # None: every extractor installed here
    decoders: list[str]
    epsilons: list[float]
    accountings: list[str]
    seeds: int
    epochs: int | None  # None: the [run] section's, else RunConfig's default
    jobs: int


FULL = Preset(
    datasets=list(DATASETS), extractors=None, decoders=list(DECODERS), epsilons=list(EPSILONS),
    accountings=list(ACCOUNTINGS), seeds=5, epochs=None, jobs=1,
)
# Every ε a finding reads except 8 and 32, a sparse and a dense graph, two seeds (the least
# Welch's test can use); its wall time on 2 cores is in docs/utility.md
QUICK = Preset(
    datasets=["cora", "synthetic-dense"], extractors=list(FIRST_EXTRACTORS), decoders=["concat"],
    epsilons=[4.0, 16.0, math.inf], accountings=list(ACCOUNTINGS), seeds=2, epochs=20, jobs=2,
)


class UtilityOptions(BaseModel):
    """One invocation of the benchmark, every preset value resolved."""

    datasets: list[str]
    extractors: list[str]
    decoders: list[str]
    epsilons: list[float]
    accountings: list[str]
    seeds: int
    base: RunConfig  # every run starts from it (the [run] section of --config, --epochs applied)
    jobs: int = 1
    in_process: bool = False
    party_a: str | None = None
    out: Path = Path("bench/utility")
    synthetic_nodes: int = SYNTHETIC_NODES
    quick: bool = False

    @property
    def command(self) -> str:
        """The command that reproduces this grid, flag by flag."""
        parts = [
            "vesper bench utility", *(f"--dataset {d}" for d in self.datasets),
            *(f"--extractor {e}" for e in self.extractors), *(f"--decoder {d}" for d in self.decoders),
            *(f"--epsilon {format_epsilon(e, 'inf')}" for e in self.epsilons),
            *(f"--accounting {a}" for a in self.accountings), f"--seeds {self.seeds}",
            f"--epochs {self.base.epochs}", f"--jobs {self.jobs}",
        ]
        if any(d in SYNTHETIC_PROFILES for d in self.datasets):
            parts.append(f"--synthetic-nodes {self.synthetic_nodes}")
        if self.in_process:
            parts.append("--in-process")
        return " ".join(parts)


def format_epsilon(epsilon: float, infinity: str = "∞") -> str:
    return infinity if math.isinf(epsilon) else f"{epsilon:g}"


def installed_extractors() -> list[str]:
    """Every extractor registered at this machine's party A (edge- and node-level), VESPER's first."""
    from vesper.party_a.extractors.registry import installed

    names = [item.name for item in installed() if item.extractor is not None]
    return [n for n in FIRST_EXTRACTORS if n in names] + sorted(n for n in names if n not in FIRST_EXTRACTORS)
