"""Async host-to-device prefetch on side CUDA streams.

NOTE [stream safety]
A batch is copied (``non_blocking=True``, from pinned memory) and normalised on a side stream
``s``; the consumer uses it on its own current stream ``c``. Three rules keep this race-free:

1. *Order*: before a batch is handed out, ``c.wait_event(ev)`` where ``ev`` was recorded on ``s``
   after the copy and the normalisation. The wait is enqueued **before** the batch is yielded,
   so any kernel the consumer launches on it runs after the copy (the bug in the seeds'
   AsyncGPUDataLoader was yielding first).
2. *Device-buffer lifetime*: the output tensors were allocated on ``s``; ``record_stream(c)``
   tells the caching allocator not to hand their memory to ``s`` again until the work queued on
   ``c`` at the time they are freed has finished. A slow consumer therefore never sees its batch
   overwritten by the next copy.
3. *Host-buffer lifetime*: the pinned source came from torch's caching host allocator (the
   DataLoader's pin thread), which records an event for every ``non_blocking`` copy and does
   not reuse the block before it; we also keep a reference until the batch is handed out.

Errors keep their place: the source is read ``depth`` batches ahead, so an exception raised
while pulling a batch is held in the queue and raised when the consumer reaches that position,
after the batches before it (``BadFileError`` at its batch, as without prefetch). Each source
item may carry an opaque ``meta`` (the batch's bad files), handed out with its batch.

The side streams are created at high priority so a copy is not queued behind a long model step.
``streams == 0`` skips all of this: copies go on the consumer's stream (pin-memory only).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from pipelines.types import Batch

Transform = Callable[[torch.Tensor], torch.Tensor]


class CudaPrefetcher:
    """Keeps ``depth`` batches in flight on ``streams`` side streams (round robin).

    Args:
        device: the CUDA device.
        streams: number of side streams (``>= 1``).
        depth: batches in flight ahead of the consumer (``>= 1``).
        finish: applied to the uint8 device batch on the side stream (normalise, cast, layout).
    """

    def __init__(self, device: torch.device, streams: int, depth: int, finish: Transform):
        if streams < 1 or depth < 1:
            raise ValueError(f"{streams=} and {depth=} must both be >= 1")
        # lower number == higher priority; torch's stub lacks the @staticmethod it has at run time
        prio = min(torch.cuda.Stream.priority_range())  # type: ignore[call-arg]
        self.device = device
        self.streams = [torch.cuda.Stream(device=device, priority=prio) for _ in range(streams)]
        self.depth = depth
        self.finish = finish

    def _submit(self, k: int, cpu: tuple[torch.Tensor, torch.Tensor, Any]):
        images, labels, meta = cpu
        s = self.streams[k % len(self.streams)]
        with torch.cuda.stream(s):
            x = images.to(self.device, non_blocking=True)  # from the pinned batch
            y = labels.to(self.device, non_blocking=True)
            x = self.finish(x)
            ev = torch.cuda.Event()
            ev.record(s)
        return x, y, ev, meta, cpu

    def __call__(self, source: Iterable[tuple[torch.Tensor, torch.Tensor, Any]]
                 ) -> Iterator[tuple[Batch, Any]]:
        """Yield ``(Batch, meta)`` for each ``(images, labels, meta)`` of ``source``, in order."""
        it = iter(source)
        inflight: deque = deque()
        k = 0
        failed = False

        def pull() -> None:
            nonlocal k, failed
            if failed:
                return
            try:
                nxt = next(it, None)
            except Exception as e:  # held until the consumer reaches this position
                inflight.append(e)
                failed = True
                return
            if nxt is not None:
                inflight.append(self._submit(k, nxt))
                k += 1

        while len(inflight) < self.depth:
            n = len(inflight)
            pull()
            if len(inflight) == n or failed:
                break
        while inflight:
            item = inflight.popleft()
            if isinstance(item, Exception):
                raise item
            x, y, ev, meta, _cpu = item
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(ev)          # rule 1: order before use
            x.record_stream(consumer)        # rule 2: device memory lifetime
            y.record_stream(consumer)
            yield Batch(x, y), meta
            pull()                           # refill after the consumer has had its batch
