"""``DecodeProbe``: which of these files does DALI's decoder reject?

Used by the loader's recovery (``pipelines.dali.loader`` NOTE [recovery]) after a pipeline
failed: DALI's error names neither the file nor the batch, so the files of the batches that were
in flight are decoded again here, on the same device and decoder, in groups that are halved
around each failure until single files remain. A failed run leaves a DALI pipeline unusable, so
the probe pipeline is rebuilt after each failure (cheap: it is only reader + decoder).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from nvidia.dali import fn, pipeline_def, types

if TYPE_CHECKING:
    from nvidia.dali.pipeline import Pipeline


def dali_reason(exc: BaseException) -> str:
    """A one-line reason from a DALI pipeline error (its most specific line)."""
    generic = ("Error in", "Current pipeline", "Critical error", "which was used", "File ",
               "encountered", "return ", "^")
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(generic)] or lines
    for key in ("failure", "Error", "error", "Invalid", "invalid"):
        for ln in reversed(lines):
            if key in ln:
                return f"DALI decoder: {ln}"
    return f"DALI decoder: {lines[-1] if lines else type(exc).__name__}"


class DecodeProbe:
    """Decode files one group at a time with a reader + decoder pipeline.

    Args:
        batch_size: largest group.
        device_id: the CUDA device (mixed decoder), or ``None`` for CPU operators.
        decoder_kwargs: extra arguments of ``fn.decoders.image`` (the graph's decoder tuning).
        read: ``read(index) -> bytes`` for samples that are not files (tar shards): their bytes
            are fed instead of their paths.
        mixed: decode with the mixed decoder on the device (default: when there is one); off,
            with DALI's CPU decoder (``DaliOptions.decode_on="cpu"``).
    """

    def __init__(self, batch_size: int, device_id: int | None, decoder_kwargs: dict,
                 read: Callable[[int], bytes] | None = None, mixed: bool | None = None):
        self.read = read
        self.mixed = device_id is not None if mixed is None else mixed
        self.batch_size = batch_size
        self.device_id = device_id
        self.decoder_kwargs = decoder_kwargs
        self._pipe: Pipeline | None = None
        self.runs = 0
        self.rebuilds = 0

    def _build(self):
        dec = "mixed" if self.mixed else "cpu"
        kw = self.decoder_kwargs

        @pipeline_def(batch_size=self.batch_size, num_threads=2, device_id=self.device_id,
                      prefetch_queue_depth=1)
        def probe():
            paths = fn.external_source(name="paths", dtype=types.UINT8, ndim=1)
            data = paths if self.read is not None else fn.io.file.read(paths, dont_use_mmap=True)
            return fn.decoders.image(data, device=dec, output_type=types.RGB, **kw)

        pipe = probe()
        pipe.build()
        return pipe

    def _decodes(self, items: Sequence[tuple[int, str]]) -> BaseException | None:
        """``None`` when every sample of ``items`` decodes, else DALI's exception."""
        if self._pipe is None:
            self._pipe = self._build()
        self.runs += 1
        try:
            if self.read is not None:
                feed = []
                for i, _ in items:
                    try:
                        feed.append(np.frombuffer(self.read(i), np.uint8))
                    except OSError as e:
                        return e
            else:
                feed = [np.frombuffer(os.fsencode(p), np.uint8) for _, p in items]
            self._pipe.feed_input("paths", feed)
            self._pipe.run()
            return None
        except Exception as e:  # DALI raises RuntimeError; a dead pipeline is rebuilt
            self._pipe = None
            self.rebuilds += 1
            return e

    def failing(self, items: Sequence[tuple[int, str]],
                on_bad: Callable[[int, str], None] = lambda i, r: None) -> list[tuple[int, str]]:
        """The ``(index, reason)`` of every item whose file fails to decode alone.

        Args:
            items: ``(dataset index, path)`` pairs, without repeats.
            on_bad: called for each failing item as it is found.
        """
        out: list[tuple[int, str]] = []
        groups = [list(items[i:i + self.batch_size])
                  for i in range(0, len(items), self.batch_size)]
        while groups:
            g = groups.pop()
            err = self._decodes(g)
            if err is None:
                continue
            if len(g) == 1:
                i, _ = g[0]
                out.append((i, dali_reason(err)))
                on_bad(i, out[-1][1])
                continue
            h = len(g) // 2
            groups += [g[h:], g[:h]]
        return out

    def close(self) -> None:
        self._pipe = None
