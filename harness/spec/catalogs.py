"""Named catalogs of a matrix and the ``catalog`` cell parameter that picks one.

A matrix declares ``catalogs: {NAME: PATH, ...}`` (the first is the default); a launched
FlashRec gets one ``--sid-vocab-file NAME=PATH`` per catalog. A cell parameter ``catalog: NAME``
(an axis, a ``cells`` entry, a ``link``) makes every request of the cell carry the name (the
chat body's ``catalog``, ``sampling_params.catalog`` of ``/generate``) and checks the cell's
SIDs against that catalog. Engines that take no catalog name (``kind: command`` peers such as
SGLang) serve the default alone: a cell of theirs may name only the default, and sends no name.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import Field

# a catalog name as ``flashrec serve --sid-vocab-file NAME=PATH`` takes it
CATALOG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
PARAM = "catalog"  # the cell parameter
# the matrix's ``catalogs:`` key (its description is the reference's, docs/harness-reference.md)
CATALOGS_FIELD: Any = Field(
    {},
    description="named catalogs `NAME: PATH`, the first the default: a launched FlashRec gets "
    "each as `--sid-vocab-file NAME=PATH`; a cell parameter `catalog: NAME` makes its requests "
    "name one and checks its SIDs against it",
)
LOAD_CATALOG_FIELD: Any = Field(
    None,
    description="the named catalog (of `catalogs:`) every cell's requests name and its SIDs are "
    "checked against, where the cell sets no `catalog`; unset: none named, the default",
)


def check_catalog_map(catalogs: dict[str, str], single: Any) -> dict[str, str]:
    """``catalogs:`` checked: names a server takes, a path each, not beside ``catalog.path``
    (one catalog) -- ValueError naming the problem."""
    for name, path in catalogs.items():
        if not CATALOG_NAME.fullmatch(name):
            raise ValueError(
                f"catalog name {name!r}: letters, digits, '_', '.', '-' (at most 64, not "
                "starting with '.' or '-'), as flashrec serve's --sid-vocab-file NAME=PATH"
            )
        if not str(path).strip():
            raise ValueError(f"catalog {name!r} has no path")
    if catalogs and single is not None and getattr(single, "path", None):
        raise ValueError(
            "give 'catalog: {path: ...}' (one catalog) or 'catalogs: {NAME: PATH, ...}' "
            "(named catalogs, the first the default), not both"
        )
    return catalogs


def declared(spec: Any) -> list[str]:
    """The matrix's catalog names, the default first (empty: none declared)."""
    return list(spec.catalogs)


def named(value: Any) -> str | None:
    """A ``catalog`` parameter's value as a name (None: the default, no name sent)."""
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def catalog_problem(spec: Any, engine: Any, params: dict) -> str | None:
    """Why a cell's ``catalog`` parameter is wrong (None: fine or not set): a name the matrix
    does not declare, or a catalog other than the default for an engine that cannot take a
    name."""
    name = named(params.get(PARAM, spec.load.catalog))
    if name is None:
        return None
    names = declared(spec)
    if not names:
        return (
            f"cell parameter 'catalog: {name}' names a catalog, but the matrix declares none "
            "(add 'catalogs: {NAME: PATH, ...}', the first the default)"
        )
    if name not in names:
        return f"catalog {name!r} is not declared in 'catalogs:' (declared: {', '.join(names)})"
    if engine.kind == "command" and name != names[0]:
        return (
            f"engine {engine.name!r} (kind command) takes no catalog name: it serves the "
            f"default catalog {names[0]!r} alone, so its cells cannot pick {name!r} "
            "(run that catalog on a flashrec or external engine)"
        )
    return None


def cell_client(client: Any, engine: Any) -> Any:
    """A cell's client settings with the catalog name its requests carry: the name as text,
    and none for an engine that takes no catalog name (a ``kind: command`` peer)."""
    name = named(client.catalog)
    if engine.kind == "command":
        name = None
    return dataclasses.replace(client, catalog=name) if name != client.catalog else client


def catalog_paths(catalogs: tuple) -> dict[str, str]:
    """NAME -> PATH of a resolved model's ``catalogs`` (``(name, path, hash)`` triples)."""
    return {c[0]: c[1] for c in catalogs}
