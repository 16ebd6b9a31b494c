"""A service's torch thread pools, capped once when it starts (``torch_threads`` in its section)."""

from __future__ import annotations

import torch


def apply_torch_threads(threads: int | None) -> int:
    """Cap this process's torch threads at ``threads`` (None: torch's default, left alone) and
    return the intra-op thread count now in force.

    Call it before any tensor work: the inter-op pool can only be sized before it has started
    (torch raises otherwise, and also on a second call), so that part is best effort; the
    intra-op pool, which runs the kernels, is what services sharing cores spin on.
    """
    if threads is not None:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:
            pass  # already started or already set in this process: the intra-op cap above still holds
    return torch.get_num_threads()
