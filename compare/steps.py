"""Example training steps for ``python -m compare --step`` (``compare.userstep``).

``compiled(model='resnet50')``: a torchvision model with SGD, bf16 autocast, channels_last and
``torch.compile``; copy it and put your own model in. ``host_sleep(ms=55)`` sleeps on the host
and queues no GPU work: beside ``--model synthetic:55`` (a GPU kernel of 55 ms) it tells whether
a loader reacts to the step's GPU work or to its host time.
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
