"""The engine in a process of its own (``--engine-process``, on by default on GPU).

In one process the engine thread and the HTTP side (event loop, request parsing, chat
templates, response text) take turns holding one GIL: every response built or request parsed
is time in which the engine thread cannot launch the next kernel, and the engine's launches in
turn delay the answers. Here the engine, its scheduler, the profiler and the engine's GC watch
live in a child process; the server process keeps HTTP, tokenization and response text::

    server process                               engine process (spawned)
      handlers -> Backend -> RemoteEngine --Submit(req) / Cancel(rid)-->  reader -> EngineLoop
                  (futures: EngineProcess) <--Result / RequestError--  sender <- engine thread
                 RemoteProfiler / stats  --Call(id, name, args)-->  call thread
                                         <--Reply / CallError------

- ``messages``: the typed messages and the encoding of results and exceptions;
- ``child``: the engine process's main and its serve loop;
- ``proxy``: ``EngineProcess``, the server process's end of the pipe;
- ``facades``: ``RemoteEngine`` (the server's ``ServedEngine``, as ``EngineLoop`` is in one
  process) and ``RemoteProfiler``, so ``create_app`` and the handlers do not know which mode
  runs.

Start-up is unchanged from the outside: ``start_engine_process`` returns once the child has
built the engine (or raises with the child's error, e.g. a failed CUDA graph capture). If the
child dies, every waiting request fails with an engine error, ``/health`` turns 503 and the
cause is logged.
"""

from flashrec.server.engine_process.child import child_main
from flashrec.server.engine_process.facades import (
    RemoteEngine,
    RemoteProfiler,
    start_engine_process,
)
from flashrec.server.engine_process.messages import result_from_wire, result_to_wire
from flashrec.server.engine_process.proxy import EngineClient, EngineProcess, EngineProcessError

__all__ = [
    "EngineClient",
    "EngineProcess",
    "EngineProcessError",
    "RemoteEngine",
    "RemoteProfiler",
    "child_main",
    "result_from_wire",
    "result_to_wire",
    "start_engine_process",
]
