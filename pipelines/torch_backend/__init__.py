"""The torch DataLoader backends: ``pageable`` (baseline) and ``pinned`` (async, multi-stream)."""
