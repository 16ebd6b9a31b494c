"""One run at party B: decoder, optimiser, loss and metrics [VESPER, Alg. 3, lines 11-16]."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from vesper.common.config import DecoderConfig, LabelPrivacyConfig, OptimizerConfig
from vesper.common.optim import build_optimizer, carry_state
from vesper.common.seeded_init import seeded
from vesper.common.wire import WireDType, node_mask
from vesper.party_b.decoders import HEADS, FallbackDecoder, build_decoder
from vesper.party_b.head_choice import BASE_HEAD, choose_head
from vesper.party_b.label_data import LabelStore
from vesper.party_b.label_guard import LabelGuard
from vesper.party_b.metrics import compute_metric
from vesper.party_b.release_record import ReleaseRecord
from vesper.party_b.seeded_dropout import dropout_states, restore_dropout_states

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")


def checkpoint_steps(directory: Path) -> list[int]:
    matches = (_CHECKPOINT.match(path.name) for path in directory.glob("checkpoint-*.pt"))
    return sorted(int(m.group(1)) for m in matches if m)


@dataclass
class SplitScores:
    """One split's nodes and, per chunk, each head's logits (one head: ``model``)."""

    node_ids: list[torch.Tensor] = field(default_factory=list)
    logits: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def add(self, ids: torch.Tensor, logits: dict[str, torch.Tensor]) -> None:
        self.node_ids.append(ids)
        for head, values in logits.items():
            self.logits.setdefault(head, []).append(values.cpu())


@dataclass(frozen=True)
class Evaluation:
    """B's answer to an evaluation pass: (split, metric, value, count) of the model B keeps,
    and, with an edge-free path, which head that is and every head's values."""

    results: list[tuple[str, str, float, int]]
    chosen: str = ""
    heads: dict[str, list[tuple[str, str, float, int]]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)  # party_b.head_choice.HeadChoice.errors

    @property
    def head(self) -> str:
        """The key of the kept model's logits in :meth:`LabelSession.logits`."""
        return self.chosen or "model"


