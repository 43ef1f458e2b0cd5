"""``flashrec-bench``: the command line, one module per subcommand, wiring the harness's
packages (spec -> run -> judge -> write). Nothing imports this package.

Exit codes: 0 ok; 1 a gate failed, a ``fail_run`` target was missed or
``--fail-on-regression`` found a regression; 2 usage or
matrix error; 3 one or more cells failed (report still written); 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys

from harness.cli.commands import COMMANDS


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flashrec-bench`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        module, func = COMMANDS[argv[0]].split(":")
        return int(getattr(importlib.import_module(module), func)(argv[1:]))
    from harness.cli.run import main as run_main

    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
