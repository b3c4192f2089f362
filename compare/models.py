"""The model step shared by the suite and the training example: forward, backward, SGD update."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn as nn

MODELS = ("none", "tinycnn", "resnet18", "resnet50", "vit_b_16", "vit_l_16", "synthetic:<ms>")
TIMM = "timm:"  # --model timm:<name> builds a timm model (when timm is installed)


def torchvision_models() -> list:
    """Every torchvision classification model name (``torchvision.models.list_models``)."""
    import torchvision.models as tvm

    return sorted(tvm.list_models(module=tvm))


def parse_model(name: str) -> str:
    """Validate a ``--model``: one of ``MODELS``, a torchvision model, or ``timm:<name>``."""
    if name in MODELS[:-1]:
        return name
    if name.startswith("synthetic:"):
        try:
            if float(name.split(":", 1)[1]) >= 0:
                return name
        except ValueError:
            pass
    if name.startswith(TIMM):
        try:
            import timm
        except ImportError:
            raise ValueError(f"model={name!r} needs timm: pip install timm") from None
        if not timm.is_model(name[len(TIMM):]):
            raise ValueError(f"model={name!r}: timm has no model {name[len(TIMM):]!r} "
                             "(timm.list_models() lists them)")
        return name
    if name in torchvision_models():
        return name
    raise ValueError(f"model={name!r} is not valid; choose one of {', '.join(MODELS)}, any "
                     "torchvision classification model (torchvision.models.list_models()), or "
                     "timm:<name> with timm installed")


def _tinycnn(num_classes: int) -> nn.Module:
    """A small CNN for CPU runs (a ResNet-50 step on 2 cores takes seconds)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 7, stride=4, padding=3), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


class _Sleep:
    """``synthetic:<ms>``: occupies the compute stream for a known time (no real model)."""

    def __init__(self, ms: float, device: torch.device):
        self.ms = ms
        self.device = device
        self.cycles_per_ms: float | None = None
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)  # warm up
            a.record()
            torch.cuda._sleep(10_000_000)
            b.record()
            torch.cuda.synchronize()
            self.cycles_per_ms = 10_000_000 / a.elapsed_time(b)

    def __call__(self, images, labels):
        if self.cycles_per_ms is not None:
            torch.cuda._sleep(int(self.ms * self.cycles_per_ms))
        else:
            time.sleep(self.ms / 1000)
        return None


class TrainStep:
    """One optimisation step: AMP autocast (when ``amp_dtype``), channels_last, SGD + momentum.

    Args:
        model: a name ``parse_model`` accepts.
        amp_dtype: autocast dtype (``torch.bfloat16`` on GPU), or ``None`` for full precision.
        wrap: applied to the module once it is on ``device`` (``compare.ddp.wrap``: DDP).
    """

    def __init__(self, model: str, device: torch.device, num_classes: int = 1000,
                 amp_dtype: torch.dtype | None = None, channels_last: bool = False,
                 lr: float = 0.05, wrap: Callable[[nn.Module], nn.Module] | None = None):
        self.name = parse_model(model)
        self.device = torch.device(device)
        self.amp_dtype = amp_dtype
        self.module: nn.Module | None = None
        self._fn = None
        if self.name == "none":
            self._fn = lambda x, y: None
        elif self.name.startswith("synthetic:"):
            self._fn = _Sleep(float(self.name.split(":", 1)[1]), self.device)
        else:
            if self.name == "tinycnn":
                m = _tinycnn(num_classes)
            elif self.name.startswith(TIMM):
                import timm

                m = timm.create_model(self.name[len(TIMM):], pretrained=False, num_classes=num_classes)
            else:
                import torchvision.models as tvm

                m = getattr(tvm, self.name)(weights=None, num_classes=num_classes)
            m = m.to(self.device)
            if channels_last:
                m = m.to(memory_format=torch.channels_last)
            self.module = (wrap(m) if wrap is not None else m).train()
            self.opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
            self.loss_fn = nn.CrossEntropyLoss()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Run one step; returns the loss tensor (not synchronised) or ``None``."""
        if self._fn is not None:
            return self._fn(images, labels)
        if self.amp_dtype is not None:
            with torch.autocast(self.device.type, dtype=self.amp_dtype):
                loss = self.loss_fn(self.module(images), labels)
        else:
            loss = self.loss_fn(self.module(images.float()), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()
