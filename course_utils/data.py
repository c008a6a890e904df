"""Datasets, the CIFAR-10 download, and DataLoader settings for this machine. The datasets
live in the package so that ``spawn``/``forkserver`` workers (macOS, Windows, Python 3.14's
Linux default) can unpickle them, which they cannot do for a class from a notebook."""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from course_utils.device import cuda_gpu_count
from course_utils.env import usable_cores
from course_utils.units import MIB

# the normalization applied by every pipeline here (images are synthetic: round numbers)
MEAN = 0.5
STD = 0.25
MIN_AREA = 0.35  # the smallest random crop, as a share of the image's area


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """``size`` float32 images ``(3, image_size, image_size)``, each ``pattern[label] +
    noise_std * noise`` (learnable), sample ``i`` generated from ``seed`` and ``i``: the
    same in every process, whatever the worker count or order.

    >>> data = SyntheticImages(size=8)
    >>> image, label = data[3]
    >>> tuple(image.shape), 0 <= label < 10, torch.equal(image, data[3][0])
    ((3, 32, 32), True, True)
    """

    def __init__(
        self, size: int = 1024, image_size: int = 32, seed: int = 0, noise_std: float = 1.0
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.size = size
        self.num_classes = 10
        self.shape = (3, image_size, image_size)
        self.seed = seed
        self.noise_std = noise_std
        generator = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(self.num_classes, *self.shape, generator=generator)

    def __len__(self) -> int:
        return self.size

    def label(self, index: int) -> int:
        return (index * 7 + self.seed) % self.num_classes

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -self.size <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        index %= self.size
        label = self.label(index)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        noise = torch.randn(self.shape, generator=generator)
        return self.patterns[label] + self.noise_std * noise, label


def _normalize(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255 - MEAN) / STD


class EncodedImages(Dataset[tuple[torch.Tensor, int]]):
    """:class:`SyntheticImages` stored as PNG or JPEG bytes at ``stored_size`` pixels, each
    sample decoded with Pillow, cropped to a random ``MIN_AREA`` to all of its area, resized
    to ``image_size``, flipped half of the time and normalized (ImageNet's
    ``RandomResizedCrop``): a CPU-bound pipeline. ``augment=False`` takes the whole picture.

    >>> data = EncodedImages(size=4, stored_size=40, image_size=32)
    >>> image, label = data[1]
    >>> tuple(image.shape), image.dtype, label == SyntheticImages(size=4)[1][1]
    ((3, 32, 32), torch.float32, True)
    """

    def __init__(
        self,
        size: int = 512,
        *,
        image_format: str = "png",
        stored_size: int = 64,
        image_size: int = 32,
        augment: bool = True,
    ) -> None:
        if image_format not in ("png", "jpeg"):
            raise ValueError(f"image_format={image_format!r}: use 'png' or 'jpeg'")
        self.stored_size = stored_size
        self.image_size = image_size
        self.augment = augment
        source = SyntheticImages(size=size)
        self.labels = [source.label(i) for i in range(size)]
        self.encoded: list[bytes] = []
        for index in range(size):
            image = F.interpolate(source[index][0][None], (stored_size,) * 2, mode="bilinear")
            pixels = (image[0] * 0.2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(
                buffer, format=image_format.upper(), quality=90
            )
            self.encoded.append(buffer.getvalue())

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def nbytes(self) -> int:
        return sum(len(item) for item in self.encoded)

    def decode(self, index: int) -> torch.Tensor:
        """Sample ``index`` decoded, as ``uint8`` ``(3, stored_size, stored_size)``."""
        with Image.open(io.BytesIO(self.encoded[index])) as image:
            array = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
        return array.view(self.stored_size, self.stored_size, 3).permute(2, 0, 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, side = self.decode(index), self.stored_size
        if self.augment:
            crop = int(side * float(torch.empty(1).uniform_(MIN_AREA, 1.0)) ** 0.5)
            left, top = (int(v) for v in torch.randint(0, side - crop + 1, (2,)))
            image = image[:, top : top + crop, left : left + crop]
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
        size = (self.image_size, self.image_size)
        resized = F.interpolate(image[None].float(), size, mode="bilinear", antialias=True)
        return _normalize(resized[0].clamp(0, 255)), self.labels[index]


class PreDecodedImages(Dataset[tuple[torch.Tensor, int]]):
    """Images decoded once into one ``uint8`` tensor ``(N, 3, H, W)``: batches stay
    ``uint8`` (a quarter of float32's bytes to copy) for :func:`augment_on_device`;
    ``augment_per_sample=True`` augments each on the CPU instead.

    >>> data = PreDecodedImages.from_encoded(EncodedImages(size=3, stored_size=36))
    >>> data[0][0].dtype, tuple(data.images.shape)
    (torch.uint8, (3, 3, 36, 36))
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor | list[int],
        *,
        augment_per_sample: bool = False,
        image_size: int = 32,
    ) -> None:
        self.augment_per_sample = augment_per_sample
        self.image_size = image_size
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError("images must be a uint8 tensor of shape (N, C, H, W)")
        self.images = images
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        if len(self.labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(self.labels)} labels")

    @classmethod
    def from_encoded(cls, encoded: EncodedImages, **kwargs: Any) -> PreDecodedImages:
        """Decode every image of ``encoded`` once (the one-time cost of pre-decoding)."""
        images = torch.stack([encoded.decode(i) for i in range(len(encoded))])
        return cls(images, encoded.labels, **kwargs)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, Any]:
        """One sample ``(image, label)``, or with a list of indices (a ``BatchSampler``
        with ``DataLoader(batch_size=None)``) a whole batch in one indexing:
        ``(images, labels)``, no per-sample calls and no collate.

        >>> data = PreDecodedImages(torch.zeros(5, 3, 4, 4, dtype=torch.uint8), [0, 1, 2, 3, 4])
        >>> images, labels = data[[4, 1]]
        >>> tuple(images.shape), labels.tolist()
        ((2, 3, 4, 4), [4, 1])
        """
        if isinstance(index, (list, tuple, torch.Tensor)):  # a whole batch
            images = self.images[torch.as_tensor(index)]
            if self.augment_per_sample:
                images = augment_on_device(images, self.image_size)
            return images, self.labels[torch.as_tensor(index)]
        image = self.images[index]
        if self.augment_per_sample:  # the CPU augments each sample (in the workers)
            image = augment_on_device(image[None], self.image_size)[0]
        return image, int(self.labels[index])


def augment_on_device(images: torch.Tensor, image_size: int = 32) -> torch.Tensor:
    """:class:`EncodedImages`' augmentation for a ``uint8`` batch ``(N, C, H, W)`` on its
    device: each sample's crop and mirror in one ``affine_grid``/``grid_sample`` call.

    >>> batch = torch.randint(0, 256, (4, 3, 48, 48), dtype=torch.uint8)
    >>> out = augment_on_device(batch, 32)
    >>> tuple(out.shape), out.dtype
    ((4, 3, 32, 32), torch.float32)
    """
    count, device = images.shape[0], images.device
    # drawn by the CPU generator (the same under torch.manual_seed on every device), each
    # uniform between low and 1: the crop's area, its position in x and y, the mirror
    low = torch.tensor([MIN_AREA, -1.0, -1.0, 0.0])
    draws = low + (1 - low) * torch.rand(count, 4)
    if device.type == "cuda":  # a pageable copy would make the CPU wait for the GPU
        draws = draws.pin_memory()
    draws = draws.to(device, non_blocking=True)
    scale = draws[:, 0].sqrt()  # side of the crop, as a fraction of the image
    theta = torch.zeros(count, 2, 3, device=device)
    theta[:, 0, 0] = scale * torch.where(draws[:, 3] < 0.5, -1.0, 1.0)
    theta[:, 1, 1] = scale
    theta[:, :, 2] = draws[:, 1:3] * (1 - scale[:, None])
    size = [count, images.shape[1], image_size, image_size]
    grid = F.affine_grid(theta, size, align_corners=False)
    return F.grid_sample(_normalize(images), grid, mode="bilinear", align_corners=False)


# ----------------------------------------------------------------------- CIFAR-10


@dataclass
class LoadedData:
    """A dataset and where it came from (``source`` is ``"cifar10"`` or ``"synthetic"``)."""

    dataset: Dataset[Any]
    source: str
    note: str


def load_cifar10(
    root: str | os.PathLike[str] = "data",
    *,
    timeout_s: float = 10.0,
    fallback_size: int = 1024,
    download: bool = True,
) -> LoadedData:
    """CIFAR-10's training set (normalized), downloaded if needed with a ``timeout_s``
    socket timeout. Offline, or when anything else goes wrong, ``fallback_size``
    :class:`SyntheticImages`, said so in ``source`` and ``note``: label results on them."""
    from torchvision import datasets, transforms  # lazy: ~3 s of imports, for CIFAR only

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MEAN,) * 3, (STD,) * 3)]
    )
    try:
        dataset = datasets.CIFAR10(root, transform=transform, download=False)
        return LoadedData(dataset, "cifar10", f"CIFAR-10 found in {root}")
    except RuntimeError:
        pass  # not downloaded yet
    problem = "download=False and CIFAR-10 is not in " + str(root)
    if download:
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(timeout_s)
        try:
            dataset = datasets.CIFAR10(root, transform=transform, download=True)
            return LoadedData(dataset, "cifar10", f"CIFAR-10 downloaded to {root}")
        except Exception as error:  # offline, DNS, timeout, bad archive: fall back
            problem = f"{type(error).__name__}: {str(error).strip()[:160]}"
        finally:
            socket.setdefaulttimeout(previous)
    synthetic = SyntheticImages(size=fallback_size)
    note = (
        f"SYNTHETIC stand-in for CIFAR-10 ({fallback_size} generated CIFAR-shaped images; "
        f"could not get the real data: {problem})"
    )
    return LoadedData(synthetic, "synthetic", note)


# ------------------------------------------------------------ DataLoader advice


@dataclass
class LoaderAdvice:
    """DataLoader keyword arguments, the reason for each, and the facts they come from:
    ``DataLoader(dataset, batch_size=..., **advice.kwargs)``."""

    kwargs: dict[str, Any]
    reasons: dict[str, str]
    facts: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{key}={value!r}: {self.reasons[key]}" for key, value in self.kwargs.items()]
        return "\n".join(lines)


def suggest_loader_kwargs(
    *,
    cores: int | None = None,
    shm_bytes: int | None = -1,
    start_method: str | None = None,
    platform: str | None = None,
    gpus: int | None = None,
) -> LoaderAdvice:
    """DataLoader settings for this machine, each with its reason; pass the facts (cores,
    ``/dev/shm`` bytes, start method, OS, CUDA GPUs) to see another machine's.

    >>> advice = suggest_loader_kwargs(cores=2, shm_bytes=2**34, start_method="fork",
    ...                                platform="linux", gpus=1)
    >>> advice.kwargs["num_workers"], advice.kwargs["pin_memory"]
    (2, True)
    """
    cores = usable_cores() if cores is None else cores
    shm = shm_bytes
    if shm == -1:  # where workers put batches; none on macOS, Windows
        try:
            shm = shutil.disk_usage("/dev/shm").total
        except OSError:
            shm = None
    platform = platform or sys.platform
    method = start_method or multiprocessing.get_start_method(allow_none=True)
    if method is None:  # Python's default for the platform
        linux = platform.startswith("linux")
        method = "spawn" if not linux else "fork" if sys.version_info < (3, 14) else "forkserver"
    gpus = cuda_gpu_count() if gpus is None else gpus
    workers = 0 if cores <= 1 else cores if cores <= 4 else min(cores - 1, 16)
    per_core = (
        "workers would only compete with the main process"
        if cores <= 1
        else "one worker per core; the main process mostly waits for the GPU (Colab has 2)"
        if cores <= 4
        else "one left for the main process (which launches the GPU work), at most 16"
    )
    reasons = {
        "num_workers": f"{cores} usable core{'s' * (cores != 1)} (sched_getaffinity): {per_core}"
    }
    small_shm = shm is not None and shm < 2**30
    if shm is not None and small_shm and workers > 2:
        workers = 2
        reasons["num_workers"] += (
            f"; capped at 2 because /dev/shm is only {shm / MIB:.0f} MiB (Docker's default "
            "is 64 MiB: run with --shm-size=2g or --ipc=host)"
        )
    slow_start = method in ("spawn", "forkserver")
    prefetch = 2 if small_shm or workers > 2 else 4
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": gpus > 0,
        "persistent_workers": workers > 0,
        **({"prefetch_factor": prefetch} if workers else {}),
        "multiprocessing_context": method if workers > 0 else None,
    }
    reasons["pin_memory"] = (
        f"{gpus} CUDA GPU(s): pinned batches copy faster, and non_blocking=True returns to "
        "the host at once (overlapping compute needs a second stream or the loader's look-ahead)"
        if gpus
        else "no CUDA GPU: pinning only costs time"
    )
    reasons["persistent_workers"] = "no workers"
    if workers:
        reasons["persistent_workers"] = f"keep workers between epochs: start method {method!r} " + (
            "starts each by importing torch and unpickling the dataset (seconds)"
            if slow_start
            else "is cheap, but re-creating workers every epoch still costs"
        )
        reasons["prefetch_factor"] = f"{prefetch} batches queued per worker: " + (
            "PyTorch's default; /dev/shm is scarce or workers are many"
            if prefetch == 2
            else "few workers, so queue more to absorb slow batches"
        )
    reasons["multiprocessing_context"] = f"{platform}: {method!r}; " + (
        "the dataset is pickled to each worker: it must be importable (not from a notebook)"
        if slow_start
        else "workers inherit the dataset (copy-on-write)"
    )
    facts: dict[str, Any] = {"usable_cores": cores, "os_cpu_count": os.cpu_count()}
    facts |= {"shm_bytes": shm, "start_method": method, "platform": platform, "cuda_gpus": gpus}
    return LoaderAdvice(kwargs, reasons, facts)
