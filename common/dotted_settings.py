"""Settings named by a dotted path (``extractor.name``, ``privacy.edge_bound``): set one in a
plain dict before validation, or ask whether a validated model was given it explicitly."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data['a']['b'] = value`` for ``dotted='a.b'``, creating sections as needed."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[leaf] = value


def is_set(model: BaseModel, dotted: str) -> bool:
    """Whether the dotted setting was given explicitly, as a TOML key or a flag (each section on
    its path, then the key), not filled in by a default."""
    *sections, leaf = dotted.split(".")
    for name in sections:
        if name not in model.model_fields_set:
            return False
        model = getattr(model, name)
    return leaf in model.model_fields_set
