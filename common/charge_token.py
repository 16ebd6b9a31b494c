"""Party A's credential for spending at the accountant: a random token in a file.

The accountant creates the file (mode 0600) on first start if it does not exist;
party A is given a copy out of band. Only the holder can create runs and charge
releases; reading budgets needs no token (accountant/service.py).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

MIN_LENGTH = 16


class TokenError(ValueError):
    """The token file is missing, unreadable or too short."""


def read_token(path: Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except FileNotFoundError:
        raise TokenError(f"charge token file {path} does not exist") from None
    except OSError as exc:
        raise TokenError(f"cannot read charge token file {path}: {exc}") from None
    if len(token) < MIN_LENGTH or any(c.isspace() for c in token):
        raise TokenError(f"charge token file {path} must hold one token of at least {MIN_LENGTH} characters")
    return token


def ensure_token(path: Path) -> str:
    """Read the token at ``path``, creating a fresh random one (0600) if there is none."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
    return read_token(path)
