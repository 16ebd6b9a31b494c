"""Faults: party B killed mid-run, and a party B that answers nonsense or nothing."""

from __future__ import annotations

import io
import time
from pathlib import Path

import httpx
import pytest
import torch
from e2e import ledger
from fault_drill import (
    drill_cluster,
    kill_mid_run,
    ledger_rows,
    received_digests,
    received_steps,
    uninterrupted,
)
from rich.console import Console

from vesper.common.config import OptimizerConfig, PartyBConfig, RunConfig
from vesper.common.grpc_server import start_server
from vesper.common.optim import build_optimizer
from vesper.common.privacy.ledger import LedgerRow, RunRecord, replay
from vesper.common.wire import encode_tensor
from vesper.coordinator.processes import start_service, write_section
from vesper.coordinator.run_client import RunClientError, drive_run
from vesper.party_b.service import LabelPartyService
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc

pytestmark = pytest.mark.e2e
QUIET = Console(file=io.StringIO())


def _assert_replays(status_url: str, run_id: str) -> dict:
    view = ledger(status_url, run_id)
    result = replay(RunRecord.model_validate(view["run"]), [LedgerRow.model_validate(r) for r in view["rows"]])
    assert result.consistent, result.problems
    return view


@pytest.mark.slow  # a kill -9 drill (~40 s), with test_fault_drill.py's
def test_killing_party_b_mid_run_interrupts_the_run_and_resuming_it_gives_the_uninterrupted_ledger(tmp_path: Path) -> None:
    """The drill of docs/faults.md for party B (party A and the accountant: test_fault_drill.py)."""
    with drill_cluster(tmp_path / "cluster") as cluster:
        reference = uninterrupted(cluster)
        assert reference.status == "completed", reference.message
        outcome = kill_mid_run(cluster, "party-b")
        first = outcome.first
        assert first is not None and first.status == "interrupted", first
        assert "party B at" in first.message and f"vesper train --resume {first.run_id}" in first.message
        assert first.steps >= 12  # B had received 13 steps when it was killed
        assert outcome.final.status == "completed", (
            f"the resumed run: {outcome.final.message}\n--- party A ---\n{cluster.services['party-a'].log_tail(60)}"
            f"\n--- party B ---\n{cluster.services['party-b'].log_tail(30)}"
        )
        # every release B received was charged first; the resumed run re-sent some, charging none twice
        charged = ledger_rows(cluster.status_url, outcome.run_id)
        train_keys = [row[1] for row in charged if row[3] == "train"]
        assert len(train_keys) == len(set(train_keys)) == reference.steps
        received = received_steps(cluster, outcome.run_id)
        assert len(received) > reference.steps  # the steps after B's checkpoint came twice
        # ...as the same bytes each time: B learnt nothing new from a replay (docs/faults.md, section 3)
        assert all(len(sent) == 1 for sent in received_digests(cluster, outcome.run_id).values())
        assert charged == ledger_rows(cluster.status_url, reference.run_id)
        assert outcome.final.epsilon_spent == reference.epsilon_spent
        # the same model: the resumed run recomputed every release bit for bit (A's journal checks it),
        # unless a replay differed by rounding (A logs it, and sent the bytes sent before): then the
        # model may differ by that rounding
        if "differs from the one sent in its last bits" in cluster.services["party-a"].log_tail(400):
            assert outcome.final.test_metric == pytest.approx(reference.test_metric, abs=0.01)
        else:
            assert outcome.final.test_metric == reference.test_metric
        assert (tmp_path / "cluster" / "party_a" / "runs" / outcome.run_id / "releases.jsonl").exists()
        # a finished run does not resume, and the attempt leaves its ledger and its files as they were
        summary_file = tmp_path / "cluster" / "party_a" / "runs" / outcome.run_id / "summary.json"
        before = summary_file.read_bytes()
        with pytest.raises(RunClientError, match="it is completed at the accountant"):
            drive_run(cluster.party_a_address, None, QUIET, resume_run_id=outcome.run_id)
        assert ledger_rows(cluster.status_url, outcome.run_id) == charged
        assert summary_file.read_bytes() == before


