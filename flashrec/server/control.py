"""Control calls that may run long (a catalog reload) as the shutdown sees them: on a daemon
thread that no exit waits for, and in flight like a generation, so that the drain waits for
them up to ``--shutdown-timeout-s`` and then answers them 503."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from flashrec.server.errors import busy


def detached(fn: Callable[..., Any], *args: Any, name: str) -> asyncio.Future:
    """``fn(*args)`` on a daemon thread of its own, as an awaitable: unlike ``to_thread``
    (the loop's executor, joined at exit), a call that never returns cannot hold the
    process's exit."""
    aloop = asyncio.get_running_loop()
    fut = aloop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)

    def run() -> None:
        try:
            value, exc = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - raised again on the awaiting side
            value, exc = None, e
        try:
            aloop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:
            pass  # the event loop is closed: nobody awaits it any more

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


async def in_flight(st: Any, call: asyncio.Future, what: str) -> Any:
    """Await ``call`` as an in-flight request of the server state ``st`` (``ServerState``):
    past the drain deadline it is cancelled and this raises 503 naming ``what``."""
    task = asyncio.current_task()
    assert task is not None
    st.backend.active_handlers += 1
    st.held.add(task)
    try:
        return await call
    except asyncio.CancelledError:
        if not st.closing:  # the client left: cancelled as any request
            raise
        task.uncancel()
        raise busy(f"the server shut down before this {what} finished") from None
    finally:
        st.backend.active_handlers -= 1
        st.held.discard(task)
