"""The subcommands of ``flashrec-bench`` and its exit codes."""

from __future__ import annotations

# subcommand -> "module:function"; the function takes argv (list[str]) and returns an exit code;
# without a subcommand the argv runs a matrix (harness.cli.run)
COMMANDS: dict[str, str] = {
    "compare": "harness.cli.compare:main",
    "determinism": "harness.cli.determinism:main",
    "eval": "harness.cli.eval:main",
    "eval-dataset": "harness.cli.eval_dataset:main",
    "gate": "harness.cli.gate:main",
    "quick": "harness.cli.quick:main",
    "reference-server": "harness.cli.reference_server:main",
    "soak": "harness.cli.soak:main",
    "witness": "harness.cli.witness:main",
}
EXIT_GATE, EXIT_USAGE, EXIT_CELLS, EXIT_INTERRUPT = 1, 2, 3, 130
