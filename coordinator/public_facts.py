"""Public facts a benchmark or the demo may declare for a run on a public benchmark graph.

δ, and every rate a mechanism is built from, must be public: declared, never counted from
party A's graph (docs/privacy.md, section 1). For the public graphs vesper is measured on,
the published number of undirected edges (``common.dataset_files.PUBLISHED_EDGE_COUNTS``) is
such a declaration; for a generated graph, the number of edges its generator was asked for,
written beside the file as ``<name>.public.json`` (``{"edge_bound": M, "why": "..."}``) by
whoever generated it (``vesper bench utility`` for its synthetic graphs); for anyone's own
graph the operator declares ``privacy.edge_bound``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vesper.common.config import RunConfig
from vesper.common.dataset_files import PUBLISHED_EDGE_COUNTS

PUBLIC_FACTS_SUFFIX = ".public.json"


class DeclaredFacts(BaseModel):
    """What the maker of a generated graph file declares public about it (``<name>.public.json``)."""

    model_config = ConfigDict(extra="forbid")

    edge_bound: int = Field(ge=1, description="a public upper bound on the graph's undirected edges")
    why: str = Field(min_length=1, description="where the number comes from, e.g. the generator's parameter")


class PublicFactsError(ValueError):
    """A ``<name>.public.json`` beside a graph file cannot be read."""


def public_facts_path(npz: Path) -> Path:
    return npz.with_name(npz.stem + PUBLIC_FACTS_SUFFIX)


def write_declared_facts(npz: Path, facts: DeclaredFacts) -> Path:
    path = public_facts_path(npz)
    path.write_text(facts.model_dump_json(indent=2) + "\n")
    return path


def declared_facts(npz: Path) -> DeclaredFacts | None:
    """The facts declared beside ``npz``, if a ``<name>.public.json`` is there."""
    path = public_facts_path(npz)
    if not path.is_file():
        return None
    try:
        return DeclaredFacts.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise PublicFactsError(
            f"{path} does not declare a graph's public facts ({exc}); fix or delete it, or declare "
            "privacy.edge_bound yourself"
        ) from None


def published_edge_count(dataset: str) -> int | None:
    """The published edge count of a public benchmark graph, by bundled name or file name, or the
    edge bound declared beside a generated .npz (:func:`declared_facts`)."""
    name = Path(dataset).stem if dataset.endswith(".npz") else dataset
    if name in PUBLISHED_EDGE_COUNTS:
        return PUBLISHED_EDGE_COUNTS[name]
    facts = declared_facts(Path(dataset)) if dataset.endswith(".npz") else None
    return facts.edge_bound if facts else None


def with_published_edge_bound(run: RunConfig) -> RunConfig:
    """``run`` with its dataset's published edge count as ``privacy.edge_bound`` when none is declared."""
    published = published_edge_count(run.dataset)
    if run.privacy.edge_bound is not None or published is None:
        return run
    return run.model_copy(update={"privacy": run.privacy.model_copy(update={"edge_bound": published})})
