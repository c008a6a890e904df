"""The reference training step: each toggle on CPU gives the gradients it should."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from course_utils.checks.core import check, check_close, passed
from course_utils.data import SyntheticImages
from course_utils.models import build_model, checkpoint_blocks
from course_utils.training import TrainConfig, TrainStep, train


def _batch(n=32, seed=0):
    data = SyntheticImages(size=n, seed=seed)
    inputs = torch.stack([data[i][0] for i in range(n)])
    targets = torch.tensor([data[i][1] for i in range(n)])
    return inputs, targets


def _grads_after_one_backward(config, model, batch):
    step = TrainStep(copy.deepcopy(model), "cpu", config)
    grads = {}
    original = step.optimizer_step

    def capture():
        grads.update({n: p.grad.clone() for n, p in step.model.named_parameters()})
        original()

    step.optimizer_step = capture
    step(batch)
    return grads


def _assert_same(a, b, atol):
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"largest gradient difference {worst:.3g}"


@pytest.mark.parametrize("name", ["small_cnn", "mlp"])
def test_accumulation_over_4_micro_batches_equals_one_big_batch(name):
    torch.manual_seed(0)
    # GroupNorm, not BatchNorm: batch statistics would differ per micro-batch by design.
    model = build_model(name, norm="group") if name == "small_cnn" else build_model(name)
    batch = _batch(32)
    whole = _grads_after_one_backward(TrainConfig(precision="fp32"), model, batch)
    accumulated = _grads_after_one_backward(
        TrainConfig(precision="fp32", accumulation_steps=4), model, batch
    )
    _assert_same(whole, accumulated, atol=1e-5)


def test_uneven_micro_batches_are_weighted_by_size():
    torch.manual_seed(0)
    model = build_model("mlp", hidden=32)
    batch = _batch(30)  # 30 = 8 + 8 + 7 + 7
    whole = _grads_after_one_backward(TrainConfig(precision="fp32"), model, batch)
    split = _grads_after_one_backward(
        TrainConfig(precision="fp32", accumulation_steps=4), model, batch
    )
    _assert_same(whole, split, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_checkpointing_gives_the_same_gradients(name):
    torch.manual_seed(0)
    model = build_model(name)
    batch = _batch(8)
    plain = _grads_after_one_backward(TrainConfig(precision="fp32"), model, batch)
    checkpointed = _grads_after_one_backward(
        TrainConfig(precision="fp32", checkpointing=True), model, batch
    )
    _assert_same(plain, checkpointed, atol=1e-5)


def test_checkpointing_keeps_state_dict_keys():
    model = build_model("small_cnn")
    keys = list(model.state_dict())
    names = checkpoint_blocks(model, ["blocks.1"])
    assert names == ["blocks.1"] and list(model.state_dict()) == keys
    assert "forward" in vars(model.blocks[1]) and "forward" not in vars(model.blocks[0])
    with pytest.raises(ValueError, match="no block named"):
        checkpoint_blocks(model, ["blocks.99"])


def test_checkpointing_frees_activation_memory_during_the_forward_pass():
    """Fewer tensors are saved for backward: count them with saved_tensors_hooks."""

    def saved_bytes(checkpointing):
        model = build_model("small_cnn", width=16)
        if checkpointing:
            checkpoint_blocks(model)
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(_batch(4)[0]).sum()
        return total

    assert saved_bytes(True) < saved_bytes(False) / 3


def test_compile_failure_falls_back_to_eager(monkeypatch, capsys):
    def broken_compile(model, **kwargs):
        def compiled(*args):
            raise RuntimeError("backend compiler failed: no triton for this GPU")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    torch.manual_seed(0)
    model = build_model("mlp", hidden=16)
    batch = _batch(8)
    eager = _grads_after_one_backward(TrainConfig(precision="fp32"), model, batch)
    step = TrainStep(copy.deepcopy(model), "cpu", TrainConfig(precision="fp32", compile=True))
    loss = step(batch)
    assert torch.isfinite(loss)
    assert step.compile_error and "no triton" in step.compile_error
    assert "running eagerly" in capsys.readouterr().out
    # the fallback trained exactly like eager: compare against one eager SGD step
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p -= 0.05 * eager[name]
    for (_, a), (_, b) in zip(
        step.model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6)


def test_out_of_memory_during_compiled_step_is_not_hidden(monkeypatch):
    def oom_compile(model, **kwargs):
        def compiled(*args):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

        return compiled

    monkeypatch.setattr(torch, "compile", oom_compile)
    step = TrainStep(build_model("mlp", hidden=8), "cpu", TrainConfig(compile=True))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        step(_batch(4))


def test_bf16_autocast_on_cpu_trains_and_fp32_is_default_on_cpu():
    assert TrainStep(build_model("mlp", hidden=8), "cpu").precision.name == "fp32"
    step = TrainStep(build_model("small_cnn", width=8), "cpu", TrainConfig(precision="bf16"))
    assert step.precision.dtype == torch.bfloat16 and not step.scaler.is_enabled()
    assert torch.isfinite(step(_batch(8)))


def test_fp16_uses_a_grad_scaler():
    step = TrainStep(build_model("mlp", hidden=8), "cpu", TrainConfig(precision="fp16"))
    assert step.scaler.is_enabled()
    assert torch.isfinite(step(_batch(8)))


def test_channels_last_layout_and_same_loss():
    torch.manual_seed(0)
    model = build_model("small_cnn", width=8)
    batch = _batch(8)
    a = TrainStep(copy.deepcopy(model), "cpu", TrainConfig(precision="fp32"))(batch)
    step = TrainStep(copy.deepcopy(model), "cpu", TrainConfig(precision="fp32", channels_last=True))
    b = step(batch)
    conv = step.model.blocks[0][0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
def test_training_lowers_the_loss(optimizer):
    torch.manual_seed(0)
    loader = DataLoader(SyntheticImages(size=256, noise_std=0.5), batch_size=32, shuffle=True)
    lr = {"sgd": 0.2, "momentum": 0.05}.get(optimizer, 0.003)
    step = TrainStep(
        build_model("small_cnn", width=8), "cpu", TrainConfig(optimizer=optimizer, lr=lr)
    )
    result = train(step, loader, epochs=3)
    assert result.steps == 24 and result.samples == 768 and result.samples_per_s > 0
    first, last = sum(result.losses[:4]) / 4, sum(result.losses[-4:]) / 4
    assert last < 0.7 * first, (first, last)
    with torch.inference_mode():
        correct = sum((step.model.eval()(x).argmax(1) == y).sum().item() for x, y in loader)
    assert correct / result.samples * 3 > 0.3  # accuracy; 10 classes: chance is 0.1


def test_zero_grad_set_to_none_toggle():
    step = TrainStep(build_model("mlp", hidden=8), "cpu", TrainConfig())
    step(_batch(4))
    assert all(p.grad is None for p in step.model.parameters())
    step = TrainStep(build_model("mlp", hidden=8), "cpu", TrainConfig(set_to_none=False))
    step(_batch(4))
    assert all(p.grad is not None and not p.grad.any() for p in step.model.parameters())


def test_train_stops_at_max_steps_and_bad_config_is_refused():
    loader = DataLoader(SyntheticImages(size=64), batch_size=8)
    step = TrainStep(build_model("mlp", hidden=8), "cpu")
    assert train(step, loader, max_steps=3, epochs=5).steps == 3
    for bad in ({"precision": "fp8"}, {"optimizer": "lion"}, {"accumulation_steps": 0}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


def test_checkpointing_the_transformer_blocks_gives_the_same_gradients():
    torch.manual_seed(0)
    model = build_model("tiny_transformer", depth=2, dim=32, heads=2)
    batch = _batch(4)
    plain = _grads_after_one_backward(TrainConfig(precision="fp32"), model, batch)
    checkpointed = _grads_after_one_backward(
        TrainConfig(precision="fp32", checkpointing=True), model, batch
    )
    _assert_same(plain, checkpointed, atol=1e-5)


def test_accumulation_equals_one_big_batch_for_the_transformer():
    torch.manual_seed(0)
    model = build_model("tiny_transformer", depth=1, dim=32, heads=2)  # LayerNorm: per sample
    batch = _batch(16)
    whole = _grads_after_one_backward(TrainConfig(precision="fp32"), model, batch)
    accumulated = _grads_after_one_backward(
        TrainConfig(precision="fp32", accumulation_steps=4), model, batch
    )
    _assert_same(whole, accumulated, atol=1e-5)


# ------------------------------------------- notebook 04's written-out steps = TrainStep

NOTEBOOK_04 = Path(__file__).resolve().parents[1] / "notebooks" / "04_memory_efficient_models.ipynb"


def _notebook_04_cells(*ids, **names):
    """Run notebook 04's cells ``ids`` in a fresh namespace (with ``names``); return it."""
    import nbformat

    from course_utils.checks.nb04 import run_amp_step_against_fp32

    cells = {c.get("id"): c.source for c in nbformat.read(NOTEBOOK_04, as_version=4).cells}
    namespace = {
        "torch": torch,
        "nn": torch.nn,
        "build_model": build_model,
        "device": torch.device("cpu"),
        "LOOP_WIDTH": 8,
        "check": check,
        "check_close": check_close,
        "passed": passed,
        "run_amp_step_against_fp32": run_amp_step_against_fp32,
        **names,
    }
    for cell_id in ids:
        exec(compile(cells[cell_id], f"notebook 04, cell {cell_id}", "exec"), namespace)
    return namespace


