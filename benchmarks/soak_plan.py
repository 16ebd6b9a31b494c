"""What ``vesper bench soak`` runs: its options, the synthetic graph, the step plan
(:func:`plan_steps`) and the run's configuration (PMP-GCN, visible-batch, finite ε)."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, Field

from vesper.common.config import RunConfig

DATASET_NAME = "soak-synthetic"


class SoakPlan(BaseModel):
    requested_steps: int
    nodes: int
    edges: int
    train_nodes: int
    batch_size: int
    steps_per_epoch: int
    epochs: int

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


def plan_steps(requested_steps: int, train_nodes: int, steps_per_epoch: int) -> tuple[int, int, int]:
    """(batch size, steps per epoch, epochs) that train at least ``requested_steps``.

    Exactly that many when it is a multiple of the steps per epoch, else less than one
    epoch more: party A cuts each epoch's T roots into ``ceil(T / batch)`` batches.
    """
    if requested_steps < 1 or train_nodes < 1 or steps_per_epoch < 1:
        raise ValueError("steps, training nodes and steps per epoch must all be at least 1")
    batch = math.ceil(train_nodes / min(steps_per_epoch, train_nodes))
    per_epoch = math.ceil(train_nodes / batch)
    return batch, per_epoch, math.ceil(requested_steps / per_epoch)

class SoakOptions(BaseModel):
    steps: int = Field(20_000, ge=1)
    nodes: int = Field(20_000, ge=100)
    steps_per_epoch: int = Field(100, ge=1)
    epsilon: float = Field(8.0, gt=0)
    samples: int = Field(100, ge=2, description="periodic samples between the start and the end")
    warmup: float = Field(0.05, ge=0.0, lt=1.0, description="fraction of the steps before the start sample")
    seed: int = 0
    workdir: Path = Path(".vesper/soak")

    def command(self) -> str:
        return (
            f"vesper bench soak --steps {self.steps} --nodes {self.nodes} --steps-per-epoch {self.steps_per_epoch} "
            f"--epsilon {self.epsilon:g} --samples {self.samples} --warmup {self.warmup:g}"
        )


def synthetic_graph(options: SoakOptions) -> tuple[Path, int, int, int]:
    """(path, nodes, edges, B's training nodes) of the soak's graph, generated once per spec."""
    from vesper.benchmarks.synthetic import SyntheticSpec, generate, save_npz

    spec = SyntheticSpec(num_nodes=options.nodes, profile="sparse", seed=options.seed)
    path = options.workdir / "data" / f"synthetic-sparse-{options.nodes}-seed{options.seed}.npz"
    graph = generate(spec)  # cheap next to the run (20,000 nodes: under a second), and gives the counts
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(graph, path)
    return path, graph.num_nodes, graph.num_edges, int(graph.train_masks.sum())


def run_config(options: SoakOptions, plan: SoakPlan) -> RunConfig:
    """PMP-GCN, visible-batch, finite ε: every step is charged and committed before it is sent."""
    return RunConfig.model_validate({
        "dataset": DATASET_NAME, "epochs": plan.epochs, "batch_size": plan.batch_size, "seed": options.seed,
        "privacy": {"epsilon": options.epsilon, "accounting": "visible-batch"},
        "extractor": {"name": "pmp-gcn"},
    })
