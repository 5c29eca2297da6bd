"""Small built-in models for examples and tests, usable as `source: callable` (e.g. `trainplan.zoo:small_cnn`)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int = 64, depth: int = 3, batch_size: int = 8, classes: int = 10) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A ReLU MLP with a cross-entropy head; batch: ``x`` and ``labels``."""

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = []
            for _ in range(depth):
                layers += [nn.Linear(width, width), nn.ReLU()]
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(width, classes)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(self.head(self.body(x)), labels)

    gen = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(batch_size, width, generator=gen), "labels": torch.randint(0, classes, (batch_size,), generator=gen)}
    return MLP(), batch


def small_cnn(channels: int = 8, image_size: int = 16, batch_size: int = 4, classes: int = 10) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Conv-BN-ReLU blocks with a residual connection and a linear head; batch: ``x`` and ``labels``."""

    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
            self.block = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
            self.head = nn.Linear(channels, classes)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            h = self.stem(x)
            h = h + self.block(h)
            return nn.functional.cross_entropy(self.head(h.mean(dim=(2, 3))), labels)

    gen = torch.Generator().manual_seed(0)
    batch = {
        "x": torch.randn(batch_size, 3, image_size, image_size, generator=gen),
        "labels": torch.randint(0, classes, (batch_size,), generator=gen),
    }
    return SmallCNN(), batch
