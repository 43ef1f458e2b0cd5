"""flashrec-bench: declarative benchmark matrices for FlashRec and other beam servers.

Data flows one way: spec -> cells -> runs -> records -> metrics -> report -> gate.
See ``docs/harness.md`` for the YAML schema, the CLI and the report format.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
