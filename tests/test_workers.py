"""Party A's worker group (party_a.workers): with W = 2 a release is the one W = 1 makes (to float
rounding), the parameters get the same update, a lost worker is a typed error, and what W > 1
cannot run is refused before anything starts (docs/privacy.md, section 2.6)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from vesper.common.config import AuditConfig, ExtractorConfig, PartyAConfig, PrivacyConfig, RunConfig
from vesper.common.dataset_files import write_graph_npz
from vesper.party_a.extractors.base import ExtractorSetup
from vesper.party_a.extractors.edge_free_path import build_extractor, unwrapped
from vesper.party_a.extractors.gap import GapExtractor, aggregate, row_normalise
from vesper.party_a.extractors.pmp_plugin import PmpGcnPlugin, PmpGinPlugin
from vesper.party_a.extractors.registry import validated_params
from vesper.party_a.extractors.relational_gap import RelationalGapExtractor
from vesper.party_a.run.graph_data import GraphData
from vesper.party_a.workers import (
    DistributedExtractor,
    GroupReservation,
    WorkerGroup,
    WorkerLost,
    WorkersUnsupported,
    check_supported,
)
from vesper.party_a.workers.gradients import apply_gradients, flat_gradients
from vesper.party_a.workers.hops import PartitionedHops
from vesper.party_a.workers.protocol import WorkerSetup, split_roots

NODES, FEATURES = 120, 12
PLUGINS = {
    "pmp-gin": PmpGinPlugin, "pmp-gcn": PmpGcnPlugin, "gap": GapExtractor, "relational-gap": RelationalGapExtractor,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    rng = np.random.default_rng(4)
    edges = rng.integers(0, NODES, size=(600, 2))
    edges = edges[edges[:, 0] != edges[:, 1]]
    path = tmp_path_factory.mktemp("workers") / "graph.npz"
    write_graph_npz(path, edges.astype(np.int64), rng.random((NODES, FEATURES), dtype=np.float32))
    return path


def config_for(name: str, edge_rate: float | None = None) -> RunConfig:
    return RunConfig(
        dataset="graph", epochs=1, batch_size=40, seed=2,
        privacy=PrivacyConfig(epsilon=8.0, delta=1e-6, edge_sample_rate=edge_rate),
        extractor=ExtractorConfig(name=name, layers=2, fanout=3, dim=8, encoder_hidden=16, dropout=0.4, noise_multiplier=1.0),
    )


def build(config: RunConfig, path: Path, seed: int = 9):
    """The run's extractor with A's secret generators seeded ``seed``, and their state before the build."""
    data = GraphData.load(path, torch.device("cpu"))
    sampling, noise = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    initial = (sampling.get_state(), noise.get_state())
    plugin = PLUGINS[config.extractor.name]
    extractor = build_extractor(plugin, ExtractorSetup(  # as party A builds it: with its edge-free path
        config=config, params=validated_params(plugin.spec, config), graph=data.graph, features=data.features,
        device=torch.device("cpu"), sampling_generator=sampling, noise_generator=noise, delta=1e-6,
        keyed_noise=True,  # as party A builds a run's extractors when party_a.workers > 1
    ))
    extractor.noise_std = 0.7
    return extractor, initial


def start_group(
    config: RunConfig, path: Path, initial, tmp_path: Path, reservation: GroupReservation | None = None,
) -> WorkerGroup:
    settings = PartyAConfig(workers=2, step_timeout_s=30)
    setup = WorkerSetup(run_config_json=config.model_dump_json(), dataset=path, device="cpu", delta=1e-6)
    return WorkerGroup.start(settings, setup, initial, tmp_path, reservation)


def sgd_step(extractor, release: torch.Tensor, gradient: torch.Tensor, backward=None) -> None:
    optimizer = torch.optim.SGD(extractor.trainable_parameters(), lr=0.5)
    optimizer.zero_grad(set_to_none=True)
    if backward is None:
        release.backward(gradient)
    else:
        backward(release, gradient)
    optimizer.step()


@pytest.mark.parametrize("name, edge_rate", [("pmp-gin", None), ("pmp-gcn", 0.6)])
def test_two_workers_release_and_update_what_one_process_does(dataset: Path, tmp_path: Path, name, edge_rate) -> None:
    config = config_for(name, edge_rate)
    single, _ = build(config, dataset)
    double, initial = build(config, dataset)
    group = start_group(config, dataset, initial, tmp_path)
    distributed = DistributedExtractor(double, group)
    try:
        assert [int(pid) > 0 for pid in (tmp_path / "workers.json").read_text().split("[")[1].split("]")[0].split(",")] == [True]
        single.train(), double.train()
        gradients = torch.Generator().manual_seed(0)
        for step, roots in enumerate([torch.arange(0, 80, 2), torch.arange(1, 81, 2)]):
            expected = single.release(roots, "train")
            got = distributed.release(roots, "train")
            assert got.shape == expected.shape == (40, 8, 2 + 2)  # two PMP layers, then the edge-free path's two
            assert torch.allclose(got, expected, atol=1e-5), f"step {step}: {(got - expected).abs().max()}"
            # the secret generators advance as one process's do: the next release's keys are the same
            assert torch.equal(single.setup.sampling_generator.get_state(), double.setup.sampling_generator.get_state())
            assert torch.equal(single.setup.noise.generator.get_state(), double.setup.noise.generator.get_state())
            gradient = torch.randn(expected.shape, generator=gradients)
            sgd_step(single, expected, gradient)
            sgd_step(double, got, gradient, distributed.backward)
            for (label, a), b in zip(single.named_parameters(), double.parameters(), strict=True):
                assert torch.allclose(a, b, atol=1e-5), f"step {step}: {label} differs"
        # evaluation: no gradient, the workers' copy follows the parameters rank 0 updated
        single.eval(), double.eval()
        with torch.no_grad():
            roots = torch.arange(NODES)
            assert torch.allclose(distributed.release(roots, "eval"), single.release(roots, "eval"), atol=1e-5)
            one = torch.tensor([7])  # fewer roots than ranks: the second's share is empty
            assert torch.allclose(distributed.release(one, "eval"), single.release(one, "eval"), atol=1e-5)
    finally:
        group.close()


def test_the_second_rank_releases_rows_the_first_does_not_reach(dataset: Path) -> None:
    """Not vacuous: the shares' subgraphs differ, and they share nodes (computed by both ranks)."""
    config = config_for("pmp-gin")
    extractor, _ = build(config, dataset)
    first, second = split_roots(torch.arange(0, 80, 2), 2)
    seeds = unwrapped(extractor).sampler.layer_seeds(torch.Generator().manual_seed(1))
    a, b = unwrapped(extractor).sampler.sample(first, seeds), unwrapped(extractor).sampler.sample(second, seeds)
    nodes_a, nodes_b = set(a.input_nodes.tolist()), set(b.input_nodes.tolist())
    assert nodes_a & nodes_b and nodes_a != nodes_b


