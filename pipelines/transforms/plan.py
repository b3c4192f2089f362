"""``TransformPlan``: the one augmentation plan every backend and every consumer reads.

A loader's augmentation is either ``AugmentSpec``'s recipe or the user's torchvision Compose
(``LoaderConfig.transform``). Both become one ``TransformPlan``, built once per loader:

* the torch backends run ``full`` (``pageable``: decode to normalised float in the workers) or
  ``head`` in the workers and ``tail`` on the device batch (``pinned``);
* the DALI graph runs ``dali_plan()``, the exact translation (``pipelines.transforms.migrate``);
* the /dev/shm fit and the host-to-device byte count read ``sample_bytes``, the size and dtype
  of what the workers return, worked out from the Compose without running it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from pipelines.transforms.migrate.run import Steps, split_compose
from pipelines.transforms.spec import AugmentSpec


def _nbytes(s) -> int | None:
    if s.size is None or s.dtype is None or s.channels is None:
        return None
    h, w = s.size
    return s.channels * h * w * torch.empty(0, dtype=s.dtype).element_size()


@dataclass(frozen=True)
class TransformPlan:
    """The augmentation of one loader: ``spec``, or the user's flat v2 Compose ``user`` (which
    wins). What each consumer needs is worked out on first use, so the DALI backend with
    ``AugmentSpec``'s recipe never imports torchvision's transforms.

    Attributes:
        full: the whole Compose, decoded image -> output (what ``pageable``'s workers run).
        head: the steps ``pinned``'s workers run (uint8 out).
        tail: the steps ``pinned`` runs on the device batch, or ``None`` for the fused uint8
            normalisation with ``spec``'s mean and std (``AugmentSpec``'s recipe).
        out_size: ``(H, W)`` of every output image, or ``None`` when it depends on the image.
        views: the images each sample gives (``AugmentSpec.views``; decoded once, augmented
            ``views`` times: ``pipelines.transforms.draws`` NOTE [views]).
    """

    spec: AugmentSpec
    user: Any = None

    @classmethod
    def of(cls, spec: AugmentSpec, transform=None, dtype=None) -> TransformPlan:
        """The recipe for ``LoaderConfig(augment=spec, transform=transform)``; with ``dtype``
        (``LoaderConfig.dtype``), a transform ending in another float dtype is refused
        (``pipelines.transforms.migrate.check_output_dtype``)."""
        if dtype is not None and transform is not None:
            from pipelines.transforms.migrate import check_output_dtype

            check_output_dtype(transform, dtype)
        return cls(spec, transform)

    @cached_property
    def _split(self) -> tuple[Steps, Steps | None]:
        if self.user is not None:
            return split_compose(self.user)
        return Steps(self.spec.to_torchvision(normalize=False).transforms), None

    @property
    def full(self):
        return self.user if self.user is not None else self.spec.to_torchvision(normalize=True)

    @property
    def head(self) -> Steps:
        return self._split[0]

    @property
    def tail(self) -> Steps | None:
        return self._split[1]

    @cached_property
    def _ends(self):
        """The image after the whole Compose and after its head (``pipelines.transforms.migrate.flow``)."""
        from pipelines.transforms.migrate.flow import State, walk

        steps, _ = walk(self.user)
        k = len(self.head)
        return (steps[-1].after if steps else State(),
                steps[k - 1].after if k else State())

    @property
    def views(self) -> int:
        return self.spec.views

    @property
    def out_size(self) -> tuple[int, int] | None:
        if self.user is None:
            return self.spec.hw
        return self._ends[0].size

    def sample_bytes(self, *, in_workers: str) -> int | None:
        """Bytes of one sample (all its views) as the workers return it: ``in_workers="full"`` (the whole
        recipe) or ``"head"`` (``pinned``'s uint8 part); ``None`` when it depends on the image."""
        if self.user is None:  # AugmentSpec's views: every view of the sample
            px = 3 * self.spec.hw[0] * self.spec.hw[1] * self.spec.views
            return px * 4 if in_workers == "full" else px  # float32 / uint8
        return _nbytes(self._ends[0] if in_workers == "full" else self._ends[1])

    def dali_plan(self):
        """The ``TvPlan`` the DALI graph runs (``UnsupportedTransformError`` when the user's
        Compose has no exact DALI translation)."""
        from pipelines.transforms.migrate import from_torchvision, spec_ops

        return spec_ops(self.spec) if self.user is None else from_torchvision(self.user)
