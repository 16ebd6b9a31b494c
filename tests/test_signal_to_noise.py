"""``vesper bench snr``: the z it reports is the accountant's, and the signal is what is noised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vesper.accountant.budget import Accountant
from vesper.accountant.ledger_store import LedgerStore
from vesper.benchmarks import signal_to_noise as snr
from vesper.common.config import RunConfig
from vesper.common.dataset_files import resolve_dataset
from vesper.party_a.run import GraphData


def test_profile_matches_the_accountant_and_the_graph(tmp_path: Path) -> None:
    config = RunConfig.model_validate({"epochs": 3, "privacy": {"epsilon": 4}, "extractor": {"name": "pmp-gin"}})
    cora = resolve_dataset("cora")
    found = snr.profile(config, cora, "pmp-gin")

    # the same plan, calibrated by the accountant service's own code
    from vesper.party_a.extractors.base import ExtractorSetup
    from vesper.party_a.extractors.pmp_plugin import PmpGinPlugin

    data = GraphData.load(cora, torch.device("cpu"))
    roots = snr.roots_of(config, cora)
    delta = config.privacy.delta
    setup = ExtractorSetup(
        config=config, params=PmpGinPlugin.spec.params(), graph=data.graph, features=data.features,
        device=torch.device("cpu"), sampling_generator=torch.Generator(), noise_generator=torch.Generator(), delta=delta,
    )
    plan = PmpGinPlugin(setup).charge_plan(roots)
    accountant = Accountant(LedgerStore(tmp_path / "ledger.sqlite"))
    z, _, _, _ = accountant.calibrate_gaussian(
        plan.passes(config.epochs, roots), plan.rules, 4.0, delta, "visible-batch", "pld"
    )
    assert found.noise_multiplier == pytest.approx(z, rel=1e-6)
    assert found.noise_std == pytest.approx(z * plan.sensitivity, rel=1e-6)

    # degree-1 nodes aggregate exactly one unit vector; nothing reads more than the fanout
    first = found.buckets[0]
    assert (first.low, first.high) == (1, 1) and first.signal == pytest.approx(1.0, abs=1e-5)
    assert all(b.signal <= min(b.high, config.extractor.fanout) + 1e-4 for b in found.buckets)
    assert sum(b.nodes for b in found.buckets) == data.graph.num_nodes
