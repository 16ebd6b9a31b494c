"""An example third-party extractor: a fixed random projection of the features.

It reads no edges, so every release is post-processing of A's own (unprotected)
features and costs nothing; it exists to show the whole plugin surface in a page.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSetup,
    ExtractorSpec,
    ReleaseKind,
    RootPlan,
    post_processing_rules,
)


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale: float = Field(1.0, gt=0, description="multiplies the projection before normalising")


class RandomFeatures(ExtractorBase):
    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="example-random-features", privacy_unit="edge", cost_model="none",
        summary="example plugin: a fixed random projection of the features; reads no edges",
        params=Params, uses=("dim",),
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        generator = torch.Generator().manual_seed(setup.config.seed)
        projection = torch.randn(setup.features.shape[1], setup.config.extractor.dim, generator=generator)
        self.register_buffer("projection", projection.to(setup.device) * setup.params.scale)

    @property
    def output_layers(self) -> int:
        return 1

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        return ChargePlan(post_processing_rules(), sensitivity=0.0, details={"reads_edges": False})

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        embedded = F.normalize(self.setup.features[roots] @ self.projection, dim=-1)
        return embedded.unsqueeze(-1)
