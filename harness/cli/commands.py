"""The subcommands of ``flashrec-bench`` and its exit codes."""

from __future__ import annotations

# subcommand -> "module:function"; the function takes argv (list[str]) and returns an exit code;
# without a subcommand the argv runs a matrix (harness.cli.run)
COMMANDS: dict[str, str] = {
    "compare": "harness.cli.compare:main",
    "determinism": "harness.determinism:main",
    "eval": "harness.quality.cli:main",
    "eval-dataset": "harness.quality.generate:main",
    "gate": "harness.ab.gate:main",
    "quick": "harness.quick:main",
    "reference-server": "harness.servers.reference_server:main",
    "witness": "harness.witness.run:main",
}
EXIT_GATE, EXIT_USAGE, EXIT_CELLS, EXIT_INTERRUPT = 1, 2, 3, 130
