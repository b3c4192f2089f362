"""Developer tools, run from a clone, not installed: ``python -m tools.microbench``, ``tools.fuzz``."""
