"""Replicas behind a router: an engine's ``replicas: N`` and ``router: {policy, args}``.

The harness starts N servers of the engine and one ``sglang-router`` in front of them
(:mod:`harness.servers.replicas`) and measures at the router's URL. The fields live here, in
:class:`ReplicaFields`, which :class:`harness.spec.matrix.EngineSpec` inherits.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, model_validator

from harness.spec.base import SpecModel

Scalar = Union[bool, int, float, str, None]  # as harness.spec.matrix.Scalar

ROUTER_COMMAND = ["python", "-m", "sglang_router.launch_router"]


class RouterSpec(SpecModel):
    """The router in front of an engine's replicas: its policy, its other flags (``args``,
    ``{cache_threshold: 0.5}`` -> ``--cache-threshold 0.5``) and how it is launched."""

    # sglang-router 0.3.x's policies over a plain list of worker URLs (``python -m
    # sglang_router.launch_router --help``; ``manual`` needs a routing key in every request)
    policy: Literal["round_robin", "cache_aware", "random", "power_of_two"] = Field(
        "cache_aware", description="the router's `--policy` over the replicas"
    )
    args: dict[str, Scalar] = Field(
        {}, description="the router's other flags: `{cache_threshold: 0.5}` -> "
        "`--cache-threshold 0.5` (true: the bare flag; false / null: left out)"
    )  # fmt: skip
    command: list[str] = Field(
        default_factory=lambda: list(ROUTER_COMMAND),
        min_length=1,
        description="how the router is started (`python`: this interpreter); the harness "
        "appends `--worker-urls`, `--policy`, `--host`, `--port` and a free `--prometheus-port`",
    )
    startup_timeout_s: float = Field(
        120.0, gt=0, description="`/readiness` must count every replica healthy within this"
    )

    @model_validator(mode="after")
    def _check_args(self) -> RouterSpec:
        owned = {"worker_urls", "policy", "host", "port", "prometheus_port", "prometheus_host"}
        if bad := sorted(owned & {k.replace("-", "_") for k in self.args}):
            raise ValueError(
                f"router args {bad} are set by the harness (the policy is 'policy:'; the "
                "worker URLs, host and ports are the replicas' and free ports)"
            )
        return self


def router_flags(args: dict[str, Scalar]) -> list[str]:
    """``{cache_threshold: 0.5, disable_retries: true, x: false}`` -> ``--cache-threshold 0.5
    --disable-retries`` (a false or null value is left out: the router has no ``--no-`` flags)."""
    out: list[str] = []
    for key, value in args.items():
        if value is None or value is False:
            continue
        name = "--" + key.replace("_", "-")
        out += [name] if value is True else [name, str(value)]
    return out


class ReplicaFields(SpecModel):
    """``replicas: N`` servers of the engine behind ``router:`` (N = 1 with a router measures
    the router's own overhead beside the same engine without one)."""

    replicas: int = Field(
        1, ge=1, description="servers of this engine behind `router:` (more than 1 needs it)"
    )
    router: RouterSpec | None = Field(
        None,
        description="serve the engine by `replicas` behind sglang-router, measured at the "
        "router's URL ([replicas.md](harness/replicas.md))",
    )

    @model_validator(mode="after")
    def _check_replicas(self) -> ReplicaFields:
        kind = getattr(self, "kind", "flashrec")
        if self.replicas > 1 and self.router is None:
            raise ValueError(
                f"replicas: {self.replicas} needs 'router: {{policy: ...}}' (the harness "
                "measures N replicas at one router's URL)"
            )
        if self.router is not None and kind == "external":
            raise ValueError("'router' and 'replicas' are for launched engines, not 'external'")
        if self.router is not None and getattr(self, "port", None) is not None:
            raise ValueError("'port' cannot be fixed for replicas: each gets a free port")
        return self
