"""The datasets of course_utils.data: decoding and augmentation, device augmentation,
the CIFAR-10 fallback, pickling through real DataLoader workers under spawn and
forkserver, and the loader advice."""

from __future__ import annotations

import multiprocessing
import pickle
import time

import pytest
import torch
from torch.utils.data import DataLoader, StackDataset

from course_utils.data import (
    MEAN,
    STD,
    EncodedImages,
    PreDecodedImages,
    SyntheticImages,
    augment_on_device,
    load_cifar10,
    suggest_loader_kwargs,
)


@pytest.fixture(scope="module")
def encoded():
    return EncodedImages(size=8, stored_size=40, image_size=32)


@pytest.mark.parametrize("image_format", ["png", "jpeg"])
def test_encoded_images_decode_to_the_stored_picture(image_format):
    data = EncodedImages(size=4, image_format=image_format, stored_size=32, augment=False)
    source = SyntheticImages(size=4)
    for index in range(4):
        image, label = data[index]
        assert label == source[index][1]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32

        # without augmentation it is the source picture, normalized (JPEG is lossy)
        def error(i, image=image):
            expected = ((source[i][0] * 0.2 + 0.5).clamp(0, 1) - MEAN) / STD
            return (image - expected).abs().mean().item()

        if image_format == "png":  # lossless: only the rounding to uint8
            assert error(index) < 0.02
        else:  # lossy on noisy pictures, but still closest to its own source
            assert error(index) < min(error(other) for other in range(4) if other != index)
    assert data.nbytes == sum(len(b) for b in data.encoded)


def test_augmentation_changes_samples_and_draws_fresh_crops(encoded):
    torch.manual_seed(0)
    first, second = encoded[0][0], encoded[0][0]
    assert not torch.equal(first, second)  # a new crop (or flip) each time
    with pytest.raises(ValueError):
        EncodedImages(size=1, image_format="gif")


def test_pre_decoded_images_hold_the_decoded_pixels(encoded):
    data = PreDecodedImages.from_encoded(encoded)
    assert data.images.shape == (8, 3, 40, 40) and data.images.dtype == torch.uint8
    assert torch.equal(data[3][0], encoded.decode(3)) and data[3][1] == encoded.labels[3]
    with pytest.raises(ValueError):
        PreDecodedImages(torch.zeros(2, 3, 4, 4), [0, 1])
    with pytest.raises(ValueError):
        PreDecodedImages(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), [0])


def test_augment_on_device_matches_the_per_sample_statistics():
    images = torch.randint(0, 256, (64, 3, 48, 48), dtype=torch.uint8)
    torch.manual_seed(0)
    out = augment_on_device(images, 32)
    torch.manual_seed(0)
    again = augment_on_device(images, 32)
    assert out.shape == (64, 3, 32, 32) and torch.equal(out, again)
    assert out.min() >= (0 - MEAN) / STD - 1e-5 and out.max() <= (1 - MEAN) / STD + 1e-5
    # min_area=1 and no flip would be the resized image; the crops differ per sample
    flat = torch.full((2, 3, 40, 40), 128, dtype=torch.uint8)
    expected = (128 / 255 - MEAN) / STD
    assert torch.allclose(
        augment_on_device(flat, 16), torch.full((2, 3, 16, 16), expected), atol=1e-5
    )
    assert not torch.equal(out[0], out[1])


def test_cifar10_falls_back_to_labelled_synthetic_data_offline(tmp_path):
    start = time.perf_counter()
    loaded = load_cifar10(tmp_path, timeout_s=3, fallback_size=32)
    assert time.perf_counter() - start < 60
    if loaded.source == "cifar10":  # pragma: no cover - only with internet
        assert len(loaded.dataset) == 50_000
    else:
        assert loaded.source == "synthetic" and "SYNTHETIC" in loaded.note
        assert len(loaded.dataset) == 32
    offline = load_cifar10(tmp_path / "none", download=False, fallback_size=8)
    assert offline.source == "synthetic" and "download=False" in offline.note


def _all_datasets():
    encoded = EncodedImages(size=8, stored_size=36)
    return StackDataset(
        synthetic=SyntheticImages(size=8),
        encoded=encoded,
        decoded=PreDecodedImages.from_encoded(encoded),
        cifar=load_cifar10("/nonexistent", download=False, fallback_size=8).dataset,
    )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_every_dataset_goes_through_workers_started_with(method):
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this OS")
    data = _all_datasets()
    pickle.loads(pickle.dumps(data))
    loader = DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context=method)
    batches = list(loader)
    assert len(batches) == 2
    for key in ("synthetic", "encoded", "decoded", "cifar"):
        labels = torch.cat([batch[key][1] for batch in batches])
        assert labels.tolist() == [data.datasets[key][i][1] for i in range(8)], key  # type: ignore[index]
    assert batches[0]["decoded"][0].dtype == torch.uint8


def test_loader_advice_follows_the_machine():
    colab = suggest_loader_kwargs(
        cores=2, shm_bytes=2**34, start_method="fork", platform="linux", gpus=1
    )
    assert colab.kwargs["num_workers"] == 2 and colab.kwargs["pin_memory"] is True
    assert colab.kwargs["persistent_workers"] is True
    assert "2 usable cores" in colab.reasons["num_workers"]
    docker = suggest_loader_kwargs(
        cores=32, shm_bytes=64 * 2**20, start_method="fork", platform="linux", gpus=8
    )
    assert docker.kwargs["num_workers"] == 2 and "shm" in docker.reasons["num_workers"]
    big = suggest_loader_kwargs(
        cores=32, shm_bytes=2**35, start_method="spawn", platform="darwin", gpus=0
    )
    assert big.kwargs["num_workers"] == 31 - 15 and big.kwargs["pin_memory"] is False
    assert "pickled" in big.reasons["multiprocessing_context"]
    single = suggest_loader_kwargs(cores=1, shm_bytes=None, platform="linux", gpus=0)
    assert single.kwargs["num_workers"] == 0 and "prefetch_factor" not in single.kwargs
    here = suggest_loader_kwargs()
    assert set(here.kwargs) <= set(here.reasons) and here.facts["usable_cores"] >= 1
    assert str(here).count("\n") == len(here.kwargs) - 1


@pytest.mark.gpu
def test_augment_on_device_runs_on_the_gpu():
    images = torch.randint(0, 256, (32, 3, 48, 48), dtype=torch.uint8, device="cuda")
    out = augment_on_device(images, 32)
    assert out.device.type == "cuda" and out.shape == (32, 3, 32, 32)
    advice = suggest_loader_kwargs()
    assert advice.kwargs["pin_memory"] is True
