"""One row of `vesper bench perf`: a measured figure, what it is compared with in the same
run, the goal and whether it was met. Each benchmark module returns a list of these."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PerfFigure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="what was measured, e.g. 'two-party steps/s against one process'")
    value: float = Field(description="the measured figure (a ratio where the goal is a ratio)")
    unit: str = Field(description="'x' for ratios, 's', 'ms', 'MiB', 'bytes', 'steps/s', ...")
    measured: str = Field(description="the raw numbers behind the value, e.g. '41.2 vs 47.9 steps/s, median of 5'")
    goal: str = Field("", description="the issue's goal in words, e.g. '>= 0.85'; empty: reported only")
    passed: bool | None = Field(None, description="None when the figure has no goal")
    direction: Literal["higher", "lower", "none"] = "none"
    bound: str = Field("", description="when a goal is missed: what bounds it, from profile output")
    command: str = Field("", description="how to measure this figure alone")
