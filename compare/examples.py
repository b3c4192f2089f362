"""Example torchvision v2 pipelines for ``python -m compare --transform compare.examples:NAME``.

``color_aug`` is the README's worked example: a typical "strong" CPU augmentation that
``pipelines.transforms.migrate`` moves to the GPU unchanged.
"""
import torch
from torchvision.transforms import v2

color_aug = v2.Compose([
    v2.RandomResizedCrop(224, scale=(0.08, 1.0)),
    v2.RandomHorizontalFlip(),
    v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
    v2.RandomGrayscale(p=0.2),
    v2.GaussianBlur(kernel_size=23, sigma=(0.1, 2.0)),
    v2.ToImage(),
    v2.ToDtype(torch.float32, scale=True),
    v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])
