"""common.npz_files: every array of an archive, read whole, from any number of threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vesper.common.npz_files import read_npz


def test_every_array_is_read_whole_and_threads_read_the_same(tmp_path: Path) -> None:
    path = tmp_path / "a.npz"
    arrays = {"node_ids": np.arange(60), "gradients": np.ones((60, 3), dtype=np.float32), "num_classes": np.int64(2)}
    np.savez(path, **arrays)
    read = read_npz(path)
    assert set(read) == set(arrays) and all(np.array_equal(read[k], v) for k, v in arrays.items())
    with ThreadPoolExecutor(4) as pool:  # as the benchmarks' workers read recorded gradients at once
        results = list(pool.map(read_npz, [path] * 32))
    assert all(np.array_equal(r["gradients"], arrays["gradients"]) for r in results)
