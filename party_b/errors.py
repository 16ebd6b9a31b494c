"""Why party B refuses a call, as types the handler raises (party_b/handler.py) and the
servicer maps to gRPC status codes in one place (party_b/service.py)."""

from __future__ import annotations


class LabelPartyError(Exception):
    """B refuses the call; the message names the problem and, where there is one, the fix."""


class BadRequest(LabelPartyError):
    """What A sent cannot be used (INVALID_ARGUMENT): a malformed id, tensor, split or stream."""


class UnknownRun(LabelPartyError):
    """No session or dataset of that name at B (NOT_FOUND)."""


class AlreadySetUp(LabelPartyError):
    """The session exists already (ALREADY_EXISTS)."""


class Refused(LabelPartyError):
    """Well-formed, but not now or not here (FAILED_PRECONDITION): B's policy, a finished
    run, a step out of order, data B cannot use, a ledger that refused."""


class OutOfBudget(LabelPartyError):
    """B's label ledger cannot pay for the release (RESOURCE_EXHAUSTED)."""


class Unavailable(LabelPartyError):
    """A transient fault at B (its disk) or beyond it (the accountant): resume once it is fixed (UNAVAILABLE)."""
