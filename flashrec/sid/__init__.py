"""Semantic IDs: where their tokens sit (``layout``), the catalog of valid SIDs (``catalog``)
and the catalog as a tensor trie that constrains beam search (``trie``).

Import the submodules directly; this package imports nothing so that ``layout`` and
``catalog`` stay free of torch.
"""
