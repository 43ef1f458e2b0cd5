"""Test plants: deliberate faults that tests (and ``scripts/gate_calibration.py``) switch on in
processes they start, through environment variables, so that the checks around the engine
can be shown to catch them. Nothing here ships in ``flashrec/``.

- ``FLASHREC_TEST_STEP_DELAY_MS``: every step an ``EngineLoop`` runs sleeps this long after
  it (a planted slowdown: the A/B gate tests, requests kept in flight for drain and cancel
  tests).
- ``FLASHREC_TEST_STEP_GATE``: a file path; every step an ``EngineLoop`` runs then waits until
  that file exists (at most ``GATE_MAX_S``): requests held in flight, on any machine, until
  the test has done what it must while they are (cancel tests across processes).
- ``FLASHREC_TEST_PLANT_ID_CACHE``: the historical drift bug, a host cache of prompt slots
  keyed by ``id(state)``: CPython reuses addresses, so a later request may decode against an
  earlier one's prompt slots (harness/determinism must catch and localise it).
- ``FLASHREC_CALIB_SPIN_US``: a busy-wait after every ``Scheduler.step`` (CPU work like a
  real regression, for the gate's calibration).
- ``FLASHREC_TEST_RELOAD_GATE``: a file path; every catalog hot reload (``Engine.build_catalog``)
  first waits until that file exists (at most ``GATE_MAX_S``; meanwhile ``<path>.waiting``
  exists): a reload held in flight while the test shuts the server down.

``sitecustomize.py`` beside this file installs the plants at interpreter start where one of
the variables is set; each patch lands when its engine module is first imported (an import
hook), so a process that never imports the engine pays nothing.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import time

STEP_DELAY_ENV = "FLASHREC_TEST_STEP_DELAY_MS"
STEP_GATE_ENV = "FLASHREC_TEST_STEP_GATE"
GATE_MAX_S = 120.0  # a test that never opens its gate fails on its own timeouts, not hangs
ID_CACHE_ENV = "FLASHREC_TEST_PLANT_ID_CACHE"
SPIN_ENV = "FLASHREC_CALIB_SPIN_US"
RELOAD_GATE_ENV = "FLASHREC_TEST_RELOAD_GATE"
ENVS = (STEP_DELAY_ENV, STEP_GATE_ENV, ID_CACHE_ENV, SPIN_ENV, RELOAD_GATE_ENV)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks[name](module)`` once module ``name`` has executed (first import only)."""

    def __init__(self) -> None:
        self.hooks: dict[str, list] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        hooks = self.hooks.pop(name)
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_patch(module) -> None:
            exec_module(module)
            for hook in hooks:
                hook(module)

        spec.loader.exec_module = exec_then_patch
        return spec


_finder = _AfterImport()


def after_import(name: str, hook) -> None:
    """``hook(module)`` now if ``name`` is imported, else right after its first import."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    _finder.hooks.setdefault(name, []).append(hook)


# ---- the plants ----------------------------------------------------------------------------
def slow_loop_init(init, delay_s: float = 0.0, gate: str = ""):
    """``EngineLoop.__init__`` whose loop's scheduler sleeps ``delay_s`` after every step, then
    (given ``gate``, a path) waits until that file exists."""

    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        step = self.scheduler.step

        def slow_step():
            out = step()
            time.sleep(delay_s)
            deadline = time.monotonic() + GATE_MAX_S
            while gate and not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
            return out

        self.scheduler.step = slow_step

    __init__.planted = True
    return __init__


def id_cached_run(run, key=id):
    """``PrefillManager.run`` behind a host cache of prompt slots keyed by ``key(state)``
    (``id``: stale once CPython reuses an address). The stale slots reach the decode kernels
    (``prompt_slots_np``) and the step hashes (``prompt_slots_t``); the prefill itself is
    clean, as in the original bug."""

    def planted_run(self, batch, running):
        out = run(self, batch, running)
        if not out:  # the batch prefilled and joins ``running``
            cache = self.__dict__.setdefault("_planted_slots", {})
            for st in batch:
                st.prompt_slots_t = cache.setdefault(key(st), st.prompt_slots_t)
                st.prompt_slots_np = st.prompt_slots_t.cpu().numpy()
        return out

    planted_run.planted = True
    return planted_run


def spinning_step(step, spin_us: float):
    """``Scheduler.step`` followed by a busy-wait of ``spin_us`` microseconds."""

    def spin_step(self):
        out = step(self)
        end = time.perf_counter() + spin_us / 1e6
        while time.perf_counter() < end:
            pass
        return out

    spin_step.planted = True
    return spin_step


def gated_build(build, gate: str):
    """``Engine.build_catalog`` that first waits until the file ``gate`` exists (and says it
    waits: the file ``gate`` + ``.waiting`` appears)."""

    def gated(self, *args, **kwargs):
        open(gate + ".waiting", "a").close()
        deadline = time.monotonic() + GATE_MAX_S
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return build(self, *args, **kwargs)

    gated.planted = True
    return gated


def install_from_env(environ=os.environ) -> list[str]:
    """Install the plants whose variables are set (non-zero); returns their variables."""
    installed = []
    delay_ms = float(environ.get(STEP_DELAY_ENV, "0") or 0)
    gate = environ.get(STEP_GATE_ENV, "")
    if delay_ms or gate:

        def patch_loop(mod) -> None:
            mod.EngineLoop.__init__ = slow_loop_init(
                mod.EngineLoop.__init__, delay_ms / 1000.0, gate
            )

        after_import("flashrec.engine.loop", patch_loop)
        installed += [env for env, on in ((STEP_DELAY_ENV, delay_ms), (STEP_GATE_ENV, gate)) if on]
    if environ.get(ID_CACHE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):

        def patch_prefill(mod) -> None:
            mod.PrefillManager.run = id_cached_run(mod.PrefillManager.run)

        after_import("flashrec.engine.scheduler.prefill", patch_prefill)
        installed.append(ID_CACHE_ENV)
    spin_us = float(environ.get(SPIN_ENV, "0") or 0)
    if spin_us:

        def patch_step(mod) -> None:
            mod.Scheduler.step = spinning_step(mod.Scheduler.step, spin_us)

        after_import("flashrec.engine.scheduler", patch_step)
        installed.append(SPIN_ENV)
    reload_gate = environ.get(RELOAD_GATE_ENV, "")
    if reload_gate:

        def patch_engine(mod) -> None:
            mod.Engine.build_catalog = gated_build(mod.Engine.build_catalog, reload_gate)

        after_import("flashrec.engine.engine", patch_engine)
        installed.append(RELOAD_GATE_ENV)
    return installed
