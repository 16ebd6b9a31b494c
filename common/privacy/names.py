"""Names shared by the configuration, the ledger and the privacy math, without the math.

:mod:`vesper.common.config` needs :data:`AccountantName` at import time, and importing
:mod:`vesper.common.privacy.accounting` imports dp-accounting and scipy, which is slow
(docs/performance-notes.md), so the name
is defined here, once, and imported by all three.
"""

from __future__ import annotations

from typing import Literal

# The accountants a run may ask for; vesper.common.privacy.accounting.dispatch.ACCOUNTANTS
# maps each one to the code that computes its ε.
AccountantName = Literal["pld", "rdp"]
