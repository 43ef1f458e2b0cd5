"""Judging reports: gates, targets, and the comparison of two runs."""
