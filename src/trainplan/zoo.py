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


def _image_batch(batch_size: int, image_size: int, classes: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(batch_size, 3, image_size, image_size, generator=gen),
        "labels": torch.randint(0, classes, (batch_size,), generator=gen),
    }


class _Classifier(nn.Module):
    """Features, then a head; forward returns the cross-entropy loss of ``labels``."""

    def __init__(self, features: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.features = features
        self.head = head

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.head(self.features(x)), labels)


class _BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-BN pairs and an identity or 1x1-conv downsample shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


def resnet18(image_size: int = 112, batch_size: int = 2, classes: int = 1000) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """ResNet-18 (He et al. 2016; torchvision's layer for layer: 7x7 stem, 4 stages of 2 basic blocks,
    64-512 channels, 11.7M parameters at 1000 classes); batch: ``x`` (N, 3, size, size) and ``labels``."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
        cin = cout
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))
    return _Classifier(nn.Sequential(*layers), head), _image_batch(batch_size, image_size, classes)


def alexnet(image_size: int = 112, batch_size: int = 2, classes: int = 1000, dropout: float = 0.0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """AlexNet as in torchvision (Krizhevsky 2014 one-GPU variant: 5 convs 64-192-384-256-256, 3 max pools,
    adaptive 6x6 pool, 4096-4096 classifier, 61M parameters); dropout off by default for exact gradient checks."""
    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
    )
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(6), nn.Flatten(), nn.Dropout(dropout), nn.Linear(256 * 36, 4096), nn.ReLU(inplace=True),
        nn.Dropout(dropout), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, classes),
    )
    return _Classifier(features, head), _image_batch(batch_size, image_size, classes)


def vgg11(image_size: int = 64, batch_size: int = 2, classes: int = 1000, dropout: float = 0.0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """VGG-11 (configuration A of Simonyan and Zisserman 2015, as in torchvision: 8 3x3 convs 64-512, 5 max
    pools, adaptive 7x7 pool, 4096-4096 classifier, 133M parameters); dropout off by default."""
    layers: list[nn.Module] = []
    cin = 3
    for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            cin = int(v)
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(inplace=True), nn.Dropout(dropout),
        nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(4096, classes),
    )
    return _Classifier(nn.Sequential(*layers), head), _image_batch(batch_size, image_size, classes)
