"""Datasets defined in the package, so DataLoader workers can pickle them.

Workers started with ``spawn`` or ``forkserver`` (macOS, Windows, and Python 3.14's
Linux default) pickle the dataset; a class defined in a notebook's ``__main__`` cannot
be found by them. Everything here is importable, hence picklable.

* :class:`SyntheticImages`: a CIFAR-shaped, deterministic, learnable dataset made from
  a seed (each class has its own mean pattern plus noise). Generated here, labelled as
  such wherever it stands in for real data.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """``size`` float32 images of shape ``(channels, image_size, image_size)`` with labels.

    Sample ``i`` is the same on every call and in every process (it is generated from
    ``seed`` and ``i``), so results do not depend on worker count or order. Images are
    ``pattern[label] + noise * noise_std``: learnable, so a loss curve goes down.

    >>> data = SyntheticImages(size=8)
    >>> image, label = data[3]
    >>> tuple(image.shape), 0 <= label < 10, torch.equal(image, data[3][0])
    ((3, 32, 32), True, True)
    """

    def __init__(
        self,
        size: int = 1024,
        num_classes: int = 10,
        image_size: int = 32,
        channels: int = 3,
        seed: int = 0,
        noise_std: float = 1.0,
    ) -> None:
        if size < 1 or num_classes < 1:
            raise ValueError("size and num_classes must be at least 1")
        self.size = size
        self.num_classes = num_classes
        self.shape = (channels, image_size, image_size)
        self.seed = seed
        self.noise_std = noise_std
        generator = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(num_classes, *self.shape, generator=generator)

    def __len__(self) -> int:
        return self.size

    def label(self, index: int) -> int:
        """The label of sample ``index`` (cheap: no image is generated)."""
        return (index * 7 + self.seed) % self.num_classes

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -self.size <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        index %= self.size
        label = self.label(index)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        noise = torch.randn(self.shape, generator=generator)
        return self.patterns[label] + self.noise_std * noise, label
