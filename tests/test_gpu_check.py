"""The GPU check (docs/gpu-check.md): its dry run end to end here, and the pieces of its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vesper.benchmarks.perf.device_check import CudaTests, DeviceFigure, table

ROOT = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_pmp" name="test_cuda_matches_cpu"/>
<testcase classname="tests.test_vfgnn" name="test_on_cuda"><failure message="boom"/></testcase>
<testcase classname="tests.test_cuda_run" name="test_a_run[gap]"><skipped message="no CUDA"/></testcase>
</testsuite></testsuites>"""


def test_the_junit_outcome_counts_passes_failures_and_skips(tmp_path: Path) -> None:
    path = tmp_path / "cuda.xml"
    path.write_text(JUNIT)
    outcome = CudaTests.read(path)
    assert (outcome.passed, outcome.failed, outcome.skipped) == (1, 1, 1)
    assert outcome.failures == ["tests.test_vfgnn::test_on_cuda"]


def test_the_table_shows_both_devices_and_the_ratio() -> None:
    from rich.console import Console

    figure = DeviceFigure("training step", cpu_ms=30.0, device_ms=6.0, device="cuda", detail="30 steps")
    console = Console(width=200, record=True)
    console.print(table([figure], CudaTests(8, 0, 0, []), 12.0, "synthetic"))
    text = console.export_text()
    assert "30.00 ms" in text and "6.00 ms" in text and "5.00x" in text and "8 passed, 0 failed" in text


def test_without_a_cuda_device_the_check_stops_unless_it_is_the_dry_run() -> None:
    done = subprocess.run(
        [str(ROOT / "deploy" / "gpu-check.sh"), "--python", sys.executable, "--out", "/nonexistent/never"],
        capture_output=True, text=True, cwd=ROOT,
    )
    if "CUDA available True" in done.stdout:
        pytest.skip("this machine has a CUDA device")
    assert done.returncode == 3 and "sees no CUDA device" in done.stderr and "make gpu-check-dry-run" in done.stderr


@pytest.mark.slow
def test_the_dry_run_builds_the_wheelhouse_installs_from_it_and_prints_one_table(tmp_path: Path) -> None:
    """make wheelhouse for this Python, then the check with the CPU standing in (a small graph)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    wheels = tmp_path / "wheels"
    built = subprocess.run([str(ROOT / "deploy" / "wheelhouse.sh"), version, str(wheels)], capture_output=True,
                           text=True, cwd=ROOT, timeout=600)
    assert built.returncode == 0, built.stderr
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    names = [path.name for path in (wheels / tag).iterdir()]
    assert any(n.startswith("vesper-") for n in names) and any(n.startswith("grpcio-") for n in names)
    assert not any(n.startswith(("torch-", "numpy-", "scipy-")) for n in names)  # the host brings these
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(
        [str(ROOT / "deploy" / "gpu-check.sh"), "--dry-run", "--python", sys.executable, "--wheelhouse", str(wheels),
         "--out", str(out), "--nodes", "3000"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "vesper imports with torch" in done.stdout and "site/vesper/" in done.stdout + done.stderr
    report = json.loads((out / "device.json").read_text())
    assert report["device"] == "cpu" and [f["name"] for f in report["figures"]] == [
        "PMP-GCN layers, forward + backward", "training step, A and B in one process",
    ]
    assert all(f["cpu_ms"] > 0 and f["device_ms"] > 0 for f in report["figures"])
    assert report["tests"]["failed"] == 0 and report["tests"]["skipped"] >= 8  # no CUDA here: they skip
    assert "vesper GPU check" in (out / "table.txt").read_text()
