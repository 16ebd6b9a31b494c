"""k-ary randomised response on B's training labels (label DP, relation "replace one label").

Each label y ∈ {0, …, k−1} is released as ỹ with (docs/label-privacy.md, eq. RR1)

    Pr[ỹ = y] = e^ε / (e^ε + k − 1),    Pr[ỹ = m] = 1 / (e^ε + k − 1)  for each m ≠ y,

so for any two inputs y, y' and any output m the likelihood ratio is at most e^ε: ε-DP
for one label, δ = 0. dp-accounting describes the same mechanism as
``RandomizedResponseDpEvent(noise_parameter=p, num_buckets=k)`` — "with probability p a
uniform bucket out of all k, else the true one" — with p = k / (e^ε + k − 1) (eq. RR2).

Floating point never makes the mechanism weaker than the ε it is asked for:
:func:`noise_parameter` rounds p up until the ε implied by p is at most ε both in float
(what an accountant computes from the event) and in exact arithmetic (what the mechanism
does), and :func:`randomize_labels` flips with a probability that is never below the
event's p·(k − 1)/k and moves to the other k − 1 classes exactly uniformly (a larger
flip probability is a smaller ε, eq. RR3).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import dp_accounting as dpa
import torch

# A 32-bit draw: torch's randint over a range of exactly 2^32 reduces a 64-bit draw
# modulo 2^32, which is exact; smaller ranges would carry a modulo bias of order k/2^32.
_OFFSET_BITS = 32
# Rounding p up by an ulp at a time reaches the safe side within a few steps; a bound
# keeps a mistake from looping forever.
_MAX_NUDGES = 64
# Digits of e^ε in the exact check; its relative error 10^-55 is far below a float's ulp.
_EXACT_DIGITS = 60


def _check(epsilon: float, num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"randomised response needs an integer number of classes >= 2, got {num_classes!r}")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"randomised response needs a finite epsilon > 0, got {epsilon!r}")


def keep_probability(epsilon: float, num_classes: int) -> float:
    """e^ε / (e^ε + k − 1), the probability that a label is released unchanged (eq. RR1).

    Written as 1 / (1 + (k − 1) e^(−ε)) so that a large ε does not overflow.
    """
    _check(epsilon, num_classes)
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def implied_epsilon(noise_parameter: float, num_classes: int) -> float:
    """ε of RR with noise parameter p over k buckets, ln((1 − p + p/k) / (p/k)), evaluated in float.

    The largest of algebraically equal forms: the one above, ln(1 − p(k − 1)/k) − ln(p/k)
    exactly as dp-accounting's PLD writes it, and the same with log1p. ∞ at p = 0 (no
    noise), 0 at p = 1.
    """
    p, k = noise_parameter, num_classes
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a noise parameter is a probability, got {p!r}")
    if p == 0.0:
        return math.inf
    if p == 1.0:
        return 0.0
    return max(
        math.log((1.0 - p + p / k) / (p / k)),
        math.log(1 - p * (k - 1) / k) - math.log(p / k),
        math.log1p(-p * (k - 1) / k) - math.log(p / k),
        0.0,
    )


def meets_exactly(noise_parameter: float, num_classes: int, epsilon: float) -> bool:
    """Whether (1 − p + p/k) / (p/k) ≤ e^ε in exact arithmetic, for the float p as given.

    The ratio is a rational number (p is a binary fraction); e^ε is taken to 60 digits
    and lowered by a margin above its rounding error, so True is never wrong.
    """
    p, k = Fraction(noise_parameter), num_classes
    if p == 0:
        return False
    ratio = (1 - p + p / k) / (p / k)
    with localcontext() as context:
        context.prec = _EXACT_DIGITS
        bound = Decimal(epsilon).exp() * (1 - Decimal(10) ** (5 - _EXACT_DIGITS))
    return ratio <= Fraction(bound)


def noise_parameter(epsilon: float, num_classes: int) -> float:
    """p = k / (e^ε + k − 1) (eq. RR2), rounded up until p meets ε both in float and exactly.

    In float: :func:`implied_epsilon` (p) ≤ ε, the number an accountant computes from the
    event. Exactly: :func:`meets_exactly`, the mechanism's true ε for this p.
    """
    _check(epsilon, num_classes)
    k = num_classes
    scaled = math.exp(-epsilon)  # k e^(−ε) / (1 + (k − 1) e^(−ε)) cannot overflow
    p = min(1.0, k * scaled / (1.0 + (k - 1) * scaled))
    for _ in range(_MAX_NUDGES):
        if implied_epsilon(p, k) <= epsilon and meets_exactly(p, k, epsilon):
            return p
        p = math.nextafter(p, 1.0)
    raise ArithmeticError(f"no float noise parameter near {p!r} meets epsilon={epsilon!r} for k={k}")


def rr_event(epsilon: float, num_classes: int) -> dpa.RandomizedResponseDpEvent:
    """The DpEvent B charges, once, before any label-derived value leaves B."""
    return dpa.RandomizedResponseDpEvent(noise_parameter=noise_parameter(epsilon, num_classes), num_buckets=num_classes)


def flip_probability(epsilon: float, num_classes: int) -> float:
    """The probability with which :func:`randomize_labels` replaces a label: the smallest float ≥ p(k − 1)/k.

    p is the event's :func:`noise_parameter`; flipping at least that often makes the
    sampler's ε at most the event's (eq. RR3). Checked in exact rational arithmetic.
    """
    p = noise_parameter(epsilon, num_classes)
    exact = Fraction(p) * (num_classes - 1) / num_classes
    flip = float(exact)
    while Fraction(flip) < exact:
        flip = math.nextafter(flip, 1.0)
    return flip


def _uniform_offsets(shape: torch.Size, count: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Offsets uniform on 1..count, exactly: 32-bit draws, rejecting the top partial block.

    A draw is rejected with probability below count / 2^32, so the loop almost never
    runs; which draws are redrawn depends on the random bits alone, not on the labels.
    """
    span = 1 << _OFFSET_BITS
    limit = (span // count) * count
    draws = torch.randint(0, span, shape, generator=generator, device=device, dtype=torch.int64)
    rejected = draws >= limit
    while bool(rejected.any()):
        fresh = torch.randint(0, span, (int(rejected.sum()),), generator=generator, device=device, dtype=torch.int64)
        draws[rejected] = fresh
        rejected = draws >= limit
    return draws % count + 1


def randomize_labels(
    labels: torch.Tensor, num_classes: int, epsilon: float, generator: torch.Generator
) -> torch.Tensor:
    """Each label kept with probability :func:`keep_probability`, else moved to one of the other k − 1 classes.

    The move adds an offset uniform on 1..k − 1 modulo k, so every other class is equally
    likely (eq. RR1). The flip is decided by a float64 uniform u < f with
    f = :func:`flip_probability` computed directly, never as 1 − keep, which rounds to 0
    for a large ε; u lives on a grid of 2^−53, so the realised flip probability is f
    rounded up to that grid: never below f.

    The result is on ``labels``' device with its dtype. Every draw is made on that device
    with ``generator``, so ``generator.device`` must be ``labels.device`` (torch refuses a
    mismatch). The same labels, ε and generator state give the same output.
    """
    _check(epsilon, num_classes)
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {labels.dtype}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}, got {int(labels.min())}..{int(labels.max())}")
    flips = torch.rand(labels.shape, generator=generator, device=labels.device, dtype=torch.float64)
    flipped = flips < flip_probability(epsilon, num_classes)
    offsets = _uniform_offsets(labels.shape, num_classes - 1, generator, labels.device)
    moved = (labels.to(torch.int64) + offsets) % num_classes
    return torch.where(flipped, moved, labels.to(torch.int64)).to(labels.dtype)
