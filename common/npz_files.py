"""Reading every array of a ``.npz`` file, safely from several threads at once.

numpy parses each array's header with ``ast.literal_eval``. On CPython 3.11 two threads
building ASTs at the same time can fail with ``SystemError: AST constructor recursion depth
mismatch`` (python/cpython#106905: the interpreter's AST state is shared between threads; seen
here when two benchmark workers read party A's recorded gradients at once). Every read through
:func:`read_npz` holds one process-wide lock, :data:`NPZ_HEADERS`, while it parses the headers
and reads the arrays, and the dataset readers that read an archive lazily or member by member
(common.dataset_files, common.csr_cache) hold it too, so vesper's own reads never build ASTs
concurrently with each other.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

# hold it wherever numpy parses an array's header
NPZ_HEADERS = threading.RLock()


def read_npz(path: Path | str) -> dict[str, np.ndarray]:
    """Every array of the archive at ``path``, by name, read in full; no pickled objects (np.load's
    errors pass through)."""
    with NPZ_HEADERS, np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
