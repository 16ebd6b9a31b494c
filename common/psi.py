"""Diffie–Hellman private set intersection over Ristretto255 (libsodium, through rbcl).

The group operations are libsodium's (``crypto_core_ristretto255_from_hash``,
``crypto_scalarmult_ristretto255``, ``crypto_core_ristretto255_scalar_random``); nothing
here implements curve, field or hash-to-curve arithmetic. docs/alignment.md states the
protocol and what each party learns; this module holds its steps, one function each:

    H(k)       = ristretto255_from_hash(SHA-512(domain ‖ context ‖ k))   hash_keys
    blind(P)   = P^s, s a fresh secret scalar of one alignment            Blinder
    dummies    = uniformly random group elements, padding a set's size    random_points
    intersect  = which of one's double-blinded values the other side has  matches

A point that arrives from the other party is checked to be a canonical encoding of a group
element before it is used (``PsiError`` otherwise): libsodium rejects non-canonical
encodings, and the check names which message and position failed.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence

import rbcl

POINT_BYTES = rbcl.crypto_core_ristretto255_BYTES  # 32
DOMAIN = b"vesper.v1.psi.ristretto255"


class PsiError(ValueError):
    """A message of the other party is not a list of valid group elements; the text says which."""


def hash_keys(keys: Iterable[str], context: bytes) -> list[bytes]:
    """H(k) for every key: SHA-512 of the domain, the alignment's context and the key (UTF-8),
    mapped into the group by libsodium's ristretto255 hash-to-group (Elligator 2, twice)."""
    prefix = DOMAIN + len(context).to_bytes(2, "big") + context
    return [rbcl.crypto_core_ristretto255_from_hash(hashlib.sha512(prefix + key.encode()).digest()) for key in keys]


def random_points(count: int) -> list[bytes]:
    """``count`` uniformly random group elements: indistinguishable from blinded keys (DDH)."""
    return [rbcl.crypto_core_ristretto255_random() for _ in range(count)]


def secret_shuffle(count: int) -> list[int]:
    """A uniformly random order of ``count`` positions, from the operating system's CSPRNG."""
    order = list(range(count))
    for i in range(count - 1, 0, -1):  # Fisher–Yates
        j = secrets.randbelow(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


class Blinder:
    """One party's secret exponent s of one alignment; dropped with the object."""

    def __init__(self) -> None:
        self._scalar = rbcl.crypto_core_ristretto255_scalar_random()

    def blind_keys(self, keys: Iterable[str], context: bytes) -> list[bytes]:
        """H(k)^s for every key."""
        return [rbcl.crypto_scalarmult_ristretto255(self._scalar, point) for point in hash_keys(keys, context)]

    def blind_points(self, points: Sequence[bytes], what: str) -> list[bytes]:
        """P^s for every point the other party sent (each checked first)."""
        check_points(points, what)
        return [rbcl.crypto_scalarmult_ristretto255(self._scalar, point) for point in points]


def check_points(points: Sequence[bytes], what: str) -> None:
    for position, point in enumerate(points):
        if len(point) != POINT_BYTES or not rbcl.crypto_core_ristretto255_is_valid_point(point):
            raise PsiError(f"{what}: element {position} is not a valid Ristretto255 point")


def split_points(blob: bytes, what: str) -> list[bytes]:
    """A message's concatenated 32-byte encodings, as a list (PsiError if the length is off)."""
    if len(blob) % POINT_BYTES:
        raise PsiError(f"{what}: {len(blob)} bytes is not a whole number of {POINT_BYTES}-byte points")
    return [blob[i : i + POINT_BYTES] for i in range(0, len(blob), POINT_BYTES)]


def matches(mine: Sequence[bytes], theirs: Iterable[bytes]) -> list[int]:
    """Positions in ``mine`` whose double-blinded value the other side also holds."""
    held = set(theirs)
    return [position for position, value in enumerate(mine) if value in held]


def padded_size(count: int, declared: int | None) -> int:
    """How many elements a party sends for ``count`` keys: its declared bound, or the next
    power of two (the other side then learns the count only to within a factor of two)."""
    if declared is not None:
        if declared < count:
            raise ValueError(f"the declared bound {declared} is below the {count} keys held: raise it")
        return declared
    return 1 << max(count - 1, 0).bit_length()
