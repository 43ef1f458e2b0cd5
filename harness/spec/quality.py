"""The matrix ``quality:`` section: cut-offs, and the dataset each cell is evaluated on."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from harness.spec.base import NAME as _NAME
from harness.spec.base import SpecModel
from harness.spec.url import check_url


class QualityGenerateSpec(SpecModel):
    """A planted RecIF-shaped dataset built from the run's model (``harness.quality.generate``)."""

    samples: int = Field(100, ge=1)
    fraction: float = Field(0.5, ge=0, le=1)
    extra_answers: int = Field(0, ge=0)
    seed: int = 0
    task: str = Field("video", pattern=_NAME)
    beams: int = Field(32, ge=1)
    median_tokens: int = Field(64, ge=1)
    device: str | None = None  # the reference's device; default: the engine's
    reference_url: str | None = None  # a running reference server instead of a launched one

    @field_validator("reference_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return check_url(v, "reference_url") if v is not None else v


class QualitySpec(SpecModel):
    """Cut-offs for recall / hit / NDCG / MRR when the workload has ground truth; with
    ``dataset`` or ``generate``, each cell is also evaluated on that dataset after its rounds
    (``harness.quality.stage``: pass@k, position1_pass@k, recall@k by SID and PID)."""

    ks: list[int] = Field(default_factory=lambda: [1, 10])
    dataset: str | None = None  # RecIF parquet file / folder, or JSONL
    sid2pid: str | None = None  # default: sid2pid.json beside the dataset
    generate: QualityGenerateSpec | None = None
    official: bool = False  # the benchmark's protocol: 32 beams, 3 tokens, ks [1, 32]
    beam_width: int | None = Field(None, ge=1)  # default: the cell's (32 with official)
    max_tokens: int | None = Field(None, ge=1)  # default: the cell's (3 with official)
    samples: int | None = Field(None, ge=1)  # evaluate only the first N samples
    concurrency: int = Field(8, ge=1)
    request_timeout_s: float = Field(300.0, gt=0)
    cells: str | None = None  # a cell filter; default every cell

    @model_validator(mode="before")
    @classmethod
    def _official_ks(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("official") and "ks" not in data:
            data = {**data, "ks": [1, 32]}
        return data

    @model_validator(mode="after")
    def _check(self) -> QualitySpec:
        if not self.ks or min(self.ks) < 1:
            raise ValueError("ks: give cut-offs >= 1")
        if self.dataset and self.generate:
            raise ValueError("give 'dataset' or 'generate', not both")
        if self.official and (
            self.beam_width not in (None, 32) or self.max_tokens not in (None, 3)
        ):
            raise ValueError("'official' fixes beam_width 32 and max_tokens 3")
        return self

    @property
    def evaluates(self) -> bool:
        """Whether cells are evaluated on a dataset (``dataset`` or ``generate``)."""
        return bool(self.dataset or self.generate)
