"""FlashRec: a serving engine for generative recommendation (semantic-ID beam search)."""

__version__ = "0.1.0"
