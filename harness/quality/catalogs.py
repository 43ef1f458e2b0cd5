"""``flashrec-bench eval``'s named catalogs: ``--catalogs NAME=PATH`` (repeatable, the first the
default) and ``--task-catalog TASK=NAME`` (repeatable): RecIF's tasks (video, ad, product, ...)
each asked over its own item pool, and each task's invalid rate checked against that pool."""

from __future__ import annotations

from collections.abc import Iterable

from harness.spec.catalogs import CATALOG_NAME


def _pairs(items: list[str] | None, flag: str, what: str) -> list[tuple[str, str]]:
    out = []
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"{flag} {item!r}: expected {what}")
        out.append((key.strip(), value.strip()))
    return out


def parse_catalogs(items: list[str] | None) -> dict[str, str]:
    """``--catalogs`` as NAME -> PATH, the default first; ValueError for a malformed pair, a
    name a server does not take, or a name given twice."""
    out: dict[str, str] = {}
    for name, path in _pairs(items, "--catalogs", "NAME=PATH"):
        if not CATALOG_NAME.fullmatch(name):
            raise ValueError(
                f"--catalogs {name}={path}: {name!r} is no catalog name (letters, digits, "
                "'_', '.', '-'; at most 64)"
            )
        if name in out:
            raise ValueError(f"--catalogs: catalog {name!r} given twice")
        out[name] = path
    return out


def parse_task_catalogs(
    items: list[str] | None, catalogs: dict[str, str], tasks: Iterable[str]
) -> dict[str, str]:
    """``--task-catalog`` as TASK -> NAME; ValueError for a malformed pair, a task given
    twice, a task no sample has, or a name ``--catalogs`` does not declare."""
    pairs = _pairs(items, "--task-catalog", "TASK=NAME")
    if pairs and not catalogs:
        raise ValueError("--task-catalog needs --catalogs NAME=PATH (the catalogs it names)")
    known = sorted(set(tasks))
    out: dict[str, str] = {}
    for task, name in pairs:
        if task in out:
            raise ValueError(f"--task-catalog: task {task!r} given twice")
        if task not in known:
            raise ValueError(
                f"--task-catalog {task}={name}: no sample has task {task!r} "
                f"(the dataset's tasks: {', '.join(known)})"
            )
        if name not in catalogs:
            raise ValueError(
                f"--task-catalog {task}={name}: catalog {name!r} is not given by --catalogs "
                f"(given: {', '.join(catalogs)})"
            )
        out[task] = name
    return out
