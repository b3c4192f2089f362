"""The map-style dataset and the batch sampler that follow the shared epoch plan."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import default_collate

try:  # deprecated in torchvision 0.29 in favour of TorchCodec, still the fastest CPU path here
    from torchvision.io import ImageReadMode, decode_image
except ImportError:  # pragma: no cover - a torchvision that has dropped it
    decode_image = None

from pipelines.config import Decoder
from pipelines.epoch_plan import sample_seed
from pipelines.sources.validate import DEFAULT_MAX_PIXELS, check_image_bytes
from pipelines.transforms.draws import view_seed
from pipelines.transforms.migrate.run import Steps, as_steps

warnings.filterwarnings(
    "ignore", message="The image decoding and encoding capabilities of TorchVision are deprecated",
    category=DeprecationWarning,
)


def _pil_rgb(data: bytes) -> torch.Tensor:
    return pil_tensor(data)  # defined in .decode, imported below


def decode_rgb(data: bytes) -> torch.Tensor:
    """Decode encoded image bytes to a ``uint8`` ``3 x H x W`` RGB tensor on the CPU.

    JPEGs go through ``torchvision.io`` (libjpeg-turbo), which is faster than PIL here
    (``python -m tools.microbench decode``, docs/results/cpu/microbench.json). Anything else
    (a PNG named .jpg) goes through PIL: torchvision's PNG decoder crashes the process with a
    segmentation fault on corrupt PNG data (libpng's error longjmp; found by
    ``python -m tools.fuzz``), where PIL raises. Grayscale and CMYK come out as RGB and the
    EXIF orientation is applied, as DALI's decoders do by default.
    """
    if decode_image is None or not data.startswith(b"\xff\xd8"):
        return _pil_rgb(data)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return decode_image(t, mode=ImageReadMode.RGB, apply_exif_orientation=True)


from pipelines.torch_backend.decode import (  # noqa: E402
    as_tensor,
    first_crop,
    pil_image,
    pil_tensor,
    scaled_crop,
    takes_pil,
)


def seed_cpu(seed: int) -> None:
    """Seed the CPU generator the transforms draw from, for one sample.

    Not ``torch.manual_seed``: that also queues a seed for every lazily initialised device
    module (CUDA, XPU, MTIA), each with a formatted stack trace, on every call. Per sample, in
    a worker that never touches a device, that was a large share of the PIL recipe's time
    (docs/results/h200/seeds-reference) and kept the workers' queue of lazy calls growing
    (``tests/test_decode.py``).
    """
    torch.random.default_generator.manual_seed(seed)


class Bad(NamedTuple):
    """A sample that could not be loaded (``on_bad_file='skip'``)."""

    path: str
    reason: str


class JpegDataset(torch.utils.data.Dataset):
    """Checks, decodes and transforms one sample, seeded from (seed, epoch, index).

    Items are addressed by ``(epoch, index)`` pairs (produced by :class:`PlanBatchSampler`), so
    persistent workers never hold a stale epoch and the augmentation of a sample does not depend
    on which worker decoded it. With ``views`` > 1 (``AugmentSpec.views``) an item's image is
    ``views x 3 x H x W``: the image decoded once, then the transform run once per view, view
    ``v`` seeded from ``(seed, epoch, index, v)`` (``pipelines.transforms.draws`` NOTE [views]).
    """

    def __init__(self, paths: Sequence[str], labels: np.ndarray, transform: Callable, seed: int,
                 max_pixels: int = DEFAULT_MAX_PIXELS,
                 read: Callable[[int], bytes] | None = None,
                 decoder: Decoder = Decoder.TORCHVISION, views: int = 1):
        self.paths = list(paths)
        self.views = views
        self.read = read  # ``Source.read`` (tar shards: by offset); None: open the path
        self.labels = labels
        self.seed = seed
        self.max_pixels = max_pixels
        self.decoder = Decoder(decoder)
        self._use(as_steps(transform))  # once, not per sample
        self.sized: Callable[[tuple[int, int]], Callable] | None = None  # set_resolution
        # (h, w) -> (transform, crop, pil, rest); None: the config's own size
        self._variants: dict = {None: (self.transform, self._crop, self._pil, self._rest)}

    def _use(self, transform) -> None:
        self.transform = transform
        # Decoder.SCALED: the recipe's RandomResizedCrop (eval: Resize) runs in the decoder, the
        # rest after it
        # (views > 1: one full decode that every view crops, NOTE [views])
        crop = (first_crop(self.transform) if self.decoder is Decoder.SCALED and self.views == 1
                else None)
        self._crop = crop
        self._pil = takes_pil(self.transform)  # hand the PIL image over, else a tensor of it
        self._rest = (Steps(self.transform.transforms[1:], self.transform.offset + 1,
                            self.transform.kind) if crop is not None else None)

    def _at(self, hw) -> None:
        """Use the recipe at output size ``hw`` (``LoaderBase.set_resolution``; ``None``: the
        config's size, which a key without a size asks for); built once per size in each
        worker."""
        key = None if hw is None else tuple(hw)
        if key not in self._variants:
            if self.sized is None or key is None:  # None is there from the start
                raise RuntimeError("a key with a size, but the dataset has no sized recipe")
            self._use(as_steps(self.sized(key)))
            self._variants[key] = (self.transform, self._crop, self._pil, self._rest)
        self.transform, self._crop, self._pil, self._rest = self._variants[key]

    def _decode(self, data: bytes, seed: int):
        """``(image, the steps still to run)``; with the scaled path the crop is done (and its
        random numbers drawn from ``seed``)."""
        if self._crop is not None and data.startswith(b"\xff\xd8"):
            seed_cpu(seed)
            img = scaled_crop(data, self._crop)
            if img is not None:
                return (img if self._pil else as_tensor(img)), self._rest
        if self.decoder is Decoder.TORCHVISION:
            return decode_rgb(data), self.transform
        return (pil_image(data) if self._pil else pil_tensor(data)), self.transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key: tuple[int, int]):
        """``(image, label, index)``, or ``Bad`` when the file cannot be read or decoded.

        Only reading, the byte check and decoding make a ``Bad`` file; an exception from the
        transform is a ``TransformError`` naming the step, raised under every policy."""
        epoch, index = key[0], key[1]
        # (epoch, index, (h, w)): a resolution set by set_resolution; (epoch, index): the
        # config's own, also after a set_resolution back to it
        self._at(key[2] if len(key) == 3 else None)
        path = self.paths[index]
        try:
            if self.read is not None:
                data = self.read(index)
            else:
                with open(path, "rb") as f:
                    data = f.read()
            reason = check_image_bytes(data, self.max_pixels)
            seed = sample_seed(self.seed, epoch, index)
            img, steps = self._decode(data, seed) if reason is None else (None, None)
        except Exception as e:  # an unreadable file or a decoder error
            reason = f"{type(e).__name__}: {e}".strip()
        if reason is not None:
            return Bad(path, reason)  # the main process raises or skips, per on_bad_file
        if steps is self.transform:  # the scaled path has drawn its crop already
            seed_cpu(seed)
        assert steps is not None  # _decode gives steps (self._rest is set with self._crop)
        if self.views > 1:
            return self._views(img, steps, path, epoch, index), int(self.labels[index]), index
        return as_tensor(steps(img, where=path)), int(self.labels[index]), index

    def _views(self, img, steps, path: str, epoch: int, index: int) -> torch.Tensor:
        """The decoded ``img`` augmented once per view, ``views x 3 x H x W`` (view 0 as
        ``views=1`` gives it; ``pipelines.transforms.draws`` NOTE [views])."""
        out = []
        for v in range(self.views):
            seed_cpu(view_seed(self.seed, epoch, index, v))
            out.append(as_tensor(steps(img, where=path)))
        return torch.stack(out)


def collate_skipping(batch: list, views: int = 1):
    """Collate ``(image, label, index)`` samples, replacing ``Bad`` ones (see ``BadFilePolicy``).

    Returns ``(images, labels, indices, bad)``; ``images`` is ``None`` when no sample was good.
    ``indices`` is a numpy ``int64`` array, not a tensor: a worker hands every tensor of its
    batch to the main process as one more shared-memory file, one more descriptor passed over a
    socket and one more round trip to the worker's sharing thread, so the batch carries the two
    tensors of ``ImageFolder``'s recipe (images, labels) and the indices travel pickled with it.
    With ``views`` > 1 each sample's ``views x 3 x H x W`` image becomes ``views`` adjacent
    rows: ``images`` is ``(N * views) x 3 x H x W`` (``AugmentSpec.views``).
    """
    bad = [b for b in batch if isinstance(b, Bad)]
    _check_shapes(batch)
    if not bad:
        return (*_views_as_rows(_collate(batch), views), [])
    good = [b for b in batch if not isinstance(b, Bad)]
    if not good:
        return None, None, None, [tuple(b) for b in bad]
    filled, k = [], 0
    for i, b in enumerate(batch):
        if isinstance(b, Bad):  # the next good sample of the batch (wrapping around)
            nxt = next((c for c in batch[i + 1 :] if not isinstance(c, Bad)), None)
            b = nxt if nxt is not None else good[k % len(good)]
            k += 1
        filled.append(b)
    return (*_views_as_rows(_collate(filled), views), [tuple(b) for b in bad])


def _collate(samples: list) -> tuple:
    """``(images, labels, indices)`` of good samples: ``default_collate`` of ``(image, label)``,
    as ``ImageFolder``'s recipe collates, and the indices as a numpy array."""
    images, labels = default_collate([(s[0], s[1]) for s in samples])
    return images, labels, np.fromiter((s[2] for s in samples), np.int64, len(samples))


def _views_as_rows(collated, views: int):
    """``N x views x 3 x H x W`` images as ``(N * views) x 3 x H x W`` (a view of them)."""
    if views == 1:
        return collated
    images, *rest = collated
    return (images.flatten(0, 1), *rest)


def _check_shapes(batch: list) -> None:
    """One clear error, instead of ``torch.stack``'s, when the transform's outputs differ."""
    shapes = {tuple(b[0].shape) for b in batch
              if not isinstance(b, Bad) and isinstance(b[0], torch.Tensor)}
    if len(shapes) > 1:
        a, b = sorted(shapes)[:2]
        raise RuntimeError(f"transform gives images of different shapes in one batch ({list(a)} "
                           f"and {list(b)}); end it with a fixed-size step (a crop, or "
                           "Resize((h, w)))")


class PlanBatchSampler(torch.utils.data.Sampler):
    """Yields the batches of the loader's plan (``LoaderBase.plan_of``) as lists of
    ``(epoch, index)``: epoch ``start``'s, then the next epoch's, and so on without end, so the
    DataLoader's workers cross an epoch boundary without draining (see ``TorchLoaderBase``).
    The first epoch starts at its batch ``skip`` (a resumed epoch). ``len()`` is one epoch's
    batch count.

    With ``size_of`` (set_resolution), each key of an epoch is ``(epoch, index, (h, w))`` at
    the size ``size_of(epoch)`` gives when the epoch's first batch goes out (``None``: the
    config's own, plain keys); ``sent`` records it per epoch, for the loader to check
    (``pipelines.resolution`` NOTE [sizes ahead])."""

    def __init__(self, plan: Callable[[int], list[np.ndarray]], length: int):
        self.plan = plan
        self.length = length
        self.start = 0
        self.skip = 0
        self.one_epoch = False  # TorchOptions.epoch_stream off: epoch ``start`` only
        self.size_of: Callable[[int], tuple[int, int] | None] | None = None
        self.sent: dict[int, tuple[int, int] | None] = {}  # epoch -> the size its keys carry

    def __iter__(self) -> Iterator[list[tuple]]:  # (epoch, index) or (epoch, index, (h, w))
        e, skip = self.start, self.skip
        self.sent = {}  # a new stream: nothing of it has gone out
        while True:
            hw = self.size_of(e) if self.size_of is not None else None
            self.sent = {k: v for k, v in self.sent.items() if k >= e - 1}
            self.sent[e] = hw
            for b in self.plan(e)[skip:]:
                if hw is None:
                    yield [(e, int(i)) for i in b]
                else:
                    yield [(e, int(i), hw) for i in b]
            if self.one_epoch:
                return
            e, skip = e + 1, 0

    def __len__(self) -> int:
        return self.length
