"""MobileNetV3-Large, EfficientNet-B0, ConvNeXt-Tiny and DenseNet-121 in plain torch.

timm would be the obvious source, but timm 1.0 imports torchvision when it is imported
(``timm.layers.create_norm`` imports ``torchvision.ops.misc.FrozenBatchNorm2d``) and
PyPI's torchvision does not import beside this project's torch build. So the four
networks are written out here, following torchvision's definitions (the published
architectures: Howard et al. 2019, Tan & Le 2019, Liu et al. 2022, Huang et al. 2017)
layer for layer, with the same hyper-parameters and parameter counts (5,483,032 /
5,288,548 / 28,589,128 / 7,978,856 with 1000 classes); ResNet-50 comes from
``make_resnet_models.py``. DenseNet-121 is the pre-activation case: most of its 121
BatchNormalizations follow a Concat or a pool, not a Conv, so they cannot fold.

Weights are seeded and random (nothing is downloaded). As in ``make_resnet_models``,
every normalization's statistics and affine parameters are randomized so that folding
or fusing them is not an identity that a broken rewrite could hide behind.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

SEED = 0


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's ``_make_divisible``: round to a multiple, never more than 10% down."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


def conv_norm_act(
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    *,
    groups: int = 1,
    act: Callable[[], nn.Module] | None = None,
    eps: float = 1e-5,
    momentum: float = 0.1,
) -> nn.Sequential:
    """Conv (no bias) -> BatchNorm -> activation, "same" padding (torchvision's
    ``Conv2dNormActivation``)."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=eps, momentum=momentum),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """x * gate(fc2(act(fc1(avgpool(x))))), the 1x1 convolutions with bias."""

    def __init__(self, channels: int, squeeze: int, act: type[nn.Module], gate: type[nn.Module]):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = act()
        self.scale_activation = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    """MobileNetV3 / EfficientNet block: expand 1x1, depthwise kxk, SE, project 1x1."""

    def __init__(
        self,
        cin: int,
        kernel: int,
        expanded: int,
        cout: int,
        stride: int,
        *,
        act: type[nn.Module],
        se: SqueezeExcitation | None,
        eps: float,
        momentum: float,
    ):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        norm = dict(eps=eps, momentum=momentum)
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(conv_norm_act(cin, expanded, 1, act=act, **norm))
        layers.append(
            conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, act=act, **norm)
        )
        if se is not None:
            layers.append(se)
        layers.append(conv_norm_act(expanded, cout, 1, act=None, **norm))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res_connect else out


# (in, kernel, expanded, out, SE, activation, stride): torchvision's mobilenet_v3_large
_MNV3_LARGE = [
    (16, 3, 16, 16, False, "RE", 1),
    (16, 3, 64, 24, False, "RE", 2),
    (24, 3, 72, 24, False, "RE", 1),
    (24, 5, 72, 40, True, "RE", 2),
    (40, 5, 120, 40, True, "RE", 1),
    (40, 5, 120, 40, True, "RE", 1),
    (40, 3, 240, 80, False, "HS", 2),
    (80, 3, 200, 80, False, "HS", 1),
    (80, 3, 184, 80, False, "HS", 1),
    (80, 3, 184, 80, False, "HS", 1),
    (80, 3, 480, 112, True, "HS", 1),
    (112, 3, 672, 112, True, "HS", 1),
    (112, 5, 672, 160, True, "HS", 2),
    (160, 5, 960, 160, True, "HS", 1),
    (160, 5, 960, 160, True, "HS", 1),
]


class MobileNetV3Large(nn.Module):
    """MobileNetV3-Large (torchvision ``mobilenet_v3_large``), BN eps 1e-3."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        bn = dict(eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [conv_norm_act(3, 16, 3, 2, act=nn.Hardswish, **bn)]
        for cin, k, exp, cout, use_se, act_name, stride in _MNV3_LARGE:
            act = nn.ReLU if act_name == "RE" else nn.Hardswish
            se = (
                SqueezeExcitation(exp, make_divisible(exp // 4), nn.ReLU, nn.Hardsigmoid)
                if use_se
                else None
            )
            layers.append(InvertedResidual(cin, k, exp, cout, stride, act=act, se=se, **bn))
        layers.append(conv_norm_act(160, 960, 1, act=nn.Hardswish, **bn))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(960, 1280), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(1280, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# (expand ratio, kernel, stride, in, out, layers): torchvision's efficientnet_b0
_EFFNET_B0 = [
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
]


class EfficientNetB0(nn.Module):
    """EfficientNet-B0 (torchvision ``efficientnet_b0``); stochastic depth is the
    identity in inference, so it is left out."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        bn = dict(eps=1e-5, momentum=0.1)
        layers: list[nn.Module] = [conv_norm_act(3, 32, 3, 2, act=nn.SiLU, **bn)]
        for ratio, k, stride, cin, cout, n in _EFFNET_B0:
            stage = []
            for i in range(n):
                block_in = cin if i == 0 else cout
                exp = make_divisible(block_in * ratio)
                se = SqueezeExcitation(exp, max(1, block_in // 4), nn.SiLU, nn.Sigmoid)
                s = stride if i == 0 else 1
                stage.append(InvertedResidual(block_in, k, exp, cout, s, act=nn.SiLU, se=se, **bn))
            layers.append(nn.Sequential(*stage))
        layers.append(conv_norm_act(320, 1280, 1, act=nn.SiLU, **bn))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (torchvision's, via permutes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    """ConvNeXt block: dw 7x7 -> LayerNorm -> Linear 4x -> GELU -> Linear, scaled, + x."""

    def __init__(self, dim: int):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim, bias=True),
            Permute((0, 2, 3, 1)),
            nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim),
            nn.GELU(),
            nn.Linear(4 * dim, dim),
            Permute((0, 3, 1, 2)),
        )
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_scale * self.block(x) + x


class Permute(nn.Module):
    def __init__(self, dims: tuple[int, ...]):
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)


class ConvNeXtTiny(nn.Module):
    """ConvNeXt-Tiny (torchvision ``convnext_tiny``): depths 3-3-9-3, widths 96-768."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        dims, depths = (96, 192, 384, 768), (3, 3, 9, 3)
        layers: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, 96, 4, 4), LayerNorm2d(96, eps=1e-6))]
        for i, (dim, depth) in enumerate(zip(dims, depths, strict=True)):
            layers.append(nn.Sequential(*[CNBlock(dim) for _ in range(depth)]))
            if i + 1 < len(dims):
                layers.append(
                    nn.Sequential(LayerNorm2d(dim, eps=1e-6), nn.Conv2d(dim, dims[i + 1], 2, 2))
                )
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            LayerNorm2d(768, eps=1e-6), nn.Flatten(1), nn.Linear(768, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.features(x)))