class LabelSession:
    """State of one run at B. Not thread-safe by itself: the service holds ``lock``."""

    def __init__(
        self,
        run_id: str,
        store: LabelStore,
        decoder: DecoderConfig,
        optimizer: OptimizerConfig,
        dim: int,
        layers: int,
        wire_dtype: WireDType,
        seed: int,
        device: torch.device,
        guard: LabelGuard | None = None,
        edge_free_layers: int = 0,
    ) -> None:
        self.run_id = run_id
        self.store = store
        # no guard: the true labels, as under label_privacy.mode none
        self.guard = guard or LabelGuard(run_id, LabelPrivacyConfig(), store, torch.Generator())
        self.dim, self.layers, self.wire_dtype = dim, layers, wire_dtype
        self.device = device
        with seeded(seed):
            self.decoder = build_decoder(decoder, dim, layers, store.num_classes, edge_free_layers).to(device)
        self.optimizer = build_optimizer(optimizer, self.decoder.parameters())
        self.labels = store.labels.to(device)  # the truth, for metrics on held-out nodes only
        self.split_masks = {}
        for name in ("val", "test"):
            self.split_masks[name] = node_mask(torch.from_numpy(getattr(store.split, name)), store.num_nodes)
        self.record: ReleaseRecord | None = None  # audited runs: what B received (docs/audit.md)
        self.served = None  # party_b.prediction.ServedRun: what serving the finished run needs
        self.next_step = 0
        self.lock = threading.Lock()
        self.streaming = False
        self.finished = False

    @property
    def train_mask(self) -> torch.Tensor:
        """The roots B trains on: its labelled nodes, or (pate) the answered queries."""
        return self.guard.train_mask

    def train_step(self, node_ids: torch.Tensor, embeddings: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Decode, compute the loss [VESPER, eq. 37], update the decoder, return dLoss/dEmbeddings [VESPER, eq. 38].

        The loss reads the guard's training labels: the truth, randomised response's
        privatised labels, or the teachers' answers (docs/label-privacy.md).
        """
        self.decoder.train()
        received = embeddings.detach().to(self.device).requires_grad_(True)
        targets = self.guard.train_labels[node_ids].to(self.device)
        # with an edge-free path both heads learn, each from its own loss (party_b.decoders.FallbackDecoder)
        losses = [F.cross_entropy(logits, targets) for logits in self.head_logits(received).values()]
        loss = sum(losses)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.next_step += 1
        return received.grad.detach(), float(loss.detach()) / len(losses)  # reported: the heads' mean

    def head_logits(self, embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each head's logits: those of HEADS with an edge-free path, else ``model``."""
        if isinstance(self.decoder, FallbackDecoder):
            return dict(zip(HEADS, self.decoder.heads(embeddings), strict=True))
        return {"model": self.decoder(embeddings)}

    @torch.no_grad()
    def evaluate(self, scores: dict[str, SplitScores]) -> Evaluation:
        """(split, metric name, value, number of nodes) for each split A sent, of the model B keeps.

        With an edge-free path B keeps the edge-free head unless another leads it on the
        validation nodes by more than the paired noise there (party_b.head_choice), and serves
        predictions with the head it keeps.
        """
        per_head: dict[str, list[tuple[str, str, float, int]]] = {}
        validation: dict[str, torch.Tensor] = {}  # each head's logits of the validation nodes
        validation_truth = torch.empty(0)
        for split, collected in scores.items():
            ids = torch.cat(collected.node_ids)
            truth = self.labels[ids.to(self.device)]
            if split == "val":
                validation_truth = truth
            for head, chunks in collected.logits.items():
                logits = torch.cat(chunks).to(self.device)
                value = compute_metric(self.store.metric, logits, truth)
                per_head.setdefault(head, []).append((split, self.store.metric, value, int(ids.numel())))
                if split == "val":
                    validation[head] = logits
        if not isinstance(self.decoder, FallbackDecoder):
            return Evaluation(per_head.get("model", []))
        chosen, errors = BASE_HEAD, {}  # without validation nodes in the pass nothing shows another head better
        if validation:
            metrics = {head: {r[0]: r[2] for r in rows}["val"] for head, rows in per_head.items()}
            choice = choose_head(self.store.metric, validation_truth, validation, metrics)
            chosen, errors = choice.head, choice.errors
        self.decoder.choose(chosen)
        return Evaluation(per_head[chosen], chosen, per_head, errors)

    @torch.no_grad()
    def logits(self, embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each head's logits of received embeddings, in evaluation mode (:meth:`head_logits`)."""
        self.decoder.eval()
        return self.head_logits(embeddings.to(self.device))

    def start_edge_free_head(self, stage: LabelSession) -> bool:
        """Start the edge-free head from ``stage``'s decoder, optimiser state and dropout stream: the session of
        A's edge-free path's own stage, which trained the same architecture on the same L_f
        slices (party_a.extractors.edge_free_path). The head then goes on training as the MLP
        baseline's decoder would have, for the stage's epochs and the run's in all.

        False, changing nothing, once this session has trained a step (a resumed session keeps
        its checkpoint). ValueError: another run's session, no edge-free head here, or another
        architecture there.
        """
        if not stage.run_id.startswith(self.run_id + "."):
            raise ValueError(
                f"session {stage.run_id} is not a stage of run {self.run_id}: only a run's own stage can start its "
                "edge-free head"
            )
        if not isinstance(self.decoder, FallbackDecoder):
            raise ValueError(f"session {self.run_id} has no edge-free head (it was set up without edge_free_layers)")
        if self.next_step:
            return False
        head = self.decoder.edge_free
        theirs = stage.decoder.state_dict()
        if {k: v.shape for k, v in theirs.items()} != {k: v.shape for k, v in head.state_dict().items()}:
            raise ValueError(
                f"session {stage.run_id}'s decoder is not the edge-free head of {self.run_id} "
                f"(its {stage.layers} slices of width {stage.dim}; the head reads {self.decoder.edge_free_layers} "
                f"of width {self.dim})"
            )
        head.load_state_dict(theirs)
        carry_state(self.optimizer, stage.optimizer, zip(head.parameters(), stage.decoder.parameters(), strict=True))
        # and its dropout masks go on from where the stage's stream stands, as the MLP baseline's would
        restore_dropout_states(head, dropout_states(stage.decoder), self.device)
        return True

    # -- checkpoints (docs/faults.md): B's half of a resumable run ----------------------------
    def save_checkpoint(self, directory: Path, keep: int = 2) -> None:
        """After ``next_step`` steps: decoder, optimiser and dropout stream, written atomically;
        the newest ``keep`` are kept (A's newest is one of them: A saves after B answers)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"checkpoint-{self.next_step}.pt"
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as handle:
            torch.save({
                "step": self.next_step, "decoder": self.decoder.state_dict(),
                "optimizer": self.optimizer.state_dict(), "dropout": dropout_states(self.decoder),
            }, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
        for old in checkpoint_steps(directory)[:-keep]:
            (directory / f"checkpoint-{old}.pt").unlink(missing_ok=True)

    def restore_checkpoint(self, directory: Path, step: int) -> None:
        path = directory / f"checkpoint-{step}.pt"
        if not path.exists():
            held = ", ".join(map(str, checkpoint_steps(directory))) or "none"
            raise FileNotFoundError(
                f"party B has no checkpoint of run {self.run_id} after step {step} (it holds: {held})"
            )
        saved = torch.load(path, map_location=self.device, weights_only=False)
        self.decoder.load_state_dict(saved["decoder"])
        self.optimizer.load_state_dict(saved["optimizer"])
        restore_dropout_states(self.decoder, saved["dropout"], self.device)
        self.next_step = saved["step"]

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"decoder": self.decoder.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.next_step},
            directory / "decoder.pt",
        )
