"""Notebook 04's observing halves: exercise (a) (``adam_state_bytes`` with the course's
optimizer-state counters refused while it runs) and exercise (c) (``amp_step`` watched by
a forward hook, a gradient hook and its own ``GradScaler``). Each returns plain data; what
it means is decided in :mod:`course_utils.checks.nb04`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn

from course_utils.checks.boundary import observed
from course_utils.checks.core import without_course_helpers
from course_utils.checks.evidence.values import exception_seen, value_of
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed
from course_utils.footprint import expected_optimizer_state_bytes, optimizer_state_bytes
from course_utils.models import build_model

# ------------------------------------------------------------ shared by the notebooks' halves


def answer_refusing(
    function: Callable[..., Any], helpers: Sequence[Callable[..., Any]], what: str, *args: Any
) -> dict[str, Any]:
    """What ``function(*args)`` gave with the course's ``helpers`` refused while it runs
    (:func:`~course_utils.checks.core.without_course_helpers`): its value
    (:func:`~course_utils.checks.evidence.values.value_of`, ``what`` naming it), what it
    raised (``{"raised": ...}``: :func:`~course_utils.checks.evidence.values.exception_seen`), or
    ``{"refused": name}``: the helper it called. An unanswered exercise's
    ``NotImplementedError`` goes through.

    >>> from course_utils.footprint import optimizer_state_bytes
    >>> answer_refusing(len, [optimizer_state_bytes], "len(s)", "abc")
    {'value': 3}
    >>> answer_refusing(optimizer_state_bytes, [optimizer_state_bytes], "f(x)", None)
    {'refused': 'optimizer_state_bytes'}
    >>> answer_refusing(int, [], "int(s)", "seven")["raised"]["kind"]
    'ValueError'
    """
    try:
        out = without_course_helpers(function, *helpers)(*args)
    except NotImplementedError:  # not answered: the grader says so
        raise
    except Exception as error:  # the learner's code failed: the check says how
        for helper in helpers:
            refusal = MESSAGES_CHECKS["refused"].format(name=helper.__name__)
            if type(error) is CheckFailed and str(error) == refusal:
                return {"refused": helper.__name__}
        return {"raised": exception_seen(error)}
    return value_of(out, what)


# ------------------------------------------------------------------ exercise (a): Adam's state


def _frozen() -> nn.Module:
    frozen = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    frozen[0].requires_grad_(False)
    return frozen


def _after_a_step(model: nn.Module, inputs: torch.Tensor) -> nn.Module:
    """``model`` after one backward and one step of a real Adam (its gradients kept)."""
    real = torch.optim.Adam(model.parameters())
    model(inputs).sum().backward()
    real.step()
    return model


def _small_cnn() -> nn.Module:
    return _after_a_step(build_model("small_cnn", width=4), torch.randn(2, 3, 32, 32))


def _stepped_linear(dtype: torch.dtype) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return _after_a_step(nn.Linear(10, 5).to(dtype), torch.randn(2, 10, dtype=dtype))

    return build


#: The models exercise (a)'s check gives ``adam_state_bytes``, by the name its feedback uses.
ADAM_MODELS: dict[str, Callable[[], nn.Module]] = {
    "a float32 nn.Linear(10, 5)": lambda: nn.Linear(10, 5),
    "a bfloat16 nn.Linear(10, 5)": lambda: nn.Linear(10, 5).to(torch.bfloat16),
    "a float64 nn.Linear(6, 3)": lambda: nn.Linear(6, 3).to(torch.float64),
    "two Linear layers, the first frozen": _frozen,
    "a small CNN after a step": _small_cnn,
    "a bfloat16 nn.Linear(10, 5) after a step": _stepped_linear(torch.bfloat16),
    "a float64 nn.Linear(10, 5) after a step": _stepped_linear(torch.float64),
}


@observed
def adam_state_answers(
    adam_state_bytes: Callable[[nn.Module], Any], models: list[str]
) -> list[dict[str, Any]]:
    """What ``adam_state_bytes`` gives for each model of ``models`` (names of
    :data:`ADAM_MODELS`, each built here), with the course's optimizer-state counters
    refused: :func:`answer_refusing`'s evidence, in order."""
    helpers: list[Callable[..., Any]] = [optimizer_state_bytes, expected_optimizer_state_bytes]
    return [
        answer_refusing(
            adam_state_bytes, helpers, f"adam_state_bytes({model})", ADAM_MODELS[model]()
        )
        for model in models
    ]


# ------------------------------------------------------ exercise (c): a mixed-precision step


def amp_case(
    device: torch.device | str,
) -> tuple[nn.Sequential, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Exercise (c)'s small MLP and its two batches, the same on every call (seeded): the
    observing half steps one copy with the answer, the deciding half another in float32."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    batches = [
        (torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device))
        for _ in range(2)
    ]
    return net, batches


def moved(model: nn.Module, start: nn.Module) -> torch.Tensor:
    """How far each weight of ``model`` moved from ``start``'s, flattened (float32, CPU)."""
    pairs = zip(model.parameters(), start.parameters(), strict=True)
    return torch.cat([(p - s).detach().flatten().float().cpu() for p, s in pairs])


@observed
def amp_step_run(
    amp_step: Callable[..., Any],
    device: str,
    init_scale: float,
    max_norm: float,
    lr: float,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """Call ``amp_step(model, optimizer, scaler, inputs, targets, dtype, max_norm)`` twice on
    :func:`amp_case`'s model and batches, with SGD at ``lr`` and a fresh
    ``GradScaler(init_scale=...)``. Hooks watch the second backward: gradients left from the
    first call (never cleared, wherever a step clears them) and autocast still on. The
    evidence: the first call's loss and update (flattened), the first layer's output dtype,
    the scale after the first call, and what the hooks saw; or what a call raised
    (``{"raised": ...}``: :func:`~course_utils.checks.evidence.values.exception_seen`)."""
    where = torch.device(device)
    net, batches = amp_case(where)
    start, first = copy.deepcopy(net), cast(nn.Linear, net[0])
    dtypes: list[torch.dtype] = []
    first.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    leftover: list[bool] = []
    in_autocast: list[bool] = []
    weight = first.weight

    def watch_backward(gradient: torch.Tensor) -> None:  # runs before .grad accumulates
        leftover.append(weight.grad is not None and bool(weight.grad.abs().sum() > 0))
        in_autocast.append(torch.is_autocast_enabled(where.type))

    weight.register_hook(watch_backward)
    scaler = torch.amp.GradScaler(where.type, init_scale=init_scale)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    try:
        loss = amp_step(net, optimizer, scaler, *batches[0], dtype, max_norm)
        update, scale_after = moved(net, start), float(scaler.get_scale())
        amp_step(net, optimizer, scaler, *batches[1], dtype, max_norm)
        value = float(torch.as_tensor(loss).float().item())
    except NotImplementedError:  # not answered: the grader says so
        raise
    except Exception as error:  # PyTorch's error for a wrongly ordered step, or another
        return {"raised": exception_seen(error)}
    return {
        "loss": value,
        "loss_detached": not (isinstance(loss, torch.Tensor) and loss.requires_grad),
        "update": update,
        "forward_dtypes": dtypes[:1],
        "scale_after": scale_after,
        "leftover_gradients": any(leftover[1:]),
        "autocast_in_backward": any(in_autocast),
    }
