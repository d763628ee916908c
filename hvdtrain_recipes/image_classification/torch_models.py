"""PyTorch image models: a small CNN (CPU default) and ResNet-18/34/50/101 (He et al., 2016).

Written out here because torchvision has no CPU build that matches torch 2.13. For inputs
smaller than 64 pixels the ResNets use a 3x3 stem without max-pooling (the CIFAR variant).
"""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two 3x3 convolutions, max-pool, dropout, two dense layers (the classic MNIST network)."""

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int):
        super().__init__()
        h, w = image_size
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(64 * (h // 2) * (w // 2), 128), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        self.shortcut = _shortcut(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand, with a residual connection (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """ResNet with the ImageNet stem (7x7/2 + max-pool) or, for small images, a 3x3 stem."""

    def __init__(self, block: type, layers: list[int], in_channels: int, num_classes: int, small_input: bool):
        super().__init__()
        self.blocks_per_stage = list(layers)  # torchvision's layer1..layer4 lengths (torchvision_weights)
        stem = [nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)] if small_input else \
            [nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)]
        stem += [nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
        if not small_input:
            stem.append(nn.MaxPool2d(3, 2, 1))
        self.stem = nn.Sequential(*stem)
        stages, cin = [], 64
        for i, (width, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            for j in range(blocks):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def build_model(name: str, in_channels: int, image_size: tuple[int, int], num_classes: int) -> nn.Module:
    """The model called ``name``: small_cnn, resnet18, resnet34, resnet50 or resnet101."""
    small = min(image_size) < 64
    if name == "small_cnn":
        return SmallCNN(in_channels, image_size, num_classes)
    if name in RESNETS:
        block, layers = RESNETS[name]
        return ResNet(block, layers, in_channels, num_classes, small)
    raise ValueError(f"model.name {name!r} is not allowed for image-classification; "
                     f"choose one of: {', '.join(MODELS)}")


RESNETS = {  # name: (block, residual blocks per stage), as torchvision's resnet18 ... resnet101
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
    "resnet101": (Bottleneck, [3, 4, 23, 3]),
}
MODELS = ("small_cnn", *RESNETS)


def pipeline_blocks(model: nn.Module) -> list[nn.Module]:
    """``model`` as ordered blocks for pipeline stages: small_cnn's features | classifier; a ResNet's
    stem, each residual block, then the pooling head (a cut by parameter count puts the wide last
    residual blocks on their own)."""
    if isinstance(model, SmallCNN):
        return [model.features, model.classifier]
    if isinstance(model, ResNet):
        return [model.stem, *model.stages, model.head]
    raise ValueError(f"no pipeline blocks for {type(model).__name__}")