def _nudge_newest_checkpoint(run_dir: Path, factor: float) -> int:
    """Scale every floating tensor of the extractor in A's newest checkpoint by ``factor``:
    what the resumed run then recomputes differs from what was sent by that much. Returns its step."""
    newest = max(run_dir.glob("checkpoint-*.pt"), key=lambda path: int(path.stem.split("-")[1]))
    checkpoint = torch.load(newest, map_location="cpu", weights_only=False)
    nudged = 0
    for name, value in checkpoint.extractor.items():
        if torch.is_tensor(value) and value.is_floating_point():
            checkpoint.extractor[name] = value * factor
            nudged += 1
    assert nudged, "the drill run's extractor has no floating state to nudge"
    torch.save(checkpoint, newest)
    return checkpoint.position.step


@pytest.mark.slow
def test_a_resume_whose_releases_differ_by_rounding_resends_the_bytes_sent_and_refuses_a_real_divergence(
    tmp_path: Path,
) -> None:
    """docs/faults.md, section 3: a recomputed release that differs from the one sent in its last
    bits (another thread schedule or memory alignment of the same math) is sent again as the bytes
    sent before, and the run completes; one that differs by more than rounding (a checkpoint that
    did not restore the run) is never sent, and the run fails naming the release."""
    with drill_cluster(tmp_path / "cluster") as cluster:
        runs = tmp_path / "cluster" / "party_a" / "runs"
        rounding = kill_mid_run(
            cluster, "party-b", before_resume=lambda run_id: _nudge_newest_checkpoint(runs / run_id, 1 + 1e-6),
        )
        assert rounding.first is not None and rounding.first.status == "interrupted", rounding.first
        assert rounding.final.status == "completed", (
            f"{rounding.final.message}\n--- party A ---\n{cluster.services['party-a'].log_tail(60)}"
        )
        steps = received_steps(cluster, rounding.run_id)
        replayed = sorted({step for step in steps if steps.count(step) > 1})
        assert replayed[:3] == [10, 11, 12], steps  # from the checkpoint after step 9, to where B died
        digests = received_digests(cluster, rounding.run_id)
        assert all(len(digests[step]) == 1 for step in replayed), digests  # the same bytes again
        assert "differs from the one sent in its last bits" in cluster.services["party-a"].log_tail(400)
        train_keys = [row[1] for row in ledger_rows(cluster.status_url, rounding.run_id) if row[3] == "train"]
        assert len(train_keys) == len(set(train_keys)) == rounding.final.steps
        assert not (runs / rounding.run_id / "sent").exists()  # completed: nothing kept for a resume

        diverged = kill_mid_run(
            cluster, "party-b", before_resume=lambda run_id: _nudge_newest_checkpoint(runs / run_id, 1.5),
        )
        assert diverged.final.status == "failed"
        assert "recomputed on resume differs from the one sent before by" in diverged.final.message
        assert "more than floating-point rounding" in diverged.final.message
        received = received_digests(cluster, diverged.run_id)
        assert all(len(sent) == 1 for sent in received.values())  # nothing different was sent


class MisbehavingLabelParty(LabelPartyService):
    """The real party B, except that its reply to one step is corrupted or never comes."""

    def __init__(self, config: PartyBConfig, fault: str, at_step: int = 2) -> None:
        super().__init__(config)
        self.fault, self.at_step = fault, at_step

    def SetupRun(self, request, context):
        reply = super().SetupRun(request, context)
        if self.fault == "overlap":  # a node in both evaluation splits would be released twice in a pass
            reply.test_ids.append(reply.val_ids[0])
        return reply

    def Train(self, request_iterator, context):
        def seen(requests):
            for request in requests:
                self.steps_seen.append(request.step)
                yield request

        self.steps_seen: list[int] = []
        for reply in super().Train(seen(request_iterator), context):
            if reply.step == self.at_step:
                if self.fault == "silent":
                    while context.is_active():  # until party A gives up and cancels
                        time.sleep(0.05)
                elif self.fault == "nan":
                    gradient = torch.zeros(list(reply.gradient.shape))
                    gradient[0, 0, 0] = float("nan")
                    reply.gradient.CopyFrom(encode_tensor(gradient, "float32"))
                elif self.fault == "shape":
                    reply.gradient.CopyFrom(encode_tensor(torch.zeros(1, 2, 3), "float32"))
                elif self.fault == "step":
                    reply.step += 7
            yield reply


