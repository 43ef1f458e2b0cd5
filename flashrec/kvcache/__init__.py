"""KV memory below the engine: the prompt pool and per-beam-row decode buffer (``pool``) and
the radix prefix cache over the pool's slots (``radix``).

Layers and the engine import this package; it imports nothing from ``flashrec.engine``,
``flashrec.layers`` or ``flashrec.server``.
"""
