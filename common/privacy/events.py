"""DpEvents as canonical JSON, so a ledger row stores exactly what was charged.

``{"type": "GaussianDpEvent", "noise_multiplier": 3.77}``, ``{"type": "ZCDpEvent", "rho": 0.1,
"xi": 0.0}``, ``{"type": "RandomizedResponseDpEvent", "noise_parameter": 0.27, "num_buckets": 2}``;
composite events nest (``ComposedDpEvent.events``,
``SelfComposedDpEvent.event``). Only the event types
vesper can account for are accepted; anything else is an :class:`EventError`.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

import attr
import dp_accounting as dpa
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent  # not re-exported by dp-accounting 0.6.0


class EventError(ValueError):
    """A DpEvent in JSON is malformed or of a kind vesper does not account for."""


_EVENT_TYPES: dict[str, type[dpa.DpEvent]] = {
    cls.__name__: cls
    for cls in (
        dpa.NoOpDpEvent,
        dpa.NonPrivateDpEvent,
        dpa.GaussianDpEvent,
        dpa.LaplaceDpEvent,
        dpa.SelfComposedDpEvent,
        dpa.ComposedDpEvent,
        dpa.PoissonSampledDpEvent,
        dpa.ZCDpEvent,  # (ξ, ρ)-zCDP: exponential-mechanism rounds (docs/extractors/dpar.md)
        MixtureOfGaussiansDpEvent,  # random sensitivity (docs/extractors/heterpoisson.md)
        dpa.RandomizedResponseDpEvent,  # k-ary randomised response of party B's labels (docs/label-privacy.md)
    )
}


# a mixture's support is bounded by a batch size; far more components is a malformed event
MAX_MIXTURE_COMPONENTS = 100_000
# randomised response runs over a label's classes; far more buckets is a malformed event
MAX_RANDOMIZED_RESPONSE_BUCKETS = 1_000_000


def check_mixture(sensitivities: Any, probabilities: Any) -> None:
    """A MixtureOfGaussians' support: finite sensitivities ≥ 0 and probabilities summing to 1."""
    if not isinstance(sensitivities, (list, tuple)) or not isinstance(probabilities, (list, tuple)):
        raise EventError("a mixture's sensitivities and sampling_probs must be lists")
    if not sensitivities or len(sensitivities) != len(probabilities):
        raise EventError(
            f"a mixture needs as many sampling_probs as sensitivities, and at least one: "
            f"got {len(sensitivities)} and {len(probabilities)}"
        )
    if len(sensitivities) > MAX_MIXTURE_COMPONENTS:
        raise EventError(f"a mixture of {len(sensitivities)} components exceeds {MAX_MIXTURE_COMPONENTS}")
    for name, values, high in (("sensitivities", sensitivities, math.inf), ("sampling_probs", probabilities, 1.0)):
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise EventError(f"mixture {name} must be finite numbers, got {value!r}")
            if not 0.0 <= value <= high:
                raise EventError(f"mixture {name} value {value} is outside [0, {high}]")
    total = math.fsum(probabilities)
    if abs(total - 1.0) > 1e-9:
        raise EventError(f"mixture sampling_probs must sum to 1, they sum to {total!r}")


def _to_data(event: dpa.DpEvent) -> dict[str, Any]:
    name = type(event).__name__
    if name not in _EVENT_TYPES:
        raise EventError(f"vesper does not account for {name}")
    data: dict[str, Any] = {"type": name}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dpa.DpEvent):
            value = _to_data(value)
        elif name == "RandomizedResponseDpEvent":
            # 0.5 and 1/2 as int or float, or a numpy scalar, must give one canonical string
            value = _real(value) if field.name == "noise_parameter" else _integer(value)
        elif isinstance(value, (list, tuple)):
            # ComposedDpEvent.events, or a mixture's numbers
            value = [_to_data(v) if isinstance(v, dpa.DpEvent) else float(v) for v in value]
        data[field.name] = value
    return data


