"""Party B's side of prediction (docs/privacy.md, section 2.4; `vesper predict`).

When a run finishes B saves what serving it needs beside its decoder (``served.json``: the
dataset, the split seed, the decoder's shape). A prediction pass streams the embeddings of
every node B may name; B decodes them with the run's decoder and keeps the class
probabilities (``predictions.npz``). Scores are then read from those probabilities, by key:
an aligned dataset's keys (``keys.parquet`` of the alignment), else the node ids as text.
Everything here is post-processing of releases A already charged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from pydantic import BaseModel

from vesper.common.config import DecoderConfig
from vesper.common.npz_files import read_npz
from vesper.common.stores import LABEL_FILE
from vesper.common.wire import WireDType, WireError, decode_tensor, validate_node_ids
from vesper.party_b.decoders import build_decoder
from vesper.party_b.errors import BadRequest, Refused, UnknownRun
from vesper.party_b.label_data import LabelStore
from vesper.proto.v1 import label_party_pb2 as pb

SERVED_FILE = "served.json"
PREDICTIONS_FILE = "predictions.npz"
ROWS_PER_MESSAGE = 4096


class ServedRun(BaseModel):
    """What B needs to serve a finished run (``runs/<id>/served.json``)."""

    run_id: str
    dataset: str
    split_seed: int
    label_independent: bool
    decoder: DecoderConfig
    dim: int
    layers: int
    wire_dtype: WireDType
    num_classes: int
    edge_free_layers: int = 0  # the last slices A's edge-free path fills (a FallbackDecoder serves its chosen head)

    def save(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SERVED_FILE).write_text(self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> ServedRun:
        path = run_dir / SERVED_FILE
        if not path.is_file():
            raise UnknownRun(f"party B has no finished run {run_dir.name} to serve ({path} is missing)")
        return cls.model_validate_json(path.read_text())


def decoder_of(served: ServedRun, run_dir: Path, device: torch.device) -> torch.nn.Module:
    """The run's decoder, as it was when the run finished."""
    decoder = build_decoder(
        served.decoder, served.dim, served.layers, served.num_classes, served.edge_free_layers,
    ).to(device)
    decoder.load_state_dict(torch.load(run_dir / "decoder.pt", map_location=device, weights_only=False)["decoder"])
    return decoder.eval()


@torch.no_grad()
def collect_predictions(
    served: ServedRun, run_dir: Path, num_nodes: int, chunks: Iterator[pb.EvalChunk], device: torch.device,
    max_elements: int,
) -> pb.PredictReply:
    """Decode a prediction pass's chunks; every node once, all of them; keep the probabilities."""
    decoder = decoder_of(served, run_dir, device)
    probabilities = np.zeros((num_nodes, served.num_classes), dtype=np.float32)
    seen = torch.zeros(num_nodes, dtype=torch.bool)
    pass_index = None
    for chunk in chunks:
        if chunk.run_id != served.run_id or chunk.split != "predict" or pass_index not in (None, chunk.eval_id):
            raise BadRequest("a prediction stream carries one run's chunks of split 'predict' and one pass")
        pass_index = chunk.eval_id
        try:
            ids = validate_node_ids(chunk.node_ids, name="prediction nodes", num_nodes=num_nodes)
            embeddings = decode_tensor(
                chunk.embeddings, name="embeddings", expected_shape=(ids.numel(), served.dim, served.layers),
                expected_dtype=served.wire_dtype, max_elements=max_elements,
            )
        except WireError as exc:
            raise BadRequest(str(exc)) from None
        if bool(seen[ids].any()):
            raise BadRequest("a node sent twice in one prediction pass")
        seen[ids] = True
        probabilities[ids.numpy()] = torch.softmax(decoder(embeddings.to(device).float()), dim=-1).cpu().numpy()
    if pass_index is None or not bool(seen.all()):
        raise BadRequest(f"the prediction pass covers {int(seen.sum())} of the {num_nodes} nodes: every node is needed")
    tmp = run_dir / (PREDICTIONS_FILE + ".tmp")
    with tmp.open("wb") as handle:
        np.savez(handle, probabilities=probabilities, pass_index=np.int64(pass_index))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(run_dir / PREDICTIONS_FILE)
    return pb.PredictReply(run_id=served.run_id, nodes=num_nodes, pass_index=pass_index)


def node_keys(dataset_file: Path, num_nodes: int) -> list[str]:
    """The key of each node: an aligned dataset's keys, else the node id as text."""
    keys_file = dataset_file.parent / "keys.parquet"
    if dataset_file.name == LABEL_FILE and keys_file.is_file():
        return pq.read_table(keys_file, columns=["key"]).column("key").to_pylist()
    return [str(node) for node in range(num_nodes)]


def select_rows(request: pb.ScoresRequest, keys: list[str], store: LabelStore) -> np.ndarray:
    """The node ids a request selects, in its order; a key outside the run's dataset is refused by name."""
    if request.select == "all":
        return np.arange(len(keys), dtype=np.int64)
    if request.select == "unlabelled":
        return np.flatnonzero(store.labels.numpy() < 0).astype(np.int64)
    if request.select != "keys":
        raise BadRequest(f"select must be keys, all or unlabelled, got {request.select!r}")
    position = {key: node for node, key in enumerate(keys)}
    unknown = [key for key in request.keys if key not in position]
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise Refused(
            f"{len(unknown)} of the {len(request.keys)} keys are not in the run's dataset (its shared index with "
            f"party A): {shown}. Only keys of the intersection can be scored"
        )
    if len(set(request.keys)) != len(request.keys):
        raise BadRequest("a key is requested twice")
    return np.asarray([position[key] for key in request.keys], dtype=np.int64)


def stored_probabilities(run_dir: Path) -> np.ndarray | None:
    path = run_dir / PREDICTIONS_FILE
    if not path.is_file():
        return None
    return read_npz(path)["probabilities"]


def score_rows(
    rows: np.ndarray, keys: list[str], probabilities: np.ndarray, class_names: tuple[str, ...],
) -> Iterator[pb.ScoreRows]:
    """The selected rows, ROWS_PER_MESSAGE at a time; the first message names the classes."""
    if probabilities.shape[1] != len(class_names):
        raise Refused(f"the stored probabilities have {probabilities.shape[1]} classes, the labels {len(class_names)}")
    for start in range(0, max(rows.size, 1), ROWS_PER_MESSAGE):
        part = rows[start : start + ROWS_PER_MESSAGE]
        chosen = probabilities[part]
        yield pb.ScoreRows(
            classes=list(class_names) if start == 0 else [],
            keys=[keys[node] for node in part],
            predicted=[class_names[c] for c in chosen.argmax(axis=1)] if part.size else [],
            probabilities=chosen.reshape(-1).tolist(),
        )
