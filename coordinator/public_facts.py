"""Public facts a benchmark or the demo may declare for a run on a public benchmark graph.

δ, and every rate a mechanism is built from, must be public: declared, never counted from
party A's graph (docs/privacy.md, section 1). For the public graphs vesper is measured on,
the published number of undirected edges (``common.dataset_files.PUBLISHED_EDGE_COUNTS``) is
such a declaration; for anyone's own graph the operator declares ``privacy.edge_bound``.
"""

from __future__ import annotations

from pathlib import Path

from vesper.common.config import RunConfig
from vesper.common.dataset_files import PUBLISHED_EDGE_COUNTS


def published_edge_count(dataset: str) -> int | None:
    """The published edge count of a public benchmark graph, by bundled name or file name."""
    name = Path(dataset).stem if dataset.endswith(".npz") else dataset
    return PUBLISHED_EDGE_COUNTS.get(name)


def with_published_edge_bound(run: RunConfig) -> RunConfig:
    """``run`` with its dataset's published edge count as ``privacy.edge_bound`` when none is declared."""
    published = published_edge_count(run.dataset)
    if run.privacy.edge_bound is not None or published is None:
        return run
    return run.model_copy(update={"privacy": run.privacy.model_copy(update={"edge_bound": published})})
