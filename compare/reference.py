"""``--reference``: the plain recipe ``pageable`` claims to be, as users write it, for a row
beside it.

``torchvision.datasets.ImageFolder`` (its default PIL loader) with the same augmentation,
float32 ``Normalize`` in the workers, a ``DataLoader`` with ``shuffle=True``, no pinning, no
persistent workers, and a blocking ``.to(device)`` per batch: nothing of this project's
loader. The suite times it like a backend, so ``pageable`` can be checked against it in the
same run (issue 20 asks for ±5%). It reads ImageFolder folders only.
"""
from __future__ import annotations

from pathlib import Path

import torch

from pipelines import LastBatchPolicy, LoaderConfig, SourceKind, source_kind

LABEL = "imagefolder (reference)"


class ImageFolderReference:
    """The plain recipe (module doc) with the loader interface the suite uses."""

    def __init__(self, cfg: LoaderConfig):
        from torchvision import datasets

        if source_kind(cfg.root) is not SourceKind.FOLDER or not Path(cfg.root).is_dir():
            raise ValueError(f"--reference reads an ImageFolder folder; --data {cfg.root} is "
                             f"a {source_kind(cfg.root).value}")
        if cfg.mix is not None:
            raise ValueError("--reference has no MixUp/CutMix (the plain recipe mixes in the "
                             "training loop); drop --mix or --reference")
        cfg = cfg.resolved()
        t = cfg.transform if cfg.transform is not None else cfg.augment.to_torchvision(
            normalize=True)
        self.cfg = cfg
        self.device = cfg.torch_device if torch.cuda.is_available() else torch.device("cpu")
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.loader = torch.utils.data.DataLoader(
            datasets.ImageFolder(str(cfg.root), transform=t), batch_size=cfg.batch_size,
            shuffle=True, num_workers=cfg.num_workers, generator=self.generator,
            drop_last=cfg.last_batch is LastBatchPolicy.DROP)
        self.size = cfg.augment.size
        self.num_workers = cfg.num_workers  # the queue the suite reports (runner.queue_depth)
        self.prefetch_factor = 2 if cfg.num_workers else None  # DataLoader's default

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.cfg.seed + epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for x, y in self.loader:
            yield x.to(self.device), y.to(self.device)

    def h2d_bytes_per_sample(self) -> float:
        return 3.0 * self.size * self.size * 4 + 8.0  # float32 image, int64 label

    def close(self) -> None:
        self.loader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
