"""A prediction pass of a finished run (docs/privacy.md, section 2.4; `vesper predict`).

The pass releases every node party B may name (an aligned dataset's shared index, else the
whole graph), each once, in chunks of ``eval_chunk``, to B's ``Predict``; B keeps its
decoder's class probabilities for every node and serves scores from them. Each chunk is
charged as a ``predict`` release before it leaves A, like training:

* extractors whose evaluation releases are post-processing (GAP's hops, relational's encoder,
  the MLP) serve the run's already-charged releases again: the ``predict`` rule is a no-op;
* per-step extractors release afresh, with noise from generators of the pass's own, under
  the evaluation rule; the run must have reserved the pass in its budget
  (``privacy.prediction_passes``), and a request beyond the reservation is refused before
  anything is charged or sent.

Everything is read from A's disk (``runs/<id>/``: the resume record, ``extractor.pt`` with
the serving state), so a pass works after party A restarts.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import dp_accounting as dpa
import torch
from pydantic import BaseModel

from vesper.common.config import PartyAConfig, RunConfig, RunSummary
from vesper.common.metrics import NO_COUNTERS, RunCounters
from vesper.common.privacy.events import event_from_json
from vesper.party_a.extractors.base import Extractor, ExtractorSetup
from vesper.party_a.extractors.edge_free_path import build_extractor, recorded_run_config
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.peers import AccountantClient, LabelPartyClient
from vesper.party_a.run.charger import WriteAheadCharger
from vesper.party_a.run.checkpoint_files import RunFiles
from vesper.party_a.run.graph_data import GraphData
from vesper.party_a.run.lease import LeaseKeeper
from vesper.party_a.run.progress import ProgressEvent, Report
from vesper.party_a.run.release import Release
from vesper.party_a.run.secrets import SecretGenerators, prediction_label
from vesper.proto.v1 import label_party_pb2 as lp_pb

PREDICTIONS_FILE = "predictions.json"  # runs/<id>/: the passes begun, written before the first charge


class PredictionError(ValueError):
    """The run cannot be served (named reason); nothing was charged or sent."""


class PredictionReport(BaseModel):
    """What the coordinator is told of a pass."""

    run_id: str
    pass_index: int
    nodes: int
    charged: bool  # False: the releases were post-processing (a no-op rule)
    epsilon_spent: float
    seconds: float


def _finished_run(run_dir: Path) -> tuple[RunConfig, dict, dict]:
    """The run's settings, its resume record and its saved model; PredictionError unless it completed."""
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        raise PredictionError(f"party A has no finished run {run_dir.name} ({summary_file} is missing)")
    summary = RunSummary.model_validate_json(summary_file.read_text())
    if summary.status != "completed":
        raise PredictionError(f"run {run_dir.name} is {summary.status}: only a completed run predicts")
    record = RunFiles(run_dir).load_start()
    config = recorded_run_config(record["config"])
    audit = config.audit
    if audit.canaries or audit.membership or audit.record_releases:
        raise PredictionError(f"run {run_dir.name} is an audit run (its graph carried canaries or a subgraph): no prediction")
    model_file = run_dir / "extractor.pt"
    if not model_file.is_file():
        raise PredictionError(f"run {run_dir.name} has no saved model ({model_file})")
    saved = torch.load(model_file, map_location="cpu", weights_only=False)  # A's own file
    if "serving" not in saved:
        raise PredictionError(f"run {run_dir.name} was trained before prediction existed: train it again")
    return config, record, saved


def _passes_begun(run_dir: Path) -> int:
    path = run_dir / PREDICTIONS_FILE
    return int(json.loads(path.read_text())["passes"]) if path.is_file() else 0


def _check_affordable(config: RunConfig, release: Release, begun: int, run_id: str) -> bool:
    """Whether the pass is charged at all; PredictionError when the run reserved no pass for it."""
    try:
        event = event_from_json(release.event_json("predict"))
    except ValueError:
        raise PredictionError(f"run {run_id} has no prediction rule (trained before prediction existed)") from None
    if isinstance(event, dpa.NoOpDpEvent):
        return False
    reserved = config.privacy.prediction_passes
    if begun >= reserved:
        raise PredictionError(
            f"run {run_id} reserved {reserved} prediction pass{'es' if reserved != 1 else ''} in its budget and "
            f"{begun} {'was' if begun == 1 else 'were'} made: its {config.extractor.name} releases are charged, so "
            "another pass would exceed what the run was calibrated for. Train a run with --prediction-passes N"
        )
    return True


