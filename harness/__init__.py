"""flashrec-bench: declarative benchmark matrices for FlashRec and other beam servers.

Data flows one way: spec -> run -> judge -> write (records -> metrics -> report).
See ``docs/harness.md`` (guide) and ``docs/harness-reference.md`` (every matrix key).
"""

from __future__ import annotations

SCHEMA_VERSION = 1
