"""The CLI side of the config dataclasses: one ``--flag`` per field, its default and one-line
help read off the field (``opt``), and the checks argparse would make for a config built
without it."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import field
from typing import Any


def opt(
    default: Any, help: str, choices: tuple | None = None, flag: bool = False, repeat: bool = False
) -> Any:
    """A config field and its ``--flag``; ``repeat``: the flag may be given several times (the
    field then holds a tuple of the values, or the one value given once)."""
    meta = {"help": help, "choices": choices, "flag": flag}
    if repeat:
        meta["repeat"] = True
    return field(default=default, metadata=meta)


def check_choice(config: Any, name: str) -> None:
    """ValueError unless field ``name`` of ``config`` holds one of its declared ``choices``
    (what argparse checks for a flag, checked here for a config built without it)."""
    choices = next(f for f in dataclasses.fields(config) if f.name == name).metadata["choices"]
    value = getattr(config, name)
    if value not in choices:
        words = ", ".join(choices[:-1]) + " or " + choices[-1]
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"{flag} must be {words}, got {value!r}")


def uvloop_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def add_config_args(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one ``--flag`` per dataclass field of ``cls`` (defaults and help from the class)."""
    for f in dataclasses.fields(cls):
        name = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        if meta.get("help"):  # argparse formats help with %: a literal % must be %%
            meta["help"] = meta["help"].replace("%", "%%")
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if kind in ("bool", "bool | None"):  # None: auto, resolved by the config
            parser.add_argument(
                name,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=meta.get("help"),
            )
            continue
        if meta.get("repeat"):
            parser.add_argument(
                name, dest=f.name, action="append", default=f.default, help=meta.get("help")
            )
            continue
        conv: Any = str
        if kind.startswith("int"):
            conv = int
        elif kind.startswith("float"):
            conv = float
        parser.add_argument(
            name,
            dest=f.name,
            type=conv,
            default=f.default,
            choices=meta.get("choices"),
            help=meta.get("help"),
        )


def config_from_args(cls: type, args: argparse.Namespace, **overrides: Any):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    return cls(**values)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """The environment variable ``name`` (``default`` when unset), one of ``choices``: a
    ValueError naming them otherwise (the A/B knobs read at import: a typo fails the start)."""
    value = os.environ.get(name, default)
    if value not in choices:
        names = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise ValueError(f"{name} must be {names}, got {value!r}")
    return value
