"""Recommendation quality: datasets and sid2pid maps, asking a server and scoring its answers
(evaluate), the planted dataset (generate), and the matrix's per-cell ``quality:`` stage."""
