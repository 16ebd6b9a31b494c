"""Walks over a DpEvent's composition tree that several accountants share."""

from __future__ import annotations

import dp_accounting as dpa


def _contains(event: dpa.DpEvent, leaf: type[dpa.DpEvent]) -> bool:
    """Whether ``event`` has a leaf of type ``leaf`` anywhere in its composition tree."""
    if isinstance(event, leaf):
        return True
    if isinstance(event, (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent)):
        return _contains(event.event, leaf)
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_contains(e, leaf) for e in event.events)
    return False


def _contains_zcdp(event: dpa.DpEvent) -> bool:
    """Whether ``event`` has a ZCDpEvent leaf (the PLD accountant cannot represent one)."""
    return _contains(event, dpa.ZCDpEvent)


def _contains_non_private(event: dpa.DpEvent) -> bool:
    return _contains(event, dpa.NonPrivateDpEvent)
