"""Numbers from records: per-round and per-cell metrics, statistics, FLOPs and MFU, the
server's own counters."""
