"""CNNs for 32x32 images. Every model exposes ``feature_blocks``: its convolution blocks in
order from the input, the unit that ``freeze: n`` counts in.

vgg11 with 10 classes has 9,231,114 parameters (BatchNorm, one 512->classes linear layer).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

VGG_LAYOUTS = {  # output channels per 3x3 conv; "M" = 2x2 max-pool
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"],
}


def norm(channels: int, batchnorm: bool) -> nn.Module:
    """BatchNorm, or nothing: without it a k-step accumulated update equals one big-batch update
    exactly, which is how accumulation and the sync methods are checked for equivalence."""
    return nn.BatchNorm2d(channels) if batchnorm else nn.Identity()


class BlockNet(nn.Module):
    """Feature blocks (``features``, what ``freeze`` counts), averaged over the image, then a
    linear head (``classifier``); subclasses build the two."""

    @property
    def feature_blocks(self) -> list[nn.Module]:
        return list(self.features)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class VGG(BlockNet):
    """CIFAR VGG: conv-BN-ReLU blocks (a following max-pool belongs to its block), then a linear head."""

    def __init__(self, layout: list, num_classes: int = 10, batchnorm: bool = True):
        super().__init__()
        blocks, in_ch = [], 3
        for item in layout:
            if item == "M":
                blocks[-1].append(nn.MaxPool2d(2))
                continue
            blocks.append([nn.Conv2d(in_ch, item, 3, padding=1), norm(item, batchnorm), nn.ReLU(inplace=True)])
            in_ch = item
        self.features = nn.Sequential(*(nn.Sequential(*b) for b in blocks))
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x):  # five max-pools leave 1x1 of a 32x32 image: nothing to average
        return self.classifier(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(BlockNet):
    """CIFAR ResNet-18: 3x3 stem without max-pool, four stages of two basic blocks."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        blocks, in_ch = [stem], 64
        for out_ch, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(in_ch, out_ch, stride), BasicBlock(out_ch, out_ch, 1)]
            in_ch = out_ch
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(512, num_classes)


class SmallCNN(BlockNet):
    """Three conv-BN-ReLU-pool blocks (32-64-128 channels): seconds per epoch on a CPU."""

    def __init__(self, num_classes: int = 10, batchnorm: bool = True):
        super().__init__()
        blocks, in_ch = [], 3
        for out_ch in (32, 64, 128):
            blocks.append(nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, padding=1), norm(out_ch, batchnorm),
                                        nn.ReLU(inplace=True), nn.MaxPool2d(2)))
            in_ch = out_ch
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(128, num_classes)


def build_model(name: str, num_classes: int, batchnorm: bool = True) -> nn.Module:
    if name in VGG_LAYOUTS:
        return VGG(VGG_LAYOUTS[name], num_classes, batchnorm)
    if name == "resnet18":
        if not batchnorm:
            raise ValueError("batchnorm: resnet18 is only built with BatchNorm")
        return ResNet18(num_classes)
    if name == "smallcnn":
        return SmallCNN(num_classes, batchnorm)
    raise ValueError(f"unknown model {name!r}")


def set_frozen_blocks(model: nn.Module, n: int) -> None:
    """Freeze the first ``n`` feature blocks: no gradients (so no backward through them and
    nothing of theirs to synchronise) and BatchNorm statistics held (eval mode; the training
    loop calls this again after every ``model.train()``)."""
    blocks = model.feature_blocks
    if n > len(blocks):
        raise ValueError(f"freeze: {n} blocks asked for but {type(model).__name__} has only {len(blocks)}")
    for i, block in enumerate(blocks):
        frozen = i < n
        for p in block.parameters():
            p.requires_grad_(not frozen)
        if frozen:
            block.eval()
