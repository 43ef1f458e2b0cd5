"""What every matrix section's model shares: frozen, unknown keys refused; and the helpers
that read the models' fields for error messages and docs."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict

NAME = r"^[A-Za-z0-9_.-]+$"  # names that become file and cell-id parts


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def close_hint(name: str, known: list[str]) -> str:
    """``did you mean 'y'?`` for the known name closest to ``name``, else the known ones."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known)}"


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The section model inside a field's annotation (``X | None``, ``list[X]``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = model_in(arg)
        if found is not None:
            return found
    return None
