"""The datasets of ``vesper bench utility``, by name: ``cora`` (bundled), ``tolokers`` and
``twitch-engb`` (skipped, with the reason, when their file is absent), and ``synthetic-dense`` /
``synthetic-sparse`` / ``synthetic-heterophilous`` (N = ``--synthetic-nodes``) and
``synthetic-dense-100k`` / ``synthetic-sparse-100k`` (N fixed),
generated once into ``OUT/data/`` from a fixed :class:`SyntheticSpec` recorded in
``OUT/data/spec.json``: a resumed benchmark refuses to mix rows of graphs drawn from different
specs (:class:`SpecMismatch`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.extractor_table import dataset_label
from vesper.benchmarks.utility_options import SHARED_FILES, SYNTHETIC_FIXED, SYNTHETIC_PROFILES

if TYPE_CHECKING:
    from vesper.benchmarks.synthetic import SyntheticSpec

# numpy-heavy modules (synthetic) are imported where they are used: the CLI imports this module
# (through utility_bench) to register the command.


class BenchDataset(BaseModel):
    label: str  # in rows and reports
    run_name: str  # what a run is given: a bundled name or an absolute .npz path
    path: Path  # the file here, for its density


class SpecMismatch(ValueError):
    """OUT/data/spec.json records another synthetic graph than the one asked for."""


def is_synthetic(label: str) -> bool:
    """Whether the benchmark generates ``label`` (SYNTHETIC_PROFILES or SYNTHETIC_FIXED)."""
    return label in SYNTHETIC_PROFILES or label in SYNTHETIC_FIXED


def synthetic_spec(label: str, nodes: int) -> SyntheticSpec:
    """The fixed spec of a named synthetic dataset: its profile's defaults, its homophily, seed 0,
    and N = ``nodes`` (SYNTHETIC_PROFILES) or its own N, whatever ``nodes`` says (SYNTHETIC_FIXED)."""
    from vesper.benchmarks.synthetic import SyntheticSpec

    if label in SYNTHETIC_FIXED:
        profile, homophily, nodes = SYNTHETIC_FIXED[label]
    else:
        profile, homophily = SYNTHETIC_PROFILES[label]
    return SyntheticSpec(num_nodes=nodes, profile=profile, homophily=homophily, seed=0)


def spec_fields(spec: SyntheticSpec) -> dict[str, Any]:
    """The spec as JSON values (a tuple becomes a list), as spec.json stores it."""
    return json.loads(json.dumps(dataclasses.asdict(spec)))


def array_digest(path: Path) -> str:
    """SHA-256 over every array's name, dtype, shape and bytes (the .npz's zip timestamps vary)."""
    import numpy as np

    from vesper.common.npz_files import read_npz

    digest = hashlib.sha256()
    for name, array in sorted(read_npz(path).items()):
        array = np.ascontiguousarray(array)
        digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class SyntheticRecord(BaseModel):
    spec: dict[str, Any]
    sha256: str


def _read_records(path: Path) -> dict[str, SyntheticRecord]:
    if not path.exists():
        return {}
    return {label: SyntheticRecord.model_validate(v) for label, v in json.loads(path.read_text()).items()}


def _write_records(path: Path, records: dict[str, SyntheticRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v.model_dump() for k, v in records.items()}, indent=2, sort_keys=True) + "\n")


def spec_differences(recorded: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    return [
        f"{key}: recorded {recorded.get(key)!r}, asked {asked.get(key)!r}"
        for key in sorted(set(recorded) | set(asked)) if recorded.get(key) != asked.get(key)
    ]


def ensure_synthetic(data_dir: Path, label: str, nodes: int, labels_with_rows: set[str]) -> Path:
    """``data_dir/<label>.npz``, generated from :func:`synthetic_spec` the first time.

    Refuses (:class:`SpecMismatch`) when spec.json records another spec for ``label``, when the
    file's arrays are not the recorded ones, and when results.csv has rows of ``label`` but
    spec.json does not say which graph they were made on.
    """
    from vesper.benchmarks.synthetic import generate, save_npz

    spec_path = data_dir / "spec.json"
    records = _read_records(spec_path)
    asked = spec_fields(synthetic_spec(label, nodes))
    path = data_dir / f"{label}.npz"
    record = records.get(label)
    if record is not None:
        differences = spec_differences(record.spec, asked)
        if differences:
            raise SpecMismatch(
                f"{spec_path} records {label} with another spec ({'; '.join(differences)}), and the rows of "
                f"{label} in results.csv were made on that graph: pass --synthetic-nodes "
                f"{record.spec.get('num_nodes')} to resume, or choose another --out"
            )
    elif label in labels_with_rows:
        raise SpecMismatch(
            f"results.csv has rows of {label} but {spec_path} does not record the spec of their graph: "
            "choose another --out"
        )
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        save_npz(generate(synthetic_spec(label, nodes)), path)
    digest = array_digest(path)
    if record is not None and digest != record.sha256:
        raise SpecMismatch(
            f"{path}'s arrays are not the ones {spec_path} recorded for this spec (sha256 {digest[:12]}…, "
            f"recorded {record.sha256[:12]}…): the file was changed, or the generator no longer gives the "
            "same graph for the same spec"
        )
    if record is None:
        records[label] = SyntheticRecord(spec=asked, sha256=digest)
        _write_records(spec_path, records)
    declare_edge_bound(path, synthetic_spec(label, nodes))
    return path


def declare_edge_bound(path: Path, spec: SyntheticSpec) -> None:
    """Beside the generated file, its public edge bound: M, the number of edges the generator was
    asked for (a parameter chosen before the graph existed, not counted from it), so extractors
    whose rates need a public |E| bound (relational pre-training) run on it."""
    from vesper.coordinator.public_facts import DeclaredFacts, write_declared_facts

    write_declared_facts(path, DeclaredFacts(
        edge_bound=spec.target_edges,
        why=f"the synthetic generator's M = round(mean_degree · N / 2) = {spec.target_edges} edges asked for",
    ))


def resolve_datasets(
    names: Sequence[str], data_dir: Path, nodes: int, labels_with_rows: set[str], say: Console,
) -> list[BenchDataset]:
    """The grid's datasets; tolokers is skipped with a printed reason when its file is absent."""
    from vesper.common.dataset_files import BUNDLED, resolve_dataset

    found = []
    for name in names:
        if is_synthetic(name):
            path = ensure_synthetic(data_dir, name, nodes, labels_with_rows).resolve()
            found.append(BenchDataset(label=name, run_name=str(path), path=path))
        elif name in SHARED_FILES:
            path = SHARED_FILES[name]
            if not path.is_file():
                say.print(f"skipping {name}: {path} does not exist", highlight=False)
                continue
            # labelled as its rows are: by the file's stem (twitch-engb -> twitch_engb)
            found.append(BenchDataset(label=dataset_label(str(path)), run_name=str(path), path=path))
        else:
            path = resolve_dataset(name)
            run_name = name if name in BUNDLED else str(path.resolve())
            found.append(BenchDataset(label=dataset_label(name), run_name=run_name, path=path))
    return found
