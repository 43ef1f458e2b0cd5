"""Spec -> cells: the product of engines and axes, with ``link`` values and ``exclude`` rules.

Every parameter has a scope. ``server`` parameters become server flags (a change restarts the
server); ``client`` parameters change the load or the requests (the server is reused); ``both``
(``beam_width``) sets the request's ``n`` and, for launched servers, ``--beam-width``. External
servers have no lifecycle, so their cells drop server-scope parameters.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import itertools
import json
import operator
from dataclasses import dataclass, field
from typing import Any

from harness.spec.base import close_hint
from harness.spec.catalogs import catalog_problem, cell_client
from harness.spec.matrix import EngineSpec, MatrixSpec, Scalar, SpecError
from harness.spec.serve_args import check_flashrec_args, flashrec_serve_args

# client setting name -> ClientSettings attribute
CLIENT_KEYS: dict[str, str] = {
    "concurrency": "concurrency",
    "rate": "rate",
    "mode": "mode",
    "duration_s": "duration_s",
    "requests": "requests",
    "warmup_requests": "warmup_requests",
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "seed": "seed",
    "radix": "radix",
    "request_timeout_s": "request_timeout_s",
    "prompt_tokens": "median_tokens",
    "prompt_spread": "spread",
    "system_prompt_tokens": "system_prompt_tokens",
    "catalog": "catalog",  # a named catalog (harness.spec.catalogs)
}
BOTH_KEYS = {"beam_width": "beam_width"}


@dataclass(frozen=True)
class ClientSettings:
    """Everything about the load and the requests of one cell."""

    mode: str
    concurrency: int
    rate: float | None
    duration_s: float | None
    requests: int
    warmup_requests: int
    beam_width: int
    max_tokens: int | None
    temperature: float
    seed: int | None
    radix: str
    request_timeout_s: float
    median_tokens: int
    spread: float
    system_prompt_tokens: int
    catalog: str | None = None  # the catalog name requests carry (None: the server's default)


@dataclass(frozen=True, eq=False)
class Cell:
    """One point of the matrix: an engine, its server flags and its client settings."""

    id: str
    engine: EngineSpec
    params: dict[str, Scalar]
    server_args: dict[str, Scalar]
    client: ClientSettings
    traced: bool = False
    axes: tuple[str, ...] = field(default=())

    @property
    def server_key(self) -> str:
        """Cells with equal keys share one server process."""
        return json.dumps([self.engine.name, sorted(self.server_args.items())], default=str)


def scope_of(name: str, spec: MatrixSpec) -> str:
    """``server``, ``client`` or ``both`` for a parameter name."""
    if name in spec.axis_scope:
        return spec.axis_scope[name]
    if name in BOTH_KEYS:
        return "both"
    return "client" if name in CLIENT_KEYS else "server"


# --------------------------------------------------------------------------- expressions

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_FUNCS = {"min": min, "max": max, "int": int, "round": round, "abs": abs, "float": float}


def evaluate(expr: str, names: dict[str, Any]) -> Any:
    """Evaluate an arithmetic / comparison expression over ``names`` (no other Python)."""
    tree = ast.parse(expr, mode="eval")

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in names:
                return names[node.id]
            if node.id in ("true", "false", "none"):
                return {"true": True, "false": False, "none": None}[node.id]
            raise ValueError(f"unknown name '{node.id}' (known: {', '.join(sorted(names))})")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp):
            val = ev(node.operand)
            if isinstance(node.op, ast.USub):
                return -val
            if isinstance(node.op, ast.UAdd):
                return +val
            if isinstance(node.op, ast.Not):
                return not val
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")

    return ev(tree)


# --------------------------------------------------------------------------- filters


def _fmt(value: Scalar) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    return str(value)


def reference_index(
    params: dict[str, Scalar], overrides: dict[str, str], others: list[dict[str, Scalar]]
) -> int | None:
    """Where in ``others`` (cells' parameters) stand ``params`` with ``overrides`` applied, the
    values compared in their text form (a target's ``relative_to``); None where nowhere."""
    want = {k: _fmt(v) for k, v in params.items()} | overrides
    for i, other in enumerate(others):
        if {k: _fmt(v) for k, v in other.items()} == want:
            return i
    return None


def matches(cell_id: str, params: dict[str, Scalar], filt: str) -> bool:
    """Whether a cell matches a filter: comma-separated terms, all of which must match.

    A term ``key=value`` compares a parameter (glob on its text form); any other term is a glob
    matched anywhere in the cell id (when it holds ``*?[``) or a substring of it.
    """
    for term in (t.strip() for t in filt.split(",")):
        if not term:
            continue
        if "=" in term:
            key, _, pattern = term.partition("=")
            if key not in params or not fnmatch.fnmatchcase(_fmt(params[key]), pattern):
                return False
        elif any(c in term for c in "*?["):
            if not fnmatch.fnmatchcase(cell_id, f"*{term}*"):
                return False
        elif term not in cell_id:
            return False
    return True


# --------------------------------------------------------------------------- expansion


def param_names(spec: MatrixSpec) -> list[str]:
    """The swept parameter names: the axes, or every key of the explicit ``cells:`` list."""
    names = list(spec.axes)
    for entry in spec.cells or []:
        names += [k for k in entry if k not in names]
    return names


def _combos(spec: MatrixSpec) -> list[tuple[list[str], dict[str, Scalar]]]:
    """(shown parameter names, values) of every point: the axes' product or the cell list."""
    if spec.cells is not None:
        return [(list(entry), dict(entry)) for entry in spec.cells]
    names = list(spec.axes)
    return [
        (names, dict(zip(names, combo)))
        for combo in itertools.product(*(spec.axes[a] for a in names))
    ]


def _excluded(spec: MatrixSpec, params: dict[str, Scalar]) -> bool:
    for i, rule in enumerate(spec.exclude):
        if isinstance(rule, str):
            try:
                if evaluate(rule, params):
                    return True
            except ValueError as exc:
                raise SpecError("", 0, f"exclude.{i}", str(exc)) from None
            continue
        for key in rule:
            if key not in param_names(spec) and key not in spec.link and key != "engine":
                raise SpecError("", 0, f"exclude.{i}.{key}", "not an axis or link name")
        hit = all(
            key in params
            and (params[key] in want if isinstance(want, list) else params[key] == want)
            for key, want in rule.items()
        )
        if hit:
            return True
    return False


def _client(spec: MatrixSpec, params: dict[str, Scalar]) -> ClientSettings:
    load, wl = spec.load, spec.workload
    values: dict[str, Any] = {
        "mode": load.mode,
        "concurrency": load.concurrency,
        "rate": load.rate,
        "duration_s": load.duration_s,
        "requests": wl.requests,
        "warmup_requests": wl.warmup_requests,
        "beam_width": load.beam_width,
        "max_tokens": load.max_tokens,
        "temperature": load.temperature,
        "seed": load.seed,
        "radix": load.radix,
        "request_timeout_s": load.request_timeout_s,
        "median_tokens": wl.median_tokens,
        "spread": wl.spread,
        "system_prompt_tokens": wl.system_prompt_tokens,
        "catalog": load.catalog,
    }
    for name, value in params.items():
        attr = CLIENT_KEYS.get(name) or BOTH_KEYS.get(name)
        if attr and scope_of(name, spec) in ("client", "both"):
            values[attr] = value
    return ClientSettings(**values)


def _check_scopes(spec: MatrixSpec) -> None:
    for name, scope in spec.axis_scope.items():
        if name not in param_names(spec) and name not in spec.link:
            raise SpecError("", 0, f"axis_scope.{name}", "not an axis or link name")
        if scope in ("client", "both") and name not in CLIENT_KEYS and name not in BOTH_KEYS:
            known = ", ".join(sorted({*CLIENT_KEYS, *BOTH_KEYS}))
            raise SpecError("", 0, f"axis_scope.{name}", f"not a client setting (known: {known})")
    for name in spec.link:
        if name in param_names(spec) or name == "engine":
            raise SpecError("", 0, f"link.{name}", "a link cannot redefine an axis")


def _traced(spec: MatrixSpec, cell_id: str, params: dict[str, Scalar], first: bool) -> bool:
    sel = spec.trace.cells
    if sel == "none":
        return False
    if sel == "all":
        return True
    if sel == "first":
        return first
    return any(matches(cell_id, params, f) for f in sel)


def expand_cells(spec: MatrixSpec) -> list[Cell]:
    """All cells of the matrix, ordered so that cells sharing a server run back to back.

    The points are the product of ``axes``, or the explicit ``cells:`` list (heterogeneous
    cells: each entry names its own parameters, which also make its id).

    Raises :class:`SpecError` (with the field, and line 0) for bad link / exclude rules.
    """
    _check_scopes(spec)
    _check_unlaunched_axes(spec)
    cells: list[Cell] = []
    seen: set[str] = set()
    checked: dict[str, str | None] = {}  # flag set -> flashrec serve's objection (None: ok)
    for engine in spec.engine_list:
        for axis_names, values in _combos(spec):
            params: dict[str, Scalar] = {"engine": engine.name, **values}
            for name, rule in spec.link.items():
                if isinstance(rule, str):
                    try:
                        params[name] = evaluate(rule, params)
                    except (ValueError, SyntaxError, TypeError, ZeroDivisionError) as exc:
                        raise SpecError("", 0, f"link.{name}", str(exc)) from None
                else:
                    params[name] = rule
            _engine_links(spec, engine, params)
            if _excluded(spec, params):
                continue
            problem = catalog_problem(spec, engine, params)
            if problem:
                where = "catalog" in params and _origin(spec, engine, "catalog")[0]
                raise SpecError("", 0, where or "load.catalog", problem)
            if not engine.launched:
                params = {
                    k: v
                    for k, v in params.items()
                    if k == "engine" or scope_of(k, spec) != "server"
                }
            shown = [a for a in axis_names if a in params]
            cell_id = ",".join([engine.name] + [f"{a}={_fmt(params[a])}" for a in shown])
            if cell_id in seen:
                continue
            seen.add(cell_id)
            server_args: dict[str, Scalar] = {}
            if engine.launched:
                server_args = dict(engine.args)
                for k, v in params.items():
                    if k != "engine" and scope_of(k, spec) in ("server", "both"):
                        server_args[k] = v
            if engine.kind == "flashrec":
                try:
                    server_args = _flashrec_args(cell_id, server_args, checked)
                except SpecError as exc:
                    raise _place_unknown_flag(spec, engine, exc) from None
            cells.append(
                Cell(
                    id=cell_id,
                    engine=engine,
                    params=params,
                    server_args=server_args,
                    client=cell_client(_client(spec, params), engine),
                    traced=_traced(spec, cell_id, params, first=not cells),
                    axes=tuple(shown),
                )
            )
    order = {key: i for i, key in reversed(list(enumerate(c.server_key for c in cells)))}
    return sorted(cells, key=lambda c: order[c.server_key])


def _engine_links(spec: MatrixSpec, engine: EngineSpec, params: dict[str, Scalar]) -> None:
    """Add ``engine.link``'s values to one of its cells' parameters (a None value adds
    nothing): the knobs this engine's own docs recommend for the cell."""
    i = spec.engine_list.index(engine)
    for name, rule in engine.link.items():
        where = f"engines.{i}.link.{name}" if spec.engines is not None else f"engine.link.{name}"
        if name in param_names(spec) or name == "engine":
            raise SpecError("", 0, where, "an engine's link cannot redefine an axis")
        try:
            value = evaluate(rule, params) if isinstance(rule, str) else rule
        except (ValueError, SyntaxError, TypeError, ZeroDivisionError) as exc:
            raise SpecError("", 0, where, str(exc)) from None
        if value is not None:
            params[name] = value


def group_by_server(cells: list[Cell]) -> list[list[Cell]]:
    """Consecutive runs of cells that share a server (input order kept)."""
    groups: list[list[Cell]] = []
    for cell in cells:
        if groups and groups[-1][0].server_key == cell.server_key:
            groups[-1].append(cell)
        else:
            groups.append([cell])
    return groups


def select(spec: MatrixSpec, cells: list[Cell], filters: list[str] | None) -> list[Cell]:
    """The cells matching any of ``filters`` (all when none); ``trace: first`` follows along."""
    if not filters:
        return cells
    chosen = [c for c in cells if any(matches(c.id, c.params, f) for f in filters)]
    if spec.trace.cells == "first" and chosen and not any(c.traced for c in chosen):
        chosen[0] = dataclasses.replace(chosen[0], traced=True)
    return chosen


def _flashrec_args(
    cell_id: str, args: dict[str, Scalar], checked: dict[str, str | None]
) -> dict[str, Scalar]:
    """A flashrec cell's server flags, as ``flashrec serve`` takes them, checked by its own
    parser now: a flag it rejects fails the matrix here (and in ``--dry-run``), not minutes
    later when that cell's server exits during start."""
    args = flashrec_serve_args(args)
    key = json.dumps(sorted(args.items()), default=str)
    if key not in checked:
        checked[key] = check_flashrec_args(args)
    if checked[key] is not None:
        raise SpecError("", 0, "cells", f"cell {cell_id}: flashrec serve: {checked[key]}")
    return args


def _serve_options() -> list[str]:
    """The parameter names ``flashrec serve`` has a flag for."""
    from flashrec.config import ServerConfig

    return [f.name for f in dataclasses.fields(ServerConfig)]


def _origin(spec: MatrixSpec, engine: EngineSpec, name: str) -> tuple[str, str]:
    """Where parameter ``name`` is set (its field path) and what it is there."""
    if name in spec.axes:
        return f"axes.{name}", "axis"
    for i, entry in enumerate(spec.cells or []):
        if name in entry:
            return f"cells.{i}.{name}", "cell parameter"
    if name in spec.link:
        return f"link.{name}", "link"
    if name in engine.link:
        prefix = (
            "engine" if spec.engine is not None else f"engines.{spec.engine_list.index(engine)}"
        )
        return f"{prefix}.link.{name}", "engine link"
    if spec.engine is not None:
        return f"engine.args.{name}", "server arg"
    return f"engines.{spec.engine_list.index(engine)}.args.{name}", "server arg"


def _place_unknown_flag(spec: MatrixSpec, engine: EngineSpec, exc: SpecError) -> SpecError:
    """A flag ``flashrec serve`` does not know, reported at the line of the parameter that
    made it (the axis, link, cell entry or engine arg), with the closest known name: a
    misspelled client setting (``concurency``) becomes a server flag, else reported only as
    the server's "unrecognized arguments"."""
    _, sep, rest = exc.message.partition("unrecognized arguments: ")
    if not sep:
        return exc
    names = [w[2:].replace("-", "_") for w in rest.split() if w.startswith("--")]
    args = {*param_names(spec), *spec.link, *engine.args, *engine.link}
    for name in names:
        name = name if name in args else name.removeprefix("no_")
        if name not in args:
            continue
        field_path, what = _origin(spec, engine, name)
        known = [*CLIENT_KEYS, *BOTH_KEYS, *_serve_options()]
        hint = close_hint(name, known)
        message = (
            f"{what} '{name}' is neither a client setting nor a flashrec serve flag "
            f"({hint}); {exc.message}"
        )
        return SpecError("", 0, field_path, message)
    return exc


def _check_unlaunched_axes(spec: MatrixSpec) -> None:
    """With no launched engine, a server-scope axis has nothing to set and every cell would
    drop it: a misspelled client setting (``concurency``) would be ignored without a word."""
    if any(e.launched for e in spec.engine_list):
        return
    for name in param_names(spec):
        if scope_of(name, spec) == "server":
            field_path, what = _origin(spec, spec.engine_list[0], name)
            hint = close_hint(name, [*CLIENT_KEYS, *BOTH_KEYS])
            raise SpecError(
                "", 0, field_path,
                f"{what} '{name}' is not a client setting ({hint}), and no engine launches a "
                "server whose flag it could be (external servers take client settings only)",
            )  # fmt: skip
