"""Service settings that replaced environment switches, and the tidy-ups around them.

1. ``party_a.pipeline`` and ``torch_threads`` (parties A and B) validate; a real ``vesper serve``
   process applies ``torch_threads`` before its first tensor (its ready file reports
   ``torch.get_num_threads()`` read inside the service). That pipelining changes no release is
   tests/test_perf_bench.py's, now switched through the setting.
2. One ``Machine`` model for both benchmark reports; soak reports written with the old
   ``cpus`` key still load.
3. Checkpoints written while ``Checkpoint`` still had its unused ``extra`` field still load.
4. StepTimings lives in party_a.run.step_timings; the trainer uses the same objects.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from vesper.benchmarks.harness import Machine
from vesper.benchmarks.soak_bench import SoakReport
from vesper.common.config import PartyAConfig, PartyBConfig
from vesper.coordinator.processes import start_service, write_section
from vesper.party_a.run import step_loop, step_timings
from vesper.party_a.run.checkpoint_files import Checkpoint, Position, RunFiles

DOCS = Path(__file__).resolve().parents[1] / "docs"


# -- 1. settings ------------------------------------------------------------------------------
def test_pipelining_is_on_and_threads_are_torchs_unless_set() -> None:
    a, b = PartyAConfig(), PartyBConfig()
    assert a.pipeline is True and a.torch_threads is None and b.torch_threads is None
    assert PartyAConfig(pipeline=False, torch_threads=1).torch_threads == 1
    for model in (PartyAConfig, PartyBConfig):
        with pytest.raises(ValidationError, match="greater than or equal to 1"):
            model(torch_threads=0)


def test_a_served_party_runs_with_the_torch_threads_it_was_given(tmp_path: Path) -> None:
    # 1 for A and 3 for B: at least one differs from torch's default (one per core) on any machine
    wanted = {"party-a": 1, "party-b": 3}
    services = []
    try:
        for kind, threads in wanted.items():
            section = kind.replace("-", "_")
            config = tmp_path / f"{section}.toml"
            write_section(config, section, {
                "listen": "127.0.0.1:0", "workdir": str(tmp_path / section), "torch_threads": threads,
            })
            services.append(start_service(kind, config, tmp_path))
        for service, threads in zip(services, wanted.values(), strict=True):
            assert service.wait_ready(timeout_s=60)["torch_threads"] == threads
            assert f"{threads} torch threads" in service.log_path.read_text()
    finally:
        for service in services:
            service.stop()


# -- 2. one Machine model ---------------------------------------------------------------------
def test_one_machine_model_reads_this_machine_and_old_soak_reports() -> None:
    here = Machine.here()
    assert here.cores >= 1 and here.cpu_model and here.torch == torch.__version__
    assert here.torch_threads == torch.get_num_threads() and here.ram_gib is not None
    assert "cores" in here.model_dump() and "cpus" not in here.model_dump()
    old = Machine.model_validate({"cpus": 2, "cpu_model": "AMD EPYC", "python": "3.11.7", "system": "Linux"})
    assert old.cores == 2 and old.torch is None
    report = SoakReport.model_validate_json((DOCS / "soak.json").read_text())  # written with "cpus"
    assert report.machine.cores >= 1


# -- 3. checkpoints without the dead field ----------------------------------------------------
def test_a_checkpoint_that_still_carries_extra_loads(tmp_path: Path) -> None:
    state = torch.Generator().manual_seed(1).get_state()
    position = Position(step=4, epoch=0, batch=1, batches=[torch.arange(3)], root_order=state)
    checkpoint = Checkpoint(position, {"w": torch.ones(2)}, None, state, state, 3, 0.5, 4)
    # a pickled dataclass is its __dict__: this is what a file from the older class holds
    # (``extra``, and A's ``dropout`` streams, gone since A's dropout is keyed)
    checkpoint.__dict__["extra"] = {}
    checkpoint.__dict__["dropout"] = [None]
    files = RunFiles(tmp_path)
    files.save_checkpoint(checkpoint)
    loaded = files.latest_checkpoint()
    assert loaded is not None and loaded.position.step == 4 and loaded.charges == 3
    assert torch.equal(loaded.extractor["w"], torch.ones(2)) and torch.equal(loaded.sampling, state)


# -- 4. StepTimings moved, not changed --------------------------------------------------------
def test_the_trainer_uses_the_step_timings_module(tmp_path: Path) -> None:
    assert step_loop.StepTimings is step_timings.StepTimings
    assert step_loop.STEP_TIMINGS_FILE == step_timings.STEP_TIMINGS_FILE == "step_timings.json"
    assert isinstance(step_loop._NO_TIMER, step_timings.StepTimings)
    assert not hasattr(step_loop, "PIPELINE_ENV") and not hasattr(step_loop, "pipelining")
    timings = step_timings.StepTimings()
    timings.begin()
    timings.mark("release")
    timings.end()
    timings.save(tmp_path / "t.json")
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["count"] == 1 and saved["phases"] == list(step_timings.StepTimings.PHASES)