class DenseLayer(nn.Module):
    """BN -> ReLU -> 1x1 Conv (4 x growth) -> BN -> ReLU -> 3x3 Conv (growth), whose
    output is concatenated to the block's running feature map (torchvision ``_DenseLayer``)."""

    def __init__(self, cin: int, growth: int, bn_size: int):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU()
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(self.relu1(self.norm1(x)))
        return torch.cat([x, self.conv2(self.relu2(self.norm2(y)))], 1)


class DenseNet121(nn.Module):
    """DenseNet-121 (torchvision ``densenet121``): growth 32, blocks 6-12-24-16,
    64 initial features, bottleneck 4x, transitions halve channels and resolution."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        growth, bn_size, channels = 32, 4, 64
        layers: list[nn.Module] = [
            nn.Conv2d(3, channels, 7, 2, 3, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        for i, depth in enumerate((6, 12, 24, 16)):
            for _ in range(depth):
                layers.append(DenseLayer(channels, growth, bn_size))
                channels += growth
            if i < 3:  # transition: BN -> ReLU -> 1x1 Conv -> AvgPool 2x2
                layers += [
                    nn.BatchNorm2d(channels),
                    nn.ReLU(),
                    nn.Conv2d(channels, channels // 2, 1, bias=False),
                    nn.AvgPool2d(2, 2),
                ]
                channels //= 2
        layers += [nn.BatchNorm2d(channels), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


ARCHITECTURES: dict[str, type[nn.Module]] = {
    "mobilenetv3_large": MobileNetV3Large,
    "efficientnet_b0": EfficientNetB0,
    "convnext_tiny": ConvNeXtTiny,
    "densenet121": DenseNet121,
}


def build(name: str, num_classes: int = 1000) -> nn.Module:
    """The seeded network in inference mode, its norms randomized (see module doc)."""
    torch.manual_seed(SEED)
    model = ARCHITECTURES[name](num_classes)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
            if isinstance(m, nn.BatchNorm2d | nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
            if isinstance(m, CNBlock):
                # 1e-6 (the training init) would make every block an identity
                m.layer_scale.uniform_(0.1, 0.5)
    return model.train(False)