@pytest.fixture(scope="module")
def misbehaving(tmp_path_factory):
    """The accountant and party A as processes, and one misbehaving party B in this process."""
    workdir = tmp_path_factory.mktemp("faults")
    write_section(workdir / "accountant.toml", "accountant", {
        "listen": "127.0.0.1:0", "rest_listen": "127.0.0.1:0", "ledger": str(workdir / "ledger.sqlite"),
        "charge_token_file": str(workdir / "charge.token"),
    })
    accountant = start_service("accountant", workdir / "accountant.toml", workdir)
    # B's first optimiser imports torch._dynamo (seconds): not inside the 3 s step timeout below
    build_optimizer(OptimizerConfig(), [torch.nn.Parameter(torch.zeros(1))])
    servicer = MisbehavingLabelParty(PartyBConfig(workdir=workdir / "b"), fault="none")
    server, port = start_server("127.0.0.1:0", [(lp_grpc.add_LabelPartyServicer_to_server, servicer, "vesper.v1.LabelParty")], 64)
    party_a = None
    try:
        accountant.wait_ready()
        write_section(workdir / "a.toml", "party_a", {
            "listen": "127.0.0.1:0", "label_party": f"127.0.0.1:{port}", "accountant": accountant.grpc_address,
            "accountant_status_url": accountant.info["rest_url"], "workdir": str(workdir / "a"), "secret_seed": 1,
            "step_timeout_s": 3.0, "accountant_token_file": str(workdir / "charge.token"),
        })
        party_a = start_service("party-a", workdir / "a.toml", workdir)
        party_a.wait_ready()
        yield servicer, party_a, accountant
    finally:
        if party_a is not None:
            party_a.stop()
        server.stop(grace=0)
        accountant.stop()


@pytest.mark.parametrize(
    "fault, fragment",
    [
        ("nan", "unusable gradient at step 2: gradient: 1 non-finite values"),
        ("shape", "unusable gradient at step 2: gradient: shape [1, 2, 3] but expected"),
        ("step", "answered run"),
        ("silent", "did not answer step 2 within 3 s"),
    ],
)
def test_a_misbehaving_party_b_ends_the_run_with_a_clear_error(misbehaving, fault: str, fragment: str) -> None:
    servicer, party_a, accountant = misbehaving
    servicer.fault = fault
    config = RunConfig.model_validate({"dataset": "cora", "extractor": {"name": "pmp-gcn"}, "epochs": 1, "privacy": {"epsilon": 8}})
    summary = drive_run(party_a.grpc_address, config, QUIET)
    # a silent B may come back: the run is interrupted (resumable); a B that answers nonsense fails it
    expected = "interrupted" if fault == "silent" else "failed"
    assert summary.status == expected and fragment in summary.message, summary.message
    view = _assert_replays(accountant.info["rest_url"], summary.run_id)
    assert view["run"]["status"] == expected
    # steps 0, 1, 2 were charged and sent; nothing after the fault (step 3's charge is started
    # ahead only once B has answered step 2 well)
    assert [row["release_key"] for row in view["rows"]] == [f"train-0/{i}" for i in range(3)]
    assert max(servicer.steps_seen) == 2


def test_overlapping_evaluation_splits_are_refused_before_anything_is_charged(misbehaving) -> None:
    servicer, party_a, accountant = misbehaving
    servicer.fault = "overlap"
    config = RunConfig.model_validate({"dataset": "cora", "extractor": {"name": "pmp-gcn"}, "epochs": 1, "privacy": {"epsilon": 8}})
    summary = drive_run(party_a.grpc_address, config, QUIET)
    assert summary.status == "failed" and "val and test splits overlap" in summary.message, summary.message
    assert summary.steps == 0 and summary.epsilon_spent == 0
    response = httpx.get(f"{accountant.info['rest_url']}/v1/runs/{summary.run_id}", timeout=10)
    assert response.status_code == 404  # the run never reached the accountant
