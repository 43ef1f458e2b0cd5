"""``flashrec-bench soak``: load at a fixed rate for a long time, a fixed probe whose answer
must not change, per-interval resource samples of every server process, and a trend fit per
resource that fails one that grows (docs/harness/soak.md)."""
