"""The course's models by name: ``small_cnn`` (fast on a CPU), ``mlp``, torchvision's
``resnet18`` and ``mobilenet_v3_small`` (``weights=None``: no download) and a
``tiny_transformer``; their costs; and gradient checkpointing of their blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from course_utils.flops import count_flops

MODEL_NAMES = ("small_cnn", "mlp", "resnet18", "mobilenet_v3_small", "tiny_transformer")


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm={kind!r}: use 'batch', 'group' or 'none'")


class SmallCNN(nn.Module):
    """Conv-norm-ReLU blocks, each halving the image, then a linear classifier.
    ``norm="group"`` or ``"none"``: results independent of how a batch is split (DDP)."""

    def __init__(self, num_classes: int = 10, width: int = 32, depth: int = 4, norm: str = "batch"):
        super().__init__()
        sizes = [3] + [width * 2 ** min(i, 3) for i in range(depth)]  # channels
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(
                    nn.Conv2d(sizes[i], sizes[i + 1], 3, padding=1, bias=norm == "none"),
                    _norm(norm, sizes[i + 1]),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2) if i < depth - 1 else nn.Identity(),
                )
                for i in range(depth)
            )
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(sizes[-1], num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class MLP(nn.Module):
    """Flatten, then ``depth`` hidden Linear-ReLU layers, then a linear classifier."""

    def __init__(
        self,
        in_features: int = 3 * 32 * 32,
        hidden: int = 512,
        num_classes: int = 10,
        depth: int = 2,
    ) -> None:
        super().__init__()
        sizes = [in_features] + [hidden] * depth
        self.flatten = nn.Flatten()
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in itertools.pairwise(sizes))
        )
        self.head = nn.Linear(sizes[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.flatten(x)))


class TinyTransformer(nn.Module):
    """A small ViT: 4x4 patch embedding plus a learned position, ``depth`` pre-norm encoder
    blocks, the mean over patches to a linear classifier; no dropout (deterministic)."""

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int = 32,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
    ) -> None:
        super().__init__()
        if image_size % 4:
            raise ValueError(f"image_size {image_size} is not a multiple of patch 4")
        patches = (image_size // 4) ** 2
        self.embed = nn.Conv2d(3, dim, kernel_size=4, stride=4)
        self.position = nn.Parameter(torch.zeros(1, patches, dim))
        nn.init.normal_(self.position, std=0.02)
        # each block: self-attention, then an MLP twice as wide (GELU), each with a residual
        mlp: dict[str, Any] = {"dim_feedforward": 2 * dim, "dropout": 0.0, "activation": "gelu"}
        self.blocks = nn.Sequential(
            *(
                nn.TransformerEncoderLayer(dim, heads, batch_first=True, norm_first=True, **mlp)
                for _ in range(depth)
            )
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.position  # (N, patches, dim)
        return self.head(self.norm(self.blocks(tokens)).mean(dim=1))


def build_model(name: str, num_classes: int = 10, **kwargs: Any) -> nn.Module:
    """A fresh model by name (see ``MODEL_NAMES``); ``kwargs`` go to its constructor.

    >>> type(build_model("small_cnn", norm="group")).__name__
    'SmallCNN'
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")
    if name in ("resnet18", "mobilenet_v3_small"):
        kwargs["weights"] = None  # random initialization: nothing to download
    ours = {"small_cnn": SmallCNN, "mlp": MLP, "tiny_transformer": TinyTransformer}
    if name in ours:
        return ours[name](num_classes=num_classes, **kwargs)
    # lazy: torchvision.models costs ~3 s of imports (torch._dynamo): every grader judge
    # and notebook kernel that imports course_utils would pay it for two of the models
    import torchvision.models

    builder: Callable[..., nn.Module] = getattr(torchvision.models, name)
    return builder(num_classes=num_classes, **kwargs)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (elements, not bytes).

    >>> count_parameters(nn.Linear(10, 5))
    55
    """
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class ModelCost:
    """Parameters of a model and FLOPs (2 per multiply-add) for one batch."""

    parameters: int
    batch_size: int
    forward_flops: int
    training_flops: int  # forward + backward: about 3x the forward

    @property
    def training_flops_per_sample(self) -> float:
        return self.training_flops / self.batch_size


def model_costs(name: str, batch_size: int = 1, image_size: int = 32, **kwargs: Any) -> ModelCost:
    """Parameters and FLOPs of ``build_model(name, **kwargs)`` on a batch of images: the
    forward counted in training mode (no fused inference path) with the math attention
    kernel (the fused CPU one is invisible to the counter); a training step is 3x that (the
    MFU convention), as torch 2.14 counts a grouped convolution's backward as dense (20x).

    >>> cost = model_costs("mlp", hidden=16, depth=1)  # 3072*16 + 16*10 multiply-adds
    >>> cost.parameters, cost.forward_flops, cost.training_flops
    (49338, 98624, 295872)
    """
    if name == "tiny_transformer":  # its position embedding is sized for the image
        kwargs = {"image_size": image_size, **kwargs}
    if name == "mlp":  # its first layer is sized for the flattened image
        kwargs = {"in_features": 3 * image_size**2, **kwargs}
    model = build_model(name, **kwargs)
    counted = max(batch_size, 2)  # BatchNorm refuses a batch of 1 in training mode
    inputs = torch.randn(counted, 3, image_size, image_size)
    with sdpa_kernel(SDPBackend.MATH):  # matmuls the counter sees
        forward = count_flops(model, inputs) * batch_size // counted  # linear in the batch
    return ModelCost(count_parameters(model), batch_size, forward, 3 * forward)


def blocks_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks of a model, the units of checkpointing: ``blocks.N`` (the
    course's), ``features.N`` (MobileNet), ``layer1``-``layer4`` (ResNet), else children."""
    for container in ("blocks", "features"):
        inner = getattr(model, container, None)
        if isinstance(inner, nn.Sequential):
            return [(f"{container}.{name}", child) for name, child in inner.named_children()]
    if all(hasattr(model, f"layer{i}") for i in range(1, 5)):
        return [(f"layer{i}", getattr(model, f"layer{i}")) for i in range(1, 5)]
    return list(model.named_children())


def _checkpointed_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        if not (torch.is_grad_enabled() and module.training):
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_blocks(model: nn.Module, names: list[str] | None = None) -> list[str]:
    """Wrap blocks of ``model`` (default: all of :func:`blocks_of`) with gradient
    checkpointing, in place (``forward`` replaced: the ``state_dict`` keys stay; twice is
    once), and return their names."""
    chosen = []
    for name, block in blocks_of(model):
        if names is not None and name not in names:
            continue
        if "forward" not in vars(block):  # not wrapped yet
            block.forward = _checkpointed_forward(block, block.forward)
        chosen.append(name)
    if names is not None and (missing := set(names) - set(chosen)):
        raise ValueError(
            f"no block named {sorted(missing)}; blocks: {[n for n, _ in blocks_of(model)]}"
        )
    return chosen
