"""``python -m data_gen convert SRC --out DST --max-side 512``: large photos converted once into
tar shards of small ones, which every loader reads as any dataset (``--data DST``).

The source is any root the loader reads (``pipelines.sources.root.open_source``: a folder, a
file list, local or remote tar shards), the one reason this module imports ``pipelines``; the
rest of ``data_gen`` stands alone. Each sample keeps its target (``KEY.cls``, and ``KEY.txt`` or
``KEY.json`` for multi-label and column targets) and its relative name (``manifest`` NOTE
[keys]); each photo is shrunk on every core (``photo`` NOTE [the per-photo path]); the shards
are written one by one, atomically, and an interrupted run resumes (``manifest`` NOTE [the
output folder]). docs/datasets.md ("Large photos: convert once") is the user's guide.
"""
from .run import ConvertConfig, convert

__all__ = ["ConvertConfig", "convert"]
