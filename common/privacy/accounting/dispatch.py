"""ε of a DpEvent at δ: one table from accountant name to accountant, and its cache.

:data:`ACCOUNTANTS` is the only place an :data:`AccountantName` is turned into code; what
each accountant does, and the names its results carry, are in the package docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import get_args

import dp_accounting as dpa

from vesper.common.privacy.accounting.gaussian import _gaussian_precision, gaussian_epsilon
from vesper.common.privacy.accounting.pld import _pld_epsilon, _single_pld
from vesper.common.privacy.accounting.randomized_response import (
    _lone_randomized_response,
    randomized_response_epsilon,
)
from vesper.common.privacy.accounting.rdp import RDP_ORDERS, _mechanism_rdp, _rdp
from vesper.common.privacy.accounting.result import EpsilonResult
from vesper.common.privacy.accounting.structure import _contains_non_private, _contains_zcdp
from vesper.common.privacy.events import event_from_json, event_to_json
from vesper.common.privacy.names import AccountantName


def _pld_accountant(event: dpa.DpEvent, delta: float) -> EpsilonResult:
    """``"pld"``: rr-exact, gaussian-exact, the PLD ladder, or rdp-zcdp (package docstring)."""
    lone_rr = _lone_randomized_response(event)
    if lone_rr is not None:
        return EpsilonResult(randomized_response_epsilon(lone_rr.noise_parameter, lone_rr.num_buckets), "rr-exact")
    precision = _gaussian_precision(event)
    if precision is not None:
        if precision == 0:
            return EpsilonResult(0.0, "gaussian-exact")
        if math.isinf(precision):
            return EpsilonResult(math.inf, "gaussian-exact")
        return EpsilonResult(gaussian_epsilon(1.0 / math.sqrt(precision), delta), "gaussian-exact")
    if _contains_non_private(event):
        return EpsilonResult(math.inf, "pld")
    if _contains_zcdp(event):
        epsilon, order = _rdp(event, delta, RDP_ORDERS)
        return EpsilonResult(epsilon, "rdp-zcdp", order=order)
    return _pld_epsilon(event, delta)


def _rdp_accountant(event: dpa.DpEvent, delta: float) -> EpsilonResult:
    """``"rdp"``: dp-accounting's RDP, or a lone randomised response's exact ε if smaller."""
    lone_rr = _lone_randomized_response(event)
    epsilon, order = _rdp(event, delta, RDP_ORDERS)
    if lone_rr is not None:
        pure = randomized_response_epsilon(lone_rr.noise_parameter, lone_rr.num_buckets)
        if pure <= epsilon:
            return EpsilonResult(pure, "rr-exact")
    return EpsilonResult(epsilon, "rdp", order=order)


# The one dispatch table: every AccountantName has exactly one entry here.
ACCOUNTANTS: dict[AccountantName, Callable[[dpa.DpEvent, float], EpsilonResult]] = {
    "pld": _pld_accountant,
    "rdp": _rdp_accountant,
}


@lru_cache(maxsize=4096)
def _epsilon_cached(event_json: str, delta: float, accountant: AccountantName) -> EpsilonResult:
    return ACCOUNTANTS[accountant](event_from_json(event_json), delta)


def _check_accountant(accountant: str) -> AccountantName:
    if accountant not in get_args(AccountantName):
        raise ValueError(f"accountant must be one of {get_args(AccountantName)}, got {accountant!r}")
    return accountant  # type: ignore[return-value]


def epsilon_of(event: dpa.DpEvent, delta: float, accountant: AccountantName = "pld") -> EpsilonResult:
    """ε at δ of ``event``, with the name of the accountant that produced it."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return _epsilon_cached(event_to_json(event), float(delta), _check_accountant(accountant))


def clear_cache() -> None:
    """Forget memoised ε values and RDP curves (benchmarks time cold evaluations)."""
    _epsilon_cached.cache_clear()
    _mechanism_rdp.cache_clear()
    _single_pld.cache_clear()
