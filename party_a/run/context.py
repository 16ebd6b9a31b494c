"""What every phase of one run reads: its settings, its peers, its charger and its directory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vesper.common.config import PartyAConfig, RunConfig
from vesper.common.metrics import NO_COUNTERS, RunCounters
from vesper.party_a.peers import LabelPartyClient
from vesper.party_a.run.charger import WriteAheadCharger
from vesper.party_a.run.progress import Cancelled, Report


@dataclass
class RunContext:
    config: RunConfig
    settings: PartyAConfig
    run_id: str
    device: torch.device
    label_party: LabelPartyClient
    charger: WriteAheadCharger
    report: Report
    cancelled: Callable[[], bool]
    steps_done: int = 0  # training steps B answered, over every session of the run
    counters: RunCounters = NO_COUNTERS  # party A's /metrics of this run

    def run_dir(self) -> Path:
        path = self.settings.workdir / "runs" / self.run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def stop_if_cancelled(self) -> None:
        if self.cancelled():
            raise Cancelled()
