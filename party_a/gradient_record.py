"""What party A keeps of the gradients B sends, when a run asks for it (``record_gradients``).

The label-leakage measurement (auditor/label_attack.py, docs/label-leakage.md) plays a
curious party A: it reads exactly these tensors. Only the first and the last training
epoch are kept, one gradient per root (the latest if a root recurs within an epoch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class GradientRecord:
    def __init__(self, epochs: int, num_classes: int) -> None:
        self.epochs = epochs
        self.num_classes = num_classes
        self._parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"first": [], "last": []}

    def add(self, epoch: int, node_ids: torch.Tensor, gradient: torch.Tensor) -> None:
        flat = gradient.detach().reshape(gradient.shape[0], -1).to("cpu", torch.float32)
        ids = node_ids.detach().to("cpu", torch.int64)
        if epoch == 0:
            self._parts["first"].append((ids, flat))
        if epoch == self.epochs - 1:
            self._parts["last"].append((ids, flat))

    @staticmethod
    def _latest(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per node, its gradient from the latest batch that had it as a root; sorted by id."""
        ids = torch.cat([p[0] for p in parts])
        grads = torch.cat([p[1] for p in parts])
        order = torch.arange(ids.numel())
        # the last occurrence of each id wins: sort by (id, position) and keep each id's final row
        key = ids * (ids.numel() + 1) + order
        sorted_key, perm = torch.sort(key)
        sorted_ids = ids[perm]
        keep = torch.ones_like(sorted_ids, dtype=torch.bool)
        keep[:-1] = sorted_ids[1:] != sorted_ids[:-1]
        return sorted_ids[keep], grads[perm][keep]

    def save(self, path: Path) -> None:
        if not self._parts["last"]:
            return  # no training step reached B's gradients (e.g. pate with no answered query)
        ids, last = self._latest(self._parts["last"])
        first = torch.full_like(last, float("nan"))
        if self._parts["first"]:
            first_ids, first_grads = self._latest(self._parts["first"])
            position = torch.searchsorted(ids, first_ids)
            inside = (position < ids.numel()) & (ids[position.clamp(max=ids.numel() - 1)] == first_ids)
            first[position[inside]] = first_grads[inside]
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            path, node_ids=ids.numpy(), gradients=last.numpy(), first_gradients=first.numpy(),
            num_classes=np.int64(self.num_classes),
        )