def _after_one_sgd_step(step_fn, model, batch):
    """The loss and the weights after ``step_fn(model, SGD, inputs, targets)``."""
    model = copy.deepcopy(model)
    loss = step_fn(model, torch.optim.SGD(model.parameters(), lr=0.05), *batch)
    return loss, [p.detach().clone() for p in model.parameters()], model


def _same_step(cell_step, config, atol, model=None, batch=None, steps=1):
    torch.manual_seed(0)
    model = model or build_model("small_cnn", width=8)
    batch = batch or _batch(8)
    mine, reference = copy.deepcopy(model), copy.deepcopy(model)
    optimizer = torch.optim.SGD(mine.parameters(), lr=0.05)
    package = TrainStep(reference, "cpu", config)
    for _ in range(steps):
        loss = cell_step(mine, optimizer, *batch)
        package_loss = package(batch)
        assert abs(loss.item() - package_loss.item()) <= atol, (loss, package_loss)
    # one SGD step moves each weight by -lr * its gradient: same weights, same gradients
    for (name, a), b in zip(mine.named_parameters(), package.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=atol, rtol=0), name
    assert all(p.grad is None for p in mine.parameters()), "zero_grad(set_to_none=True)"
    return mine, package


def test_notebook_04_plain_loop_is_train_step_in_fp32():
    ns = _notebook_04_cells("nb04-41")
    _same_step(ns["train_step"], TrainConfig(precision="fp32", optimizer="sgd", lr=0.05), 1e-6)


