"""``--reference``: the plain recipes our backends are measured against, as users write them,
each in a row beside the backend it checks (docs/benchmarking.md, References).

* ``ImageFolderReference`` (for ``pageable``): ``torchvision.datasets.ImageFolder`` + PIL, the
  same augmentation, a ``DataLoader`` with no pinning and a blocking ``.to(device)``.
* ``DaliFileReaderReference`` (for ``dali``): DALI's own ImageNet recipe at DALI's defaults
  (``fn.readers.file`` -> ``image_random_crop`` -> ``resize`` -> ``crop_mirror_normalize``);
  the train recipe only. Both read ImageFolder folders only.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from pipelines import LastBatchPolicy, LoaderConfig
from pipelines.config import OutputDType
from pipelines.sources.root import SourceKind, source_kind
from pipelines.transforms.spec import Mode

LABEL = "imagefolder (reference)"
DALI_LABEL = "dali file reader (reference)"


def check_folder(root) -> None:
    """``ValueError`` unless ``root`` is an ImageFolder folder (what both references read)."""
    if source_kind(root) is not SourceKind.FOLDER or not Path(root).is_dir():
        raise ValueError(f"--reference reads an ImageFolder folder; --data {root} is "
                         f"a {source_kind(root).value}")


def dali_reference_skip(cfg: LoaderConfig) -> str | None:
    """Why the DALI reference row cannot run ``cfg`` (``None`` when it can)."""
    if cfg.transform is not None:
        return "--transform is given (it runs AugmentSpec's train recipe only)"
    if cfg.augment.mode is not Mode.TRAIN:
        return "--mode is eval (it runs the train recipe only)"
    if cfg.mix is not None:
        return "--mix is given"
    return None


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ImageFolderReference(_Closing):
    """The plain recipe (module doc) with the loader interface the suite uses."""

    def __init__(self, cfg: LoaderConfig):
        from torchvision import datasets

        check_folder(cfg.root)
        if cfg.mix is not None:
            raise ValueError("--reference has no MixUp/CutMix (the plain recipe mixes in the "
                             "training loop); drop --mix or --reference")
        cfg = cfg.resolved()
        t = cfg.transform if cfg.transform is not None else cfg.augment.to_torchvision(normalize=True)
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


class DaliFileReaderReference(_Closing):
    """DALI's own file-reader recipe (module doc) with the loader interface the suite uses."""

    def __init__(self, cfg: LoaderConfig):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy as DaliPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        check_folder(cfg.root)
        why = dali_reference_skip(cfg)
        if why is not None:
            raise ValueError(f"the DALI reference row cannot run: {why}")
        cfg = cfg.resolved()
        gpu = cfg.wants_cuda and torch.cuda.is_available()
        self.device_id = (cfg.torch_device.index or 0) if gpu else None
        self.cfg, spec = cfg, cfg.augment
        layout = "HWC" if cfg.channels_last else "CHW"

        @pipeline_def(batch_size=cfg.batch_size, num_threads=max(1, cfg.num_workers),
                      device_id=self.device_id, seed=cfg.seed)
        def recipe():
            jpegs, labels = fn.readers.file(file_root=str(cfg.root), random_shuffle=True, name="Reader")
            images = fn.decoders.image_random_crop(
                jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                random_area=list(spec.scale), random_aspect_ratio=list(spec.ratio))
            images = fn.resize(images, resize_x=spec.size, resize_y=spec.size)
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT16 if cfg.dtype is OutputDType.FLOAT16 else types.FLOAT,
                output_layout=layout, mean=[255 * m for m in spec.mean],
                std=[255 * s for s in spec.std], mirror=fn.random.coin_flip(probability=spec.flip_p))
            return images, labels

        self.pipe = recipe()
        self.pipe.build()
        self.it = DALIGenericIterator(self.pipe, ["images", "labels"], reader_name="Reader",
                                      auto_reset=True, last_batch_policy=DaliPolicy.DROP)
        self.batches = self.pipe.epoch_size("Reader") // cfg.batch_size
        self.queue_batches = 2  # DALI's default prefetch_queue_depth (runner.queue_depth)

    def set_epoch(self, epoch: int) -> None:  # the reader reshuffles each epoch by itself
        pass

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        cast = self.cfg.dtype is OutputDType.BFLOAT16
        with torch.cuda.device(self.device_id) if self.device_id is not None else contextlib.nullcontext():
            for out in self.it:
                x = out[0]["images"]
                y = out[0]["labels"].view(-1).to(x.device, torch.int64, non_blocking=True)
                if self.cfg.channels_last:
                    x = x.permute(0, 3, 1, 2)  # NHWC memory == NCHW with channels_last strides
                if cast:
                    x = x.to(torch.bfloat16, memory_format=torch.preserve_format)
                yield x, y

    def h2d_bytes_per_sample(self) -> None:
        return None  # the reader's bytes are not counted

    def close(self) -> None:
        self.it = self.pipe = None
