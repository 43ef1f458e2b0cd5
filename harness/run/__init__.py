"""The campaign: one cell's rounds, the run over every cell, its environment and progress line."""
