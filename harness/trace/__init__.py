"""Profiler traces: capture around a round, and the summary read from a trace file."""