def test_notebook_04_amp_cell_is_train_step_in_bf16_and_fp16():
    ns = _notebook_04_cells("nb04-44")
    assert ns["amp_dtype"] == torch.bfloat16 and not ns["scaler"].is_enabled()  # on a CPU
    _same_step(ns["amp_train_step"], TrainConfig(precision="bf16", optimizer="sgd", lr=0.05), 1e-6)
    # the T4 branch of the cell, run on the CPU: fp16 with a GradScaler, two steps
    ns["amp_dtype"], ns["scaler"] = torch.float16, torch.amp.GradScaler("cpu")
    _, package = _same_step(
        ns["amp_train_step"], TrainConfig(precision="fp16", optimizer="sgd", lr=0.05), 1e-5, steps=2
    )
    assert ns["scaler"].get_scale() == package.scaler.get_scale()


def test_notebook_04_checkpoint_cell_is_train_step_with_checkpointing():
    ns = _notebook_04_cells("nb04-47")
    config = TrainConfig(precision="fp32", optimizer="sgd", lr=0.05, checkpointing=True)
    mine, package = _same_step(ns["checkpointed_train_step"], config, 1e-6)
    assert package.checkpointed == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    # and the same as the plain loop: checkpointing changes memory, not the result
    plain, _ = _same_step(
        _notebook_04_cells("nb04-41")["train_step"], TrainConfig(precision="fp32", lr=0.05), 1e-6
    )
    for a, b in zip(mine.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_notebook_04_channels_last_cell_is_train_step_with_channels_last():
    ns = _notebook_04_cells("nb04-41")
    torch.manual_seed(0)
    model = build_model("small_cnn", width=8).to(memory_format=torch.channels_last)
    inputs, targets = _batch(8)
    batch = (inputs.to(memory_format=torch.channels_last), targets)
    config = TrainConfig(precision="fp32", optimizer="sgd", lr=0.05, channels_last=True)
    mine, _ = _same_step(ns["train_step"], config, 1e-5, model=model, batch=batch)
    assert mine.blocks[0][0].weight.is_contiguous(memory_format=torch.channels_last)
