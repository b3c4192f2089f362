"""Example training steps for ``python -m compare --step`` (``compare.userstep``).

``compare.steps:compiled(model='resnet50')`` builds a torchvision model on the GPU (the rank's
own under torchrun), SGD with momentum, bf16 autocast and channels_last, wrapped by
``torch.compile`` unless ``compile=False``, and returns its step. Copy it and put your own
model, loss and optimiser in.

``compare.steps:host_sleep(ms=55)`` sleeps on the host and queues no GPU work. Beside
``--model synthetic:55`` (one GPU kernel that spins 55 ms, the host free, as in a step whose
launches run ahead) it tells what in a model's step a loader reacts to: a loader that waits
beside the GPU kernel and not beside the host sleep waits for the step's GPU work.
"""
from __future__ import annotations

from collections.abc import Callable


def compiled(model: str = "resnet50", num_classes: int = 1000, compile: bool = True,
             lr: float = 0.1) -> Callable:
    import torch
    import torch.nn.functional as F

    from pipelines.placement import placement

    from .models import _tinycnn, parse_model, torchvision_models

    if parse_model(model) != "tinycnn" and model not in torchvision_models():
        raise ValueError(f"model={model!r}: name tinycnn or a torchvision model")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{placement().local_rank or 0}" if cuda else "cpu")
    if model == "tinycnn":
        net = _tinycnn(num_classes)
    else:
        import torchvision.models as tvm

        net = getattr(tvm, model)(weights=None, num_classes=num_classes)
    net = net.to(device, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    fwd = torch.compile(net) if compile else net

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = fwd(images.to(memory_format=torch.channels_last))
            if labels.is_floating_point():  # soft targets (MixUp/CutMix)
                loss = torch.sum(-labels * F.log_softmax(out.float(), dim=1), dim=1).mean()
            else:
                loss = F.cross_entropy(out.float(), labels.clamp_max(num_classes - 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def host_sleep(ms: float = 55.0) -> Callable:
    """A step that sleeps ``ms`` on the host and queues no GPU work (module doc)."""
    import time

    if not ms > 0:
        raise ValueError(f"host_sleep: ms={ms!r} must be above 0")
    secs = ms / 1000.0

    def step(images, labels) -> None:
        time.sleep(secs)

    return step
