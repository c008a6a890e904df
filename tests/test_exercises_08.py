"""The exercises of notebook 08 (capstone): their checks pass right answers written in
different ways and fail the usual mistakes, with feedback that names the mistake.

Each check cell runs as the grader runs it: after the notebook's imports and knobs, with
the learner's answer defined in the same namespace (at the ``small`` workload, on the CPU).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
from notebook_cells import grade_apart, grade_cell, messages_matching

from course_utils.checks.nb08 import MESSAGES_08
from course_utils.feedback import CheckFailed
from course_utils.profiling import LoopProfile

NB08 = Path(__file__).resolve().parent.parent / "notebooks" / "08_capstone.ipynb"


def _cells() -> dict[str, nbformat.NotebookNode]:
    notebook = nbformat.read(NB08, as_version=4)
    return {cell.get("id"): cell for cell in notebook.cells if cell.cell_type == "code"}


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB08, grade_id)


def _namespace(cell_ids: list[str], monkeypatch) -> dict:
    monkeypatch.setenv("COURSE_WORKLOAD", "small")
    cells = _cells()
    namespace: dict = {}
    for cell_id in cell_ids:
        exec(cells[cell_id].source, namespace)
    return namespace


# ----------------------------------------------------------------------------- (a)

DATA_BOUND = LoopProfile(
    num_steps=10, samples=80, data_s=0.7, copy_s=0.01, compute_s=0.29, wall_s=1.0
)
COMPUTE_BOUND = LoopProfile(
    num_steps=10, samples=80, data_s=0.2, copy_s=0.05, compute_s=0.75, wall_s=1.0
)


def _check_a(namespace, profile, read_profile):
    namespace.update(
        baseline=SimpleNamespace(profile=profile), profile=profile, read_profile=read_profile
    )
    exec(_grade_cell("08-bottleneck-check"), namespace)


@pytest.fixture
def nb08_imports(monkeypatch):
    return _namespace(["nb08-03"], monkeypatch)


def _from_times(p):
    times = {"data": p.data_s, "copy": p.copy_s, "compute": p.compute_s}
    name = max(times, key=times.get)
    return name, p.wall_s / (p.wall_s - times[name])


def _from_shares(p):  # the shares printed by the notebook, rounded as printed; a tensor
    shares = {
        "data": round(p.data_wait_fraction, 3),
        "copy": round(p.copy_fraction, 3),
        "compute": round(p.compute_fraction, 3),
    }
    name = max(shares, key=shares.get)
    return name, torch.tensor(1 / (1 - shares[name]))


def _from_phase_sum(p):  # the sum of the three phases as the step time
    total = p.data_s + p.copy_s + p.compute_s
    name, _ = _from_times(p)
    return name, total / (
        total - getattr(p, {"data": "data_s", "copy": "copy_s", "compute": "compute_s"}[name])
    )


def _from_solution(p):  # the notebook's own solution cell
    namespace = {"profile": p}
    exec(_cells()["nb08-10"].source, namespace)
    return namespace["read_profile"](p)


@pytest.mark.parametrize("profile", [DATA_BOUND, COMPUTE_BOUND])
@pytest.mark.parametrize("answer", [_from_times, _from_shares, _from_phase_sum, _from_solution])
def test_bottleneck_check_passes_right_answers(nb08_imports, profile, answer, capsys):
    _check_a(nb08_imports, profile, answer)
    assert "all checks passed" in capsys.readouterr().out


def _phase(p, name):
    return {"data": p.data_s, "copy": p.copy_s, "compute": p.compute_s}[name]


def _speedup(formula):
    """A right bottleneck with the speed-up ``formula(total, phase_s)``."""

    def read_profile(p):
        name, _ = _from_times(p)
        return name, formula(p.wall_s, _phase(p, name))

    return read_profile


def _smallest(p):
    times = {"data": p.data_s, "copy": p.copy_s, "compute": p.compute_s}
    name = min(times, key=times.get)
    return name, p.wall_s / (p.wall_s - times[name])


#: One wrong read_profile per usual mistake of 08 (a), and the message that must name it.
READ_PROFILE_MISTAKES = {
    # the blind spot: what this run's profile said, written down (the grader's run agrees)
    "bottleneck constant": lambda p: ("data", 1 / 0.3),
    "bottleneck smallest": _smallest,
    "bottleneck wrong": lambda p: ("compute" if p.data_s > 0.5 else "data", 2.0),
    "bottleneck not a phase": lambda p: ("Data", 1 / 0.3),
    "speedup constant": lambda p: (_from_times(p)[0], 1 / 0.3),
    "speedup share": _speedup(lambda total, phase: phase / total),
    "speedup rest share": _speedup(lambda total, phase: (total - phase) / total),
    "speedup total over phase": _speedup(lambda total, phase: total / phase),
    "speedup minus one": _speedup(lambda total, phase: phase / (total - phase)),
    "speedup of the data phase": lambda p: (_from_times(p)[0], p.wall_s / (p.wall_s - p.data_s)),
    "speedup wrong": _speedup(lambda total, phase: total / (total - phase) + 0.5),
    "read_profile not a pair": lambda p: _from_times(p)[0],
}


@pytest.mark.parametrize("name", list(READ_PROFILE_MISTAKES))
def test_bottleneck_feedback_names_each_mistake_and_no_other(nb08_imports, name):
    with pytest.raises(CheckFailed) as failed:
        _check_a(nb08_imports, DATA_BOUND, READ_PROFILE_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_08) == [name], str(failed.value)


def test_an_answer_written_down_from_this_run_fails(nb08_imports):
    """The blind spot: the run's own profile alone cannot tell reading it from a constant."""
    written_down = _from_times(DATA_BOUND)
    with pytest.raises(CheckFailed, match="compute the answer from the profile argument"):
        _check_a(nb08_imports, DATA_BOUND, lambda p: written_down)


