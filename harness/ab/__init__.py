"""The A/B gate: both sides served in one run, rounds in pairs, the paired comparison,
``flashrec-bench gate``."""