@pytest.mark.slow  # a drill: make test-slow
def test_a_killed_worker_is_a_typed_error_and_the_group_closes(dataset: Path, tmp_path: Path) -> None:
    config = config_for("pmp-gin")
    extractor, initial = build(config, dataset)
    group = start_group(config, dataset, initial, tmp_path)
    distributed = DistributedExtractor(extractor, group)
    try:
        extractor.train()
        distributed.release(torch.arange(10), "train")
        os.kill(group.processes[0].pid, signal.SIGKILL)
        group.processes[0].wait()
        started = time.monotonic()
        with pytest.raises(WorkerLost, match="lost a worker process") as lost:
            distributed.release(torch.arange(10), "train")
        assert "exited with -9" in str(lost.value) and lost.value.peer == "worker pool of party A"
        assert time.monotonic() - started < 30
    finally:
        group.close()
    assert group.processes[0].poll() is not None
    # the group is free again: a new run can start its own
    again = start_group(config, dataset, initial, tmp_path)
    again.close()


@pytest.mark.slow  # a drill: make test-slow
def test_a_worker_that_exits_before_joining_is_reported_at_once(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 watches the processes it started while it waits for them to arrive at the store:
    one that exits first is a typed error now, not when the join gives up (here 30 + 60 s)."""
    import subprocess

    from vesper.party_a.workers import group as group_module

    real = subprocess.Popen

    def dies_at_once(command, *args, **kwargs):  # a worker that exits before it joins
        return real([sys.executable, "-c", "import sys; sys.exit(3)"], *args, **kwargs)

    monkeypatch.setattr(group_module.subprocess, "Popen", dies_at_once)
    config = config_for("pmp-gin")
    _, initial = build(config, dataset)
    reservation = GroupReservation(2)
    started = time.monotonic()
    with pytest.raises(WorkerLost, match="lost a worker process while joining the group") as lost:
        start_group(config, dataset, initial, tmp_path, reservation)
    assert "exited with 3" in str(lost.value) and "before it joined" in str(lost.value)
    assert time.monotonic() - started < 20
    assert not reservation.held  # the group is free for the resumed run
    monkeypatch.undo()
    again = start_group(config, dataset, initial, tmp_path)  # and the next group forms
    again.close()


def test_a_rendezvous_address_vesper_cannot_use_is_named() -> None:
    from vesper.party_a.workers.__main__ import parse
    from vesper.party_a.workers.rendezvous import RendezvousError, store_address

    assert store_address("tcp://10.0.0.2:29500") == ("10.0.0.2", 29500)
    with pytest.raises(RendezvousError, match="expected tcp://HOST:PORT or env://"):
        store_address("file:///tmp/x")
    with pytest.raises(SystemExit):
        parse(["--rank", "1", "--world", "2", "--init", "tcp://nohost"])


@pytest.mark.slow  # a drill: make test-slow
def test_after_a_join_that_failed_the_next_group_forms(dataset: Path, tmp_path: Path) -> None:
    """A rendezvous that times out leaves torch's group counter raised (pytorch/pytorch#46561):
    rank 0 would name its next group 1 and a fresh worker its own 0, and they would never meet.
    WorkerGroup.start forgets the failed join, so the resumed run's workers join."""
    from datetime import timedelta

    import torch.distributed as dist

    from vesper.party_a.workers.group import _forget_failed_join, free_port

    with pytest.raises(dist.DistError):  # a worker that never came: the join gives up
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=2, timeout=timedelta(seconds=2),
        )
    assert not dist.is_initialized()
    _forget_failed_join()  # what WorkerGroup.start does when its join fails
    config = config_for("pmp-gin")
    extractor, initial = build(config, dataset)
    started = time.monotonic()
    group = start_group(config, dataset, initial, tmp_path)
    try:
        DistributedExtractor(extractor, group).release(torch.arange(10), "train")
    finally:
        group.close()
    assert time.monotonic() - started < 60  # joined, not waited out


