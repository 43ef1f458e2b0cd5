"""Semantic IDs: where their tokens sit (``layout``), the catalog of valid SIDs (``catalog``,
reading files through ``rows`` and ``parquet``; ``catalog_report`` for ``flashrec catalog``)
and the catalog as a tensor trie that constrains beam search (``trie``).

Import the submodules directly; this package imports nothing so that ``layout`` and
``catalog`` stay free of torch.
"""
