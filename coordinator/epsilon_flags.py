"""Budgets on a benchmark's command line: each flag a positive number or 'inf'."""

from __future__ import annotations

import math
from collections.abc import Sequence

import typer


def parse_epsilons(texts: Sequence[str], param_hint: str = "--epsilon", what: str = "ε") -> list[float]:
    """The budgets of repeated flags, in order, each once (typer.BadParameter names a bad one)."""
    values = []
    for text in texts:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number or inf", param_hint=param_hint) from None
        if math.isnan(value) or value <= 0:
            raise typer.BadParameter(f"{text!r}: {what} must be > 0 (or inf)", param_hint=param_hint)
        values.append(value)
    return list(dict.fromkeys(values))
