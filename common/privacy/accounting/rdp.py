"""Rényi DP: dp-accounting's RDP accountant over vesper's orders, one curve per mechanism.

Used by the ``rdp`` accountant, by ``pld`` for zCDP events (``rdp-zcdp``) and as the
PLD ladder's last rung (``rdp-fallback``), and by calibration to bracket z cheaply.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache

import dp_accounting as dpa
import numpy as np
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from vesper.common.privacy.events import event_from_json, event_to_json

# Fractional orders 1.1, 1.2, ..., 10.9 (dp-accounting's default grid without the
# integers) plus every integer 2..256. The fractional orders matter: for the privacy
# contract's hidden-batch run the optimum is α = 4.7 (z = 0.69) and 3.1 (z = 0.56), and
# integers alone give ε = 4.17 instead of 4.01 at z = 0.69.
RDP_FRACTIONAL_ORDERS: tuple[float, ...] = tuple(1 + k / 10 for k in range(1, 100) if k % 10)
RDP_ORDERS: tuple[float, ...] = tuple(sorted(RDP_FRACTIONAL_ORDERS + tuple(float(a) for a in range(2, 257))))
# A sparse subset of RDP_ORDERS used only to *search* during calibration: the RDP of a
# Poisson-sampled Gaussian has α + 1 terms at integer α and a slowly converging series at
# fractional orders near 1, so the full set costs far more per evaluation than this one
# (docs/accounting.md, docs/performance-notes.md). Final numbers always use RDP_ORDERS.
_RDP_SKELETON_ORDERS: tuple[float, ...] = (
    1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0,
)


class _ExcludedOrderFilter(logging.Filter):
    """Hide dp-accounting's warning that it dropped a fractional Rényi order.

    Its series for a fractional order can fail to converge (e.g. q = 0.1, z = 1, α < 2);
    it then logs a warning and gives that order ε = ∞, so the minimum over the other
    orders is still an upper bound. Calibration walks through such z on purpose.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "_compute_log_a_frac failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_ExcludedOrderFilter())


def _rdp(event: dpa.DpEvent, delta: float, orders: Sequence[float]) -> tuple[float, float]:
    """(ε, optimal order) from dp-accounting's RDP of ``event`` over ``orders``.

    RDP composes additively, so the curve of SelfComposed(e, n) is n times e's curve:
    each distinct mechanism's curve is computed once (:func:`_mechanism_rdp`) and a
    ledger charge at count k costs a multiplication, not a new series evaluation.
    Raises ValueError for events the RDP accountant cannot account for (Laplace).
    """
    curve = _rdp_curve(event, tuple(orders))
    epsilon, order = rdp_privacy_accountant.compute_epsilon(list(orders), curve, delta)
    return float(epsilon), float(order)


def _rdp_curve(event: dpa.DpEvent, orders: tuple[float, ...]) -> np.ndarray:
    if isinstance(event, dpa.SelfComposedDpEvent):
        return event.count * _rdp_curve(event.event, orders) if event.count else np.zeros(len(orders))
    if isinstance(event, dpa.ComposedDpEvent):
        return sum((_rdp_curve(part, orders) for part in event.events), np.zeros(len(orders)))
    return _mechanism_rdp(event_to_json(event), orders)


def _rdp_accountant_for(mechanism: dpa.DpEvent, orders: Sequence[float]) -> rdp_privacy_accountant.RdpAccountant:
    """dp-accounting's RDP accountant for one mechanism, under the relation it can account it in.

    dp-accounting has randomised response only under REPLACE_ONE (and REPLACE_SPECIAL), and
    everything else vesper uses under ADD_OR_REMOVE_ONE. Adding the curves of both is still
    one correct composition: an unsampled Gaussian's (and Laplace's, and a zCDP event's) RDP
    curve is a function of its noise multiplier alone, the same under either relation, and
    every event of a label ledger states its noise multiplier for the sensitivity under
    "replace one label" (docs/label-privacy.md). Sampled events are refused in label ledgers
    (ledger.check_label_events), because Poisson amplification is an add-or-remove result.
    """
    relation = (
        NeighboringRelation.REPLACE_ONE
        if isinstance(mechanism, dpa.RandomizedResponseDpEvent)
        else NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    return rdp_privacy_accountant.RdpAccountant(orders=list(orders), neighboring_relation=relation)


@lru_cache(maxsize=1024)
def _mechanism_rdp(event_json: str, orders: tuple[float, ...]) -> np.ndarray:
    mechanism = event_from_json(event_json)
    accountant = _rdp_accountant_for(mechanism, orders)
    try:
        accountant.compose(mechanism)
    except dpa.UnsupportedEventError as exc:
        raise ValueError(f"the RDP accountant cannot account for this event: {exc}") from None
    curve = np.array(accountant._rdp, dtype=np.float64)  # dp-accounting 0.6.0 keeps the curve here
    curve.setflags(write=False)
    return curve


def _rdp_supports(event: dpa.DpEvent) -> bool:
    """Whether :func:`_rdp` can account ``event``, each mechanism under its own relation."""
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _rdp_supports(event.event)
    if isinstance(event, dpa.ComposedDpEvent):
        return all(_rdp_supports(part) for part in event.events)
    return _rdp_accountant_for(event, _RDP_SKELETON_ORDERS).supports(event)
