"""Run submission (API.md "Runs")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.bounds import JsonObject, check_json


class DrafterSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["dflash", "eagle3"]
    num_layers: int | None = Field(None, ge=1, le=64)
    block_size: int | None = Field(None, ge=2, le=64)
    draft_vocab_size: int | None = Field(None, ge=16)
    target_layer_ids: list[int] | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _bounded_extras(self) -> "DrafterSpec":
        check_json(self.model_extra or {})  # the free-form rest of the drafter's config
        return self


class Stages(BaseModel):
    model_config = ConfigDict(extra="forbid")
    generate: JsonObject | None = None
    prepare: JsonObject = Field(default_factory=dict)
    extract: JsonObject | None = Field(default_factory=dict)
    train: JsonObject = Field(default_factory=dict)
    evaluate: JsonObject | None = Field(default_factory=dict)


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    target_id: str
    dataset_id: str
    drafter: DrafterSpec
    stages: Stages = Field(default_factory=Stages)
    mode: Literal["offline", "online"] = "offline"
    chat_template_kwargs: JsonObject | None = None
    priority: int = Field(50, ge=0, le=100)
    force: bool = False
    # Start even when the plan finds errors (the records that fail are rejected and counted).
    force_plan: bool = False
    plan_sample: int = Field(200, ge=1, le=100_000)
