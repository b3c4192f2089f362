"""Data sources: what a dataset root holds and how to read one sample's bytes.

``root`` opens any root (``open_source``); ``folder`` lists an ImageFolder tree, ``lists`` a
CSV/TSV/text file list and ``shards`` WebDataset tar shards; ``cache`` keeps listings and shard
indexes between runs; ``validate`` checks a sample's bytes; ``targets`` gives each sample its
target when the dataset is listed.
"""
