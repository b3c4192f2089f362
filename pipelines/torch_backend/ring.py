"""A ring of reusable pinned host buffers, filled in the main process (``pin_mode="ring"``).

NOTE [pin thread vs ring]
DataLoader's ``pin_memory=True`` runs a pin thread in the main process that copies every batch
out of the worker's shared memory into a block from torch's caching host allocator. The ring
does the same copy on the consumer's thread into one of ``slots`` pinned buffers allocated once,
and reuses a slot only after the event recorded behind its H2D copy has completed
(event-guarded slot reuse). The ring saves the pin thread's queue hop and allocator traffic;
the pin thread keeps the host copy off the consumer's thread. Measured on an H200 host, the
ring is not faster (docs/results/h200/pin-ring; ``python -m compare --backends pinned --model
none --sweep pin_mode=thread,ring``), so the default stays ``"thread"``. The ring is for a
fixed pinned footprint.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch


class _Slot:
    __slots__ = ("images", "labels", "event")

    def __init__(self):
        self.images: Optional[torch.Tensor] = None
        self.labels: Optional[torch.Tensor] = None
        self.event = None  # recorded after the H2D copies out of this slot were enqueued


class PinnedRing:
    """``slots`` host buffer pairs (images, labels), reused round robin.

    Args:
        slots: buffers in the ring; at least the batches in flight + 1 (the one being filled).
        pin_memory: allocate page-locked buffers (``False`` only for CPU unit tests).
        new_event: event factory (``torch.cuda.Event``; injectable for tests).
    """

    def __init__(self, slots: int, *, pin_memory: bool = True,
                 new_event: Optional[Callable[[], object]] = None):
        if slots < 2:
            raise ValueError(f"slots={slots} must be >= 2")
        self._slots: List[_Slot] = [_Slot() for _ in range(slots)]
        self._k = 0
        self._pin = pin_memory
        self._new_event = new_event or torch.cuda.Event
        self.allocations = 0  # buffers allocated so far (flat after the first lap)

    def __len__(self) -> int:
        return len(self._slots)

    def _buffer(self, buf: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        n = like.shape[0]
        if (buf is None or buf.dtype != like.dtype or buf.shape[1:] != like.shape[1:]
                or buf.shape[0] < n):
            buf = torch.empty(like.shape, dtype=like.dtype, pin_memory=self._pin)
            self.allocations += 1
        return buf

    def stage(self, images: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copy a CPU batch into the next slot; returns views of the slot's buffers.

        Blocks only if that slot's previous H2D copy has not finished yet.
        """
        slot = self._slots[self._k % len(self._slots)]
        if slot.event is not None:
            slot.event.synchronize()
            slot.event = None
        slot.images = self._buffer(slot.images, images)
        slot.labels = self._buffer(slot.labels, labels)
        n = images.shape[0]
        x, y = slot.images[:n], slot.labels[:n]
        x.copy_(images)
        y.copy_(labels)
        return x, y

    def guard(self, stream=None) -> None:
        """Record, on ``stream`` (default: current), that the last staged slot's copies are queued."""
        slot = self._slots[self._k % len(self._slots)]
        ev = self._new_event()
        if stream is None:
            ev.record()
        else:
            ev.record(stream)
        slot.event = ev
        self._k += 1

    def upload(self, images: torch.Tensor, labels: torch.Tensor,
               device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """Stage, copy ``non_blocking`` to ``device`` on ``device``'s current stream (where the
        copy runs, whichever device is current), and guard the slot."""
        x, y = self.stage(images, labels)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        self.guard(torch.cuda.current_stream(device) if device.type == "cuda" else None)
        return x, y
