"""A workload with users: ``workload.users: U`` users whose histories grow.

Request ``i`` goes to one user (``user_order``: ``round_robin`` or ``random``, seeded) and is
that user's previous request plus ``user_items`` new history items, so the same user's
requests share a growing prefix, as GenRec traffic does. The fields live here, in
:class:`UserFields`, which :class:`harness.spec.matrix.WorkloadSpec` inherits; the prompts are
built by :mod:`harness.load.users`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from harness.spec.base import SpecModel


class UserFields(SpecModel):
    """``users`` (None: every request its own history), ``user_items`` new items a request,
    ``user_order`` of the users over the requests."""

    users: int | None = Field(
        None,
        ge=1,
        description="requests from this many users whose histories grow (synthetic / lorem; "
        "[replicas.md](harness/replicas.md))",
    )
    user_items: int = Field(4, ge=1, description="new history items each request of a user adds")
    user_order: Literal["round_robin", "random"] = Field(
        "round_robin", description="which user sends each request (random: seeded)"
    )

    @model_validator(mode="after")
    def _check_users(self) -> UserFields:
        kind = getattr(self, "kind", "synthetic")
        if self.users is not None and kind not in ("synthetic", "lorem"):
            raise ValueError(
                f"'users' builds the prompts itself: it needs kind 'synthetic' or 'lorem', "
                f"not '{kind}'"
            )
        return self
