"""The README's "Your own data" walk-through, run as written (fewer epochs), from files to scores."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _walkthrough() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.strip().splitlines()]


@pytest.mark.slow
def test_the_readme_walkthrough_writes_one_score_per_unlabelled_key_of_the_intersection(tmp_path: Path) -> None:
    commands = _walkthrough()
    assert [c[1:3] for c in commands] == [["data", "example"], ["data", "import"], ["data", "import"], ["demo", "--party-a-data"]]
    for command in commands:
        args = [sys.executable, "-m", "vesper.coordinator", *command[1:]]
        if command[1] == "demo":  # as written, with fewer epochs and the demo's files in this test's directory
            args[args.index("--epochs") + 1] = "2"
            args += ["--workdir", str(tmp_path / "demo"), "--no-baseline"]
        done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
    scores = pacsv.read_csv(tmp_path / "example" / "scores.csv").to_pydict()
    labels = pacsv.read_csv(tmp_path / "example" / "party_b" / "labels.csv").to_pydict()
    only_keys = pacsv.ConvertOptions(include_columns=["id"])
    a_keys = set(pacsv.read_csv(tmp_path / "example" / "party_a" / "features.csv", convert_options=only_keys).column("id").to_pylist())
    unlabelled = {key for key, label in zip(labels["id"], labels["label"]) if not label and key in a_keys}
    assert set(scores["key"]) == unlabelled and len(scores["key"]) == len(unlabelled)
    assert set(scores["predicted"]) <= {name for name in labels["label"] if name}
