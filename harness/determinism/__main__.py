"""``python -m harness.determinism`` = ``flashrec-bench determinism``."""

from __future__ import annotations

import sys

from harness.determinism.cli import main

sys.exit(main())