def test_one_run_at_a_time_holds_the_group_from_its_start(dataset: Path, tmp_path: Path) -> None:
    """A run reserves the group before anything is charged; a second is refused then (not when it
    would start its workers: for GAP after its encoder stage); the group's close lets it go."""
    first = GroupReservation(2)
    try:
        with pytest.raises(WorkersUnsupported, match="another run of this party A.*nothing was charged"):
            GroupReservation(2)
        config = gap_config()
        extractor, initial = build(config, dataset)
        group = start_group(config, dataset, initial, tmp_path, first)
        assert group.reservation is first
        group.close()
        assert not first.held
        GroupReservation(2).release()  # free again
    finally:
        first.release()


@pytest.mark.slow  # a drill: make test-slow
def test_a_worker_killed_before_a_hop_is_a_typed_error(dataset: Path, tmp_path: Path) -> None:
    config = gap_config()
    extractor, initial = build(config, dataset)
    inner = unwrapped(extractor)
    group = start_group(config, dataset, initial, tmp_path)
    engine = PartitionedHops(group, inner.setup.graph, inner.setup.noise)
    try:
        os.kill(group.processes[0].pid, signal.SIGKILL)
        group.processes[0].wait()
        with pytest.raises(WorkerLost, match="lost a worker process.*exited with -9"):
            engine.hop(torch.zeros(NODES, 8), 1, 0.0, None)
    finally:
        engine.close()
    assert not group.reservation.held


