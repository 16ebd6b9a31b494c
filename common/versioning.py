"""How records that cross a process boundary stay readable across versions of vesper.

Two services of one deployment are upgraded at different times (party A before its
coordinator, the accountant before an auditor's `vesper status`). The rule, for every message
and record that crosses a process boundary (docs/architecture.md, "Versions"):

* **gRPC messages** (proto3): fields are only ever added, never renumbered or reused; a
  receiver ignores fields it does not know, and an absent field reads as its default, which
  means "not given" (a lease of "" is not checked).
* **Reports** — JSON that one process writes for another to read (the run summary party A
  sends the coordinator; the accountant's run records, status views and ledger rows, over
  REST and in the ledger file): a reader ignores fields it does not know, so additive
  changes need nothing; each carries ``format``, and a reader refuses one whose format is
  newer than it knows, with an error that says to upgrade the reader. ``format`` goes up only
  when a field changes meaning.
* **Settings** — JSON that tells a process what to do (the run configuration the coordinator
  sends party A, the label-privacy settings A sends B, TOML files): strict. A setting the
  receiver does not know is refused by name, never ignored: a typo, or a setting an older
  receiver cannot honour, must not silently change a privacy guarantee. The coordinator sends
  only the settings that were given, so a receiver of another version applies its own
  defaults and refuses only what it cannot do.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

REPORT_FORMAT = 1


class Report(BaseModel):
    """A record one process writes for another to read: additive fields tolerated, ``format`` checked."""

    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="strings")

    format: int = Field(REPORT_FORMAT, description="this record's format; a reader refuses a newer one")

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: int) -> int:
        if value > REPORT_FORMAT:
            raise ValueError(
                f"this {cls.__name__} was written by a newer vesper (format {value}; this one reads formats up to "
                f"{REPORT_FORMAT}): upgrade vesper where it is read"
            )
        return value
