"""Baselines measured in the same run: HF transformers generate per cell, in its own process."""
