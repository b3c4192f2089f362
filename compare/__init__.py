"""The comparison suite: ``python -m compare`` runs every backend on the same files, augmentation
and model step, and reports throughput, data wait, GPU idle %, % of the model-only ceiling and
speed-up over the pageable baseline."""
