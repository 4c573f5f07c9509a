"""A local torch hub cache standing in for ``pytorch/vision:v0.14.1``'s ResNet-50, so that
python_backend's ``examples/instance_kind`` model runs unmodified without the network.

The example calls ``torch.hub.load("pytorch/vision:v0.14.1", "resnet50",
weights="IMAGENET1K_V2", skip_validation=True)``. With ``TORCH_HOME`` pointing at the
directory :func:`prepare_torch_home` fills, torch.hub finds the repository already in its
cache (``hub/pytorch_vision_v0.14.1``, and ``pytorch`` is an owner torch.hub trusts) and
runs its ``hubconf.py``; that one builds ResNet-50 with torchvision's layout (the same
module names, so a torchvision state dict loads into it) in torch alone, and loads the
IMAGENET1K_V2 checkpoint through ``torch.hub.load_state_dict_from_url``, which finds
``hub/checkpoints/resnet50-11ad3fa6.pth`` and downloads nothing. The checkpoint holds
deterministic random weights (seed 0), not ImageNet's: answers are comparable between two
runs, not meaningful as labels.

torchvision itself is not used: its PyPI wheels link libtorch_cuda (``import torchvision``
fails with torch's CPU build: "operator torchvision::nms does not exist"), and its CPU
wheels are only on download.pytorch.org.
"""

from __future__ import annotations

from pathlib import Path

REPO_DIR = "pytorch_vision_v0.14.1"  # torch.hub's cache name for "pytorch/vision:v0.14.1"
CHECKPOINT = "resnet50-11ad3fa6.pth"  # torchvision's ResNet50_Weights.IMAGENET1K_V2 file name

HUBCONF = '''"""ResNet-50 with torchvision's module layout, in torch alone (a test stand-in)."""
import torch
from torch import nn

dependencies = ["torch"]
URLS = {"IMAGENET1K_V2": "https://download.pytorch.org/models/resnet50-11ad3fa6.pth"}


class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, layers[0])
        self.layer2 = self._layer(128, layers[1], 2)
        self.layer3 = self._layer(256, layers[2], 2)
        self.layer4 = self._layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def _layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(weights=None, progress=True, **kwargs):
    model = ResNet(**kwargs)
    if weights is not None:
        model.load_state_dict(torch.hub.load_state_dict_from_url(URLS[str(weights)], progress=progress))
    return model
'''


def prepare_torch_home(where: Path) -> Path:
    """Fill ``where`` (to be ``TORCH_HOME``) with the hub repository and its checkpoint;
    returns ``where``. Needs torch."""
    import importlib.util

    import torch

    hub = where / "hub"
    (hub / REPO_DIR).mkdir(parents=True)
    (hub / REPO_DIR / "hubconf.py").write_text(HUBCONF, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("resnet50_hubconf", hub / REPO_DIR / "hubconf.py")
    assert spec is not None and spec.loader is not None
    hubconf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hubconf)
    torch.manual_seed(0)
    model = hubconf.resnet50()
    with torch.no_grad():  # running statistics other than BatchNorm's defaults, so that eval() uses them
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    (hub / "checkpoints").mkdir()
    torch.save(model.state_dict(), hub / "checkpoints" / CHECKPOINT)
    return where
