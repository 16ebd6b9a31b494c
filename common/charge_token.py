"""The parties' credentials for spending at the accountant: random tokens in files.

The accountant holds two: party A's charge token (``accountant.charge_token_file``, for
A's edge and node ledgers) and party B's label charge token
(``accountant.label_charge_token_file``, for B's label ledgers). It creates each file
(mode 0600) on first start if it does not exist; each party is given a copy of its own
out of band. Only a token's holder can create, charge and close its party's runs;
reading budgets needs no token (accountant/service.py).
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
    """Read the token at ``path``, creating a fresh random one (0600) if there is none.

    The token is written to a private temporary file and linked into place, so an
    accountant starting at the same moment reads either no file or a whole token.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(32) + "\n")
            os.link(draft, path)
        except FileExistsError:
            pass  # another accountant linked its token first: both use that one
        finally:
            draft.unlink(missing_ok=True)
    return read_token(path)


def ensure_distinct_tokens(charge_token_file: Path, label_charge_token_file: Path) -> tuple[str, str]:
    """Party A's and party B's tokens, each created if missing; refused if they are the same."""
    if Path(charge_token_file).resolve() == Path(label_charge_token_file).resolve():
        raise TokenError(
            f"charge_token_file and label_charge_token_file are both {charge_token_file}: party A and "
            "party B each need a token of their own"
        )
    charge_token, label_token = ensure_token(charge_token_file), ensure_token(label_charge_token_file)
    if secrets.compare_digest(charge_token, label_token):
        raise TokenError(
            f"{charge_token_file} and {label_charge_token_file} hold the same token: party A and party B "
            "each need a token of their own (delete one file and restart to create a fresh one)"
        )
    return charge_token, label_token
