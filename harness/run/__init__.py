"""The run: one cell's rounds, the run over every cell, the stages registry (quality per cell;
parity and determinism after the cells), its environment and progress line."""
