"""The report: report.json and its files, and one module per output format (REPORT.md,
report.html, compare.md)."""