def test_flat_gradients_sum_and_keep_absent_ones_absent() -> None:
    a, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(3))
    a.grad = torch.full((2, 2), 2.0)
    flat = flat_gradients([a, b]) + flat_gradients([a, b])
    a.grad = None
    apply_gradients([a, b], flat)
    assert torch.equal(a.grad, torch.full((2, 2), 4.0)) and b.grad is None
    with pytest.raises(ValueError, match="extractors differ"):
        apply_gradients([a], flat)


@pytest.mark.parametrize("name", ["vfgnn", "dpar-edge", "dpar-node", "heterpoisson", "relational", "progap"])
def test_other_extractors_are_refused_with_the_fix(name: str) -> None:
    config = config_for("pmp-gin").model_copy(update={"extractor": ExtractorConfig(name=name)})
    with pytest.raises(WorkersUnsupported, match=f"not {name}.*party_a.workers = 1.*nothing was charged") as refused:
        check_supported(config, 2)
    assert "relational-gap's pre-training runs on rank 0 alone" in str(refused.value)  # says what is split
    check_supported(config, 1)


@pytest.mark.parametrize("name", ["mlp", "pmp-gin", "pmp-gcn", "gap", "relational-gap"])
def test_the_per_step_extractors_and_gaps_hops_are_supported(name: str) -> None:
    check_supported(config_for("pmp-gin").model_copy(update={"extractor": ExtractorConfig(name=name)}), 3)


def gap_config(name: str = "gap") -> RunConfig:
    params = {"encoder_epochs": 0, **({"pretrain_steps": 3, "expected_batch": 20} if name == "relational-gap" else {})}
    extractor = ExtractorConfig(name=name, layers=2, dim=8, encoder_hidden=16, dropout=0.0, params=params)
    config = config_for("pmp-gin")
    privacy = config.privacy.model_copy(update={"edge_bound": 1000})  # relational's public bound on |E|
    return config.model_copy(update={"extractor": extractor, "privacy": privacy})


