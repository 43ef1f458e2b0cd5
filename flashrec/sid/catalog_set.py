"""The catalogs one server holds by name (``--sid-vocab-file NAME=PATH``, repeatable): each
name's served version, its version number (1 at start-up; each reload takes the next number
never used for that name, a rollback returns to the previous one's), and the version it
replaced, which ``POST /rollback_catalog`` returns to. Plain data: the engine swaps versions in between steps
(``Engine.swap_catalog``), the server reads ``info`` for ``/get_server_info`` and ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashrec.config.engine import unknown_catalog
from flashrec.sid.version import CatalogVersion


class UnknownCatalogError(ValueError):
    """A request or control call named a catalog the server does not hold (a 400)."""


class NoPreviousCatalogError(ValueError):
    """``/rollback_catalog`` for a catalog with no previous version (a 400)."""


@dataclass
class NamedCatalog:
    """One name's served catalog, its version number and the one it replaced."""

    name: str
    current: CatalogVersion
    version: int = 1
    previous: CatalogVersion | None = None
    previous_version: int | None = None
    issued: int = 1  # the highest version number given out for this name

    def info(self, default: bool) -> dict:
        """``/get_server_info``'s entry: identity, version, device bytes and the previous one."""
        out = {"name": self.name, "default": default, "version": self.version}
        out.update(self.current.info())
        out["device_bytes"] = _device_bytes(self.current)
        out["previous"] = None
        if self.previous is not None:
            prev = {"version": self.previous_version, **self.previous.info()}
            prev["device_bytes"] = _device_bytes(self.previous)
            out["previous"] = prev
        return out


def _device_bytes(version: CatalogVersion) -> int:
    return version.trie.nbytes() if version.trie is not None else 0


class CatalogSet:
    """Named catalogs, the first one the default (requests that name none use it)."""

    def __init__(self, named: list[tuple[str, CatalogVersion]]) -> None:
        if not named:
            raise ValueError("a catalog set holds at least one catalog")
        self._by_name = {name: NamedCatalog(name, version) for name, version in named}
        self.default = named[0][0]
        self._info = self._describe()

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def entry(self, name: str | None) -> NamedCatalog:
        """The entry of ``name`` (None: the default); UnknownCatalogError naming the held ones."""
        key = self.default if name is None else name
        try:
            return self._by_name[key]
        except KeyError:
            raise UnknownCatalogError(unknown_catalog(key, self._by_name)) from None

    def get(self, name: str | None) -> CatalogVersion:
        """The served version of ``name`` (None: the default)."""
        return self.entry(name).current

    def install(self, name: str | None, version: CatalogVersion) -> NamedCatalog:
        """``version`` becomes ``name``'s served one; the one it replaces is kept for a
        rollback (only the last: an older one is dropped)."""
        e = self.entry(name)
        e.previous, e.previous_version = e.current, e.version
        e.issued += 1
        e.current, e.version = version, e.issued
        self._info = self._describe()
        return e

    def rollback_target(self, name: str | None) -> NamedCatalog:
        """The entry of ``name`` if it has a previous version to return to, else
        NoPreviousCatalogError (UnknownCatalogError for an unknown name)."""
        e = self.entry(name)
        if e.previous is None or e.previous_version is None:
            raise NoPreviousCatalogError(
                f"catalog {e.name!r} has no previous version to roll back to (version "
                f"{e.version} is the first served, or a rollback already returned to it)"
            )
        return e

    def rollback(self, name: str | None) -> NamedCatalog:
        """``name`` serves its previous version again (its number too); the rolled-back
        version is dropped. NoPreviousCatalogError when there is none."""
        e = self.rollback_target(name)
        assert e.previous is not None and e.previous_version is not None
        e.current, e.version = e.previous, e.previous_version
        e.previous = e.previous_version = None
        self._info = self._describe()
        return e

    def live(self) -> list[CatalogVersion]:
        """Every version held: each name's served one and its previous."""
        out = []
        for e in self._by_name.values():
            out.append(e.current)
            if e.previous is not None:
                out.append(e.previous)
        return out

    def info(self) -> list[dict]:
        """Every catalog's ``/get_server_info`` entry, made at each change (not per read: the
        engine snapshots its stats every step). Read-only."""
        return self._info

    def _describe(self) -> list[dict]:
        return [e.info(e.name == self.default) for e in self._by_name.values()]
