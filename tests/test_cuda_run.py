"""Party A on a CUDA device, through the real services (the GPU check runs it; skipped without CUDA).

The same run with A on the CPU and with A on CUDA: both complete, and their ledgers are the
same row for row (kind, pass, nodes, ε): what is charged does not depend on where A computes
(the releases themselves differ in their floating-point rounding and their noise streams).
"""

from __future__ import annotations

import io

import pytest
import torch
from fault_drill import ledger_rows
from rich.console import Console

from vesper.common.config import RunConfig
from vesper.coordinator.processes import LocalCluster
from vesper.coordinator.run_client import drive_run

pytestmark = [pytest.mark.e2e, pytest.mark.cuda]
QUIET = Console(file=io.StringIO())
RUN = {"dataset": "cora", "epochs": 2, "batch_size": 128, "privacy": {"epsilon": 8}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("extractor", ["pmp-gcn", "gap"])
def test_a_run_with_party_a_on_cuda_charges_what_the_cpu_run_charges(tmp_path, extractor: str) -> None:
    config = RunConfig.model_validate({**RUN, "extractor": {"name": extractor}})
    ledgers, metrics = {}, {}
    for device in ("cpu", "cuda"):
        with LocalCluster(tmp_path / device, party_a={"device": device, "secret_seed": 3}) as cluster:
            summary = drive_run(cluster.party_a_address, config, QUIET)
            assert summary.status == "completed", f"{device}: {summary.message}"
            ledgers[device] = [row[1:] for row in ledger_rows(cluster.status_url, summary.run_id)]
            metrics[device] = summary.test_metric.value if summary.test_metric else 0.0
    assert ledgers["cuda"] == ledgers["cpu"]
    assert metrics["cuda"] > 0.3  # Cora, 7 classes: it learned (chance ≈ 0.3 for the largest class)
