"""What every matrix section's model shares: frozen, unknown keys refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

NAME = r"^[A-Za-z0-9_.-]+$"  # names that become file and cell-id parts


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
