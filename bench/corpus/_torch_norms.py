"""Randomize the parameters a freshly built torch model keeps at identity values.

Why: a model built from a config starts with every normalization at identity
(LayerNorm/RMSNorm weight 1 and bias 0, BatchNorm running mean 0 and variance 1) and
often with zero-initialized residual branches (timm's last BatchNorm of a block,
layer scales, zero biases). A fusion that drops or misplaces such a parameter then
changes nothing in the output, and no numerical check can see it. Trained weights
would not let it hide; these random ones must not either.

Only torch is imported, so the side environments (``export_yolo.py``'s, the optimum
one of ``export_torch.py``) use the same function as the main one.
"""

from __future__ import annotations

import torch
from torch import nn

# BatchNorm statistics like a trained network's: means around 0, variances around 1.
_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every 1-D parameter and BatchNorm statistic a seeded non-identity value.

    Biases (and any other 1-D parameter named ``*bias``) ~ N(0, 0.1); every other 1-D
    parameter (norm weights, layer scales, RMSNorm gammas) ~ U(0.5, 1.5); BatchNorm
    running means ~ N(0, 0.1) and running variances ~ U(0.5, 1.5). Matrices keep the
    config's initializer. Returns the model, in inference mode.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() != 1:
                continue
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            else:
                param.copy_(torch.rand(param.shape, generator=gen) + 0.5)
        for module in model.modules():
            if isinstance(module, _BN_TYPES) and module.running_mean is not None:
                shape = module.running_mean.shape
                module.running_mean.copy_(torch.randn(shape, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(shape, generator=gen) + 0.5)
    return model.train(False)
