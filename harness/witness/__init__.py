"""flashrec-bench witness: GuideLLM beside flashrec-bench on one cell."""
