"""common.seeded_init: initial parameters depend on the run's seed alone, even when two runs are
built at once in one process (the in-process cluster's jobs, coordinator/in_process.py)."""

from __future__ import annotations

import threading

import torch

from vesper.common.seeded_init import seeded


def _build(seed: int) -> list[torch.Tensor]:
    with seeded(seed):
        return [torch.nn.Linear(32, 32).weight.detach() for _ in range(30)]


def test_two_threads_building_at_once_get_what_each_gets_alone() -> None:
    alone = {seed: _build(seed) for seed in (1, 2)}
    built: dict[int, list[list[torch.Tensor]]] = {1: [], 2: []}
    start = threading.Barrier(2)

    def work(seed: int) -> None:
        start.wait()
        for _ in range(20):
            built[seed].append(_build(seed))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for seed in (1, 2):
        assert all(torch.equal(a, b) for run in built[seed] for a, b in zip(run, alone[seed], strict=True))
    assert not torch.equal(alone[1][0], alone[2][0])


def test_the_process_generator_is_restored_and_a_build_may_build_another() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with seeded(1):
        with seeded(2):  # an extractor building its edge-free path
            inner = torch.rand(1)
        outer = torch.rand(1)
    assert torch.equal(torch.rand(3), expected)
    with seeded(2):
        assert torch.equal(torch.rand(1), inner)
    with seeded(1):
        assert torch.equal(torch.rand(1), outer)