class PredictionPass:
    def __init__(
        self, run_id: str, settings: PartyAConfig, data: GraphData, label_party: LabelPartyClient,
        accountant: AccountantClient, report: Report = lambda event: None, counters: RunCounters = NO_COUNTERS,
    ) -> None:
        """``counters``: party A's /metrics of the run, where the pass's releases are counted."""
        self.run_id = run_id
        self.counters = counters
        self.settings = settings
        self.data = data
        self.label_party = label_party
        self.accountant = accountant
        self.report = report
        self.run_dir = settings.workdir / "runs" / run_id
        self.config, self.record, self.saved = _finished_run(self.run_dir)
        self.release: Release = self.record["release"]
        spec = lookup(self.config.extractor.name).spec
        if spec.no_prediction:
            raise PredictionError(f"{spec.name} cannot predict: {spec.no_prediction}")
        self.pass_index = _passes_begun(self.run_dir)
        self.charged = _check_affordable(self.config, self.release, self.pass_index, run_id)

    def _extractor(self) -> Extractor:
        """The run's model on A's graph, with the pass's own secret generators."""
        cls = lookup(self.config.extractor.name)
        device = self.data.features.device
        generators = SecretGenerators(self.settings, self.config.seed, device, label=prediction_label(self.pass_index))
        extractor = build_extractor(cls, ExtractorSetup(
            config=self.config, params=validated_params(cls.spec, self.config), graph=self.data.graph,
            features=self.data.features, device=device, sampling_generator=generators.sampling,
            noise_generator=generators.noise, delta=self.record["delta"],
            # the edge-free layers' stream as the run had it (its state comes with the saved model)
            edge_free_key=generators.edge_free if self.record.get("edge_free") is not None else None,
        ))
        extractor.load_state_dict(self.saved["extractor"])
        extractor.load_serving_state(self.saved["serving"])
        extractor.bind(self.release.noise_multiplier)
        extractor.train(False)
        return extractor

    def execute(self) -> PredictionReport:
        started = time.monotonic()
        extractor = self._extractor()
        # written before the first charge: a pass that stops half-way is never begun again under its index
        (self.run_dir / PREDICTIONS_FILE).write_text(json.dumps({"passes": self.pass_index + 1}) + "\n")
        self.accountant.hold(uuid.uuid4().hex, self.settings.lease_s)
        keeper = LeaseKeeper(self.accountant, self.run_id, self.settings.lease_s).start()
        charger = WriteAheadCharger(
            self.accountant, self.run_id, RunFiles(self.run_dir).journal(keep_sent=False), self.config,
            self.data.features.device,
            self.report, self.counters,
        )
        try:
            reply = self._release_all(extractor, charger)
        finally:
            keeper.stop()
        return PredictionReport(
            run_id=self.run_id, pass_index=self.pass_index, nodes=reply.nodes, charged=self.charged,
            epsilon_spent=charger.epsilon_spent, seconds=round(time.monotonic() - started, 3),
        )

    @torch.no_grad()
    def _release_all(self, extractor: Extractor, charger: WriteAheadCharger) -> lp_pb.PredictReply:
        """Every node B may name, chunk by chunk: charged, then sent."""
        stream = self.label_party.prediction()
        pass_id = f"predict-{self.pass_index}"
        chunks = torch.arange(self.data.shared_nodes).split(self.config.eval_chunk)
        try:
            for index, chunk in enumerate(chunks):
                self.report(ProgressEvent("predict", step=index + 1, total_steps=len(chunks),
                                          epsilon_spent=charger.epsilon_spent, message="prediction pass"))
                _, message = charger.charged_release(
                    lambda nodes: extractor.release(nodes, "eval"), chunk, self.release, pass_id, "predict", index,
                )
                stream.send(lp_pb.EvalChunk(
                    run_id=self.run_id, eval_id=self.pass_index, split="predict", node_ids=chunk.tolist(),
                    embeddings=message,
                ))
            return stream.result()
        except BaseException:
            stream.cancel()
            raise