class HopSession:
    """What GAP's preparation needs of the trainer: the charges, in order (no stage: encoder_epochs = 0)."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int, int]] = []

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        self.charges.append(("one-shot", index, node_ids.numel()))

    def charge_pre_train(self, index: int, node_ids: torch.Tensor) -> None:
        self.charges.append(("pre-train", index, node_ids.numel()))

    def progress(self, message: str) -> None:
        pass


@pytest.mark.parametrize("name", ["gap", "relational-gap"])
def test_two_workers_compute_gaps_hops_as_one_process_bit_for_bit(dataset: Path, tmp_path: Path, name: str) -> None:
    """The partitioned sparse product over W = 2 gloo processes: A x̃ exactly with the noise off, one
    process's keyed hop exactly with it on, and a whole preparation's hops and charges as W = 1's
    (relational-gap: its pre-training on rank 0, then the hops split)."""
    config = gap_config(name)
    single, double = (unwrapped(build(config, dataset)[0]) for _ in range(2))
    initial = build(config, dataset)[1]
    for extractor in (single, double):
        extractor.bind(0.5)
    group = start_group(config, dataset, initial, tmp_path)
    engine = PartitionedHops(group, double.setup.graph, double.setup.noise)
    try:
        x = row_normalise(torch.randn(NODES, 8, generator=torch.Generator().manual_seed(3)))
        product = engine.hop(x, 1, 0.0, None)
        assert torch.equal(product, aggregate(single.adjacency, x)) and product.abs().sum() > 0
        key = single.hop_key()
        assert key is not None and key == double.hop_key()  # rank 0 draws it from the same secret generator
        noised = engine.hop(x, 1, double.noise_std, key)
        assert torch.equal(noised, single.noisy_hop(x, 1, key)) and not torch.equal(noised, product)
        with pytest.raises(ValueError, match="keyed noise"):
            engine.hop(x, 1, double.noise_std, None)  # refused on rank 0, before the workers hear of it
        # a whole preparation: K = 2 hops, each charged once for all nodes, the released hops W = 1's
        one, two = HopSession(), HopSession()
        single.prepare(one)
        double.hop_engine = lambda: engine
        double.prepare(two)
        hops = [("one-shot", 0, NODES), ("one-shot", 1, NODES)]
        assert one.charges == two.charges and one.charges[-2:] == hops
        assert len(one.charges) == (2 if name == "gap" else 3)  # relational-gap: one pre-train chunk first
        assert torch.equal(single.released, double.released)
    finally:
        engine.close()
    assert group.closed and all(process.poll() is not None for process in group.processes)


def test_audits_that_rebuild_the_graph_are_refused() -> None:
    config = config_for("pmp-gin").model_copy(update={"audit": AuditConfig(canaries=4)})
    with pytest.raises(WorkersUnsupported, match="canaries"):
        check_supported(config, 2)


def test_the_setting_is_checked() -> None:
    assert PartyAConfig().workers == 1
    with pytest.raises(ValidationError, match="workers"):
        PartyAConfig(workers=0)
    with pytest.raises(ValidationError, match="workers_listen"):
        PartyAConfig(workers_listen="no port")


def test_serve_party_a_takes_workers_and_the_others_refuse_it(monkeypatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import vesper.party_a.service as service
    from vesper.coordinator.cli import app

    served = []
    monkeypatch.setattr(service, "serve", lambda settings, ready_file: served.append(settings))
    config = tmp_path / "a.toml"
    config.write_text(f'[party_a]\nworkdir = "{tmp_path / "a"}"\nstep_timeout_s = 9\n')
    result = CliRunner().invoke(app, ["serve", "party-a", "--config", str(config), "--workers", "3"])
    assert result.exit_code == 0, result.output
    assert served[0].workers == 3 and served[0].step_timeout_s == 9
    refused = CliRunner().invoke(app, ["serve", "party-b", "--workers", "2"])
    assert refused.exit_code == 2 and "--workers is party A's setting" in refused.output.replace("\n", "")
    assert CliRunner().invoke(app, ["serve", "party-a", "--workers", "0"]).exit_code == 2


def test_demo_hands_party_a_its_workers() -> None:
    from vesper.coordinator.cli.runs import own_data

    assert own_data(None, None) == {} and own_data(None, None, 2) == {"party_a": {"workers": 2}}
    both = own_data(Path("a"), Path("b"), 2)
    assert both["party_a"]["workers"] == 2 and "workers" not in both["party_b"]


def test_a_worker_started_by_hand_joins_run_after_run(dataset: Path, tmp_path: Path) -> None:
    """The several-hosts form on loopback: party_a.workers_listen, and a worker started with --forever
    that serves one run's group, then the next one's."""
    import subprocess
    import sys

    from vesper.party_a.workers.group import free_port

    address = f"127.0.0.1:{free_port()}"
    worker = subprocess.Popen([
        sys.executable, "-m", "vesper.party_a.workers", "--init", f"tcp://{address}", "--rank", "1", "--world", "2",
        "--timeout-s", "60", "--forever",
    ])
    try:
        config = config_for("pmp-gin")
        settings = PartyAConfig(workers=2, workers_listen=address, step_timeout_s=10, peer_retry_s=0)
        setup = WorkerSetup(run_config_json=config.model_dump_json(), dataset=dataset, device="cpu", delta=1e-6)
        for _ in range(2):
            single, _ = build(config, dataset)
            double, initial = build(config, dataset)
            group = WorkerGroup.start(settings, setup, initial, None)
            try:
                assert group.processes == []  # party A started none of its own
                roots = torch.arange(0, 60, 3)
                with torch.no_grad():
                    expected = single.eval().release(roots, "eval")
                    got = DistributedExtractor(double.eval(), group).release(roots, "eval")
                assert torch.allclose(got, expected, atol=1e-5)
            finally:
                group.close()
        assert worker.poll() is None  # still there for the next run
    finally:
        worker.terminate()
        worker.wait(timeout=30)