def test_bottleneck_feedback_never_gives_the_failed_profiles_speedup(nb08_imports):
    with pytest.raises(CheckFailed) as failed:
        _check_a(nb08_imports, DATA_BOUND, READ_PROFILE_MISTAKES["speedup wrong"])
    assert "3.33" not in str(failed.value)  # DATA_BOUND's right answer


# ----------------------------------------------------------------------------- (b)


@pytest.fixture(scope="module")
def nb08():
    patch = pytest.MonkeyPatch()
    try:
        namespace = _namespace(["nb08-03", "nb08-04m", "nb08-04", "nb08-05a", "nb08-06"], patch)
    finally:
        patch.undo()
    return namespace


def _fast_loop(
    nb,
    *,
    read=None,
    empty_cache=False,
    decode_once=True,
    lr=0.05,
    move_labels=True,
    move_inputs=True,
    move_together=False,
    pin="device",
    non_blocking=True,
    autocast="device",
    scaler=True,
):
    """A fixed loop with one habit put back (or none): how learners write it. ``pin``:
    pin_memory decided by "device" (right), "available" (torch.cuda.is_available()) or
    None (never); ``autocast``: for "device" (right), another device type, or None."""
    PreDecodedImages, DataLoader = nb["PreDecodedImages"], nb["DataLoader"]
    augment, batch = nb["augment_on_device"], nb["BIG_BATCH"]

    def fast_loop(data, model, device, timed):
        on_gpu = device.type == "cuda"
        pinned = on_gpu if pin == "device" else pin == "available" and torch.cuda.is_available()
        dataset = PreDecodedImages.from_encoded(data) if decode_once else data
        loader = DataLoader(
            dataset, batch_size=batch, shuffle=True, drop_last=True, pin_memory=pinned
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        grad_scaler = torch.amp.GradScaler(enabled=on_gpu and scaler)
        where = device.type if autocast == "device" else (autocast or device.type)
        losses = []
        for step, pair in enumerate(timed(loader)):
            if move_together:  # right: one comprehension moves both
                inputs, targets = (t.to(device, non_blocking=non_blocking) for t in pair)
            else:
                inputs, targets = pair
                inputs = inputs.to(device, non_blocking=non_blocking) if move_inputs else inputs
                targets = (
                    targets.to(device)
                    if move_labels and not non_blocking
                    else (targets.to(device, non_blocking=True) if move_labels else targets)
                )
            if decode_once:
                inputs = augment(inputs, data.image_size)
            with torch.autocast(where, dtype=torch.float16, enabled=on_gpu and bool(autocast)):
                loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            grad_scaler.scale(loss).backward()
            grad_scaler.step(optimizer)
            grad_scaler.update()
            losses.append(read(step, loss) if read else loss.detach())
            if empty_cache:
                torch.cuda.empty_cache()
        return losses

    return fast_loop


def _check_b(nb, loop):
    namespace = dict(nb, fast_loop=loop)
    exec(_grade_cell("08-fast-loop-check"), namespace)


@pytest.mark.slow
def test_fast_loop_check_passes_the_solution(nb08, capsys):
    namespace = dict(nb08)
    exec(_cells()["nb08-17"].source, namespace)
    _check_b(nb08, namespace["fast_loop"])
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.slow
def test_fast_loop_check_passes_a_batch_moved_in_one_line(nb08, capsys):
    _check_b(nb08, _fast_loop(nb08, move_together=True))
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.slow
def test_fast_loop_check_passes_logging_every_ten_steps(nb08, capsys):
    def every_tenth(step, loss):
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")
        return loss.detach()

    _check_b(nb08, _fast_loop(nb08, read=every_tenth))
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.slow
def test_fast_loop_check_passes_losses_stacked_into_one_tensor(nb08, capsys):
    """Blind test: `return torch.stack(losses)` crashed run_loop (`losses or []` on a
    tensor); the prompt says tensors are fine, so one tensor of losses is too."""
    loop = _fast_loop(nb08)

    def stacked_loop(data, model, device, timed):
        return torch.stack(loop(data, model, device, timed))

    _check_b(nb08, stacked_loop)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("habits", "feedback"),
    [
        (dict(read=lambda step, loss: loss.item()), "read the loss on the CPU"),
        (dict(read=lambda step, loss: float(loss)), "read the loss on the CPU"),
        (dict(read=lambda step, loss: loss.detach().item()), "read the loss on the CPU"),
        (dict(empty_cache=True), "empty_cache"),
        (dict(decode_once=False), "decodes images while it trains|aim for 1.2x"),
        (dict(lr=0.0), "does not train the model"),
        (dict(move_labels=False), "left the labels on the CPU"),  # issue 35: trains on a CPU
        (dict(move_inputs=False), "moved the labels to the device but not the images"),
    ],
)
def test_fast_loop_check_names_the_mistake(nb08, habits, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_b(nb08, _fast_loop(nb08, **habits))


#: One fixed loop per GPU habit left out (08 (b), seen by spies on any grader), and the
#: message that must name it.
GPU_HABITS = {
    "fast_loop not pinned": dict(pin=None),
    "fast_loop pinned by CUDA": dict(pin="available"),
    "fast_loop blocking copy": dict(non_blocking=False),
    "fast_loop no autocast": dict(autocast=None),
    "fast_loop autocast elsewhere": dict(autocast="cpu"),
    "fast_loop no scaler": dict(scaler=False),
}


@pytest.mark.parametrize("name", list(GPU_HABITS))
def test_fast_loop_feedback_names_each_gpu_habit_left_out_and_no_other(nb08, name):
    """A CPU grader used to see none of these (they cost nothing on a CPU)."""
    with pytest.raises(CheckFailed) as failed:
        _check_b(nb08, _fast_loop(nb08, **GPU_HABITS[name]))
    assert messages_matching(str(failed.value), MESSAGES_08) == [name], str(failed.value)


# ----------------------------------------------------- (b) across the grader's boundary
# The loops run and are timed in a process forked from the learner's runtime (the evidence:
# what the spies saw, the runs' figures); the habits and thresholds decide in the checker.


def _apart(nb, loop) -> dict:
    return grade_apart(NB08, "08-fast-loop-check", dict(nb, fast_loop=loop))


class Yes(int):
    """A 0 that says it is true and equal to anything."""

    __bool__ = lambda self: True  # noqa: E731
    __eq__ = lambda self, other: True  # noqa: E731
    __hash__ = int.__hash__


@pytest.mark.slow
def test_fast_loop_apart_passes_the_solution(nb08):
    namespace = dict(nb08)
    exec(_cells()["nb08-17"].source, namespace)
    verdict = _apart(nb08, namespace["fast_loop"])
    assert verdict["status"] == "completed", verdict


@pytest.mark.slow
@pytest.mark.parametrize(
    ("habits", "name"),
    [
        (dict(empty_cache=True), "loop empties the cache"),
        (dict(move_labels=False), "loop labels left"),
        (dict(pin=None), "fast_loop not pinned"),
    ],
)
def test_fast_loop_apart_names_the_mistake(nb08, habits, name):
    verdict = _apart(nb08, _fast_loop(nb08, **habits))
    assert verdict["status"] == "failed", verdict
    assert messages_matching(verdict["evalue"], MESSAGES_08) == [name], verdict


def test_fast_loop_apart_cannot_be_forged_by_a_value_that_says_it_is_true(nb08):
    """non_blocking=Yes(0): a copy that blocks, with a flag that says it does not."""
    verdict = _apart(nb08, _fast_loop(nb08, non_blocking=Yes(0)))
    assert verdict["status"] == "failed", verdict
    with pytest.raises(CheckFailed, match="of type Yes"):  # the notebook names it
        _check_b(nb08, _fast_loop(nb08, non_blocking=Yes(0)))


def test_fast_loop_apart_quotes_no_words_of_the_learners_code(nb08):
    def secret_loop(data, model, device, timed):
        raise ValueError("the learner's own words")

    verdict = _apart(nb08, secret_loop)
    assert verdict["status"] == "failed", verdict
    assert messages_matching(verdict["evalue"], MESSAGES_08) == ["fast_loop raised"], verdict
    assert "ValueError: (your code's message)" in verdict["evalue"], verdict
    with pytest.raises(CheckFailed, match="own words"):
        _check_b(nb08, secret_loop)