def event_to_json(event: dpa.DpEvent) -> str:
    """Canonical JSON (sorted keys, no spaces): equal events give equal strings."""
    return json.dumps(_to_data(event), sort_keys=True, separators=(",", ":"))


def _number(data: dict[str, Any], key: str, *, low: float, high: float = math.inf) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EventError(f"{data.get('type')}.{key} must be a number, got {value!r}")
    if not math.isfinite(value) or not low <= value <= high:
        raise EventError(f"{data.get('type')}.{key}={value} is outside [{low}, {high}]")
    return float(value)


def _real(value: Any) -> Any:
    """``value`` as a Python float if it is a real number (numpy's too), else unchanged for the parser to refuse."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return float(value)


def _integer(value: Any) -> Any:
    """``value`` as a Python int if it is an integer (numpy's too), else unchanged for the parser to refuse."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return value
    return int(value)


def _buckets(data: dict[str, Any]) -> int:
    value = data.get("num_buckets")
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(f"RandomizedResponseDpEvent.num_buckets must be an integer, got {value!r}")
    if not 2 <= value <= MAX_RANDOMIZED_RESPONSE_BUCKETS:
        raise EventError(
            f"RandomizedResponseDpEvent.num_buckets={value} is outside [2, {MAX_RANDOMIZED_RESPONSE_BUCKETS}]"
        )
    return value


def _from_data(data: Any) -> dpa.DpEvent:
    if not isinstance(data, dict) or "type" not in data:
        raise EventError(f"a DpEvent must be an object with a 'type', got {data!r}")
    name = data["type"]
    cls = _EVENT_TYPES.get(name)
    if cls is None:
        raise EventError(f"unknown or unsupported DpEvent type {name!r}")
    expected = {"type"} | {f.name for f in attr.fields(cls)}
    if set(data) != expected:
        raise EventError(f"{name} needs exactly the fields {sorted(expected - {'type'})}")
    if cls in (dpa.NoOpDpEvent, dpa.NonPrivateDpEvent):
        return cls()
    if cls is dpa.GaussianDpEvent:
        return cls(noise_multiplier=_number(data, "noise_multiplier", low=0.0))
    if cls is dpa.LaplaceDpEvent:
        return cls(noise_multiplier=_number(data, "noise_multiplier", low=0.0))
    if cls is MixtureOfGaussiansDpEvent:
        check_mixture(data["sensitivities"], data["sampling_probs"])
        return cls(
            standard_deviation=_number(data, "standard_deviation", low=0.0),
            sensitivities=[float(v) for v in data["sensitivities"]],
            sampling_probs=[float(v) for v in data["sampling_probs"]],
        )
    if cls is dpa.RandomizedResponseDpEvent:
        return cls(noise_parameter=_number(data, "noise_parameter", low=0.0, high=1.0), num_buckets=_buckets(data))
    if cls is dpa.ZCDpEvent:
        return cls(rho=_number(data, "rho", low=0.0), xi=_number(data, "xi", low=0.0))
    if cls is dpa.PoissonSampledDpEvent:
        return cls(
            sampling_probability=_number(data, "sampling_probability", low=0.0, high=1.0),
            event=_from_data(data["event"]),
        )
    if cls is dpa.SelfComposedDpEvent:
        count = data["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise EventError(f"SelfComposedDpEvent.count must be a non-negative integer, got {count!r}")
        return cls(event=_from_data(data["event"]), count=count)
    if cls is dpa.ComposedDpEvent:
        if not isinstance(data["events"], list):
            raise EventError("ComposedDpEvent.events must be a list")
        return cls(events=[_from_data(e) for e in data["events"]])
    raise EventError(f"unsupported DpEvent type {name!r}")  # pragma: no cover


def event_from_json(text: str) -> dpa.DpEvent:
    """Parse and validate a DpEvent written by :func:`event_to_json`."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise EventError(f"DpEvent is not valid JSON: {exc}") from None
    return _from_data(data)
