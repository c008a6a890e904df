"""Notebook 05's observing halves: exercise (a) (the learner's ``MyModule``: one
``training_step`` called by hand, then a ``Trainer(fast_dev_run=3)`` fitting it) and
exercise (b) (``precision_flag`` with the course's precision helpers refused while it
runs). Each returns plain data; what it means is decided in :mod:`course_utils.checks.nb05`
(the plain loop's reference training included). Lightning is imported when a half runs,
not with this module (the grader's runtime imports every observing module)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from course_utils.checks.boundary import observed
from course_utils.checks.evidence.nb04 import answer_refusing
from course_utils.checks.evidence.values import exception_seen, impostor, value_of
from course_utils.models import build_model

# ------------------------------------------------------- exercise (a): a LightningModule


def tiny_model(image_size: int) -> nn.Module:
    """Exercise (a)'s model, the same weights on every call (seeded): the learner's module
    gets one copy, the plain loop's reference another.

    >>> bool(torch.equal(tiny_model(4).head.weight, tiny_model(4).head.weight))
    True
    """
    torch.manual_seed(0)
    return build_model("mlp", hidden=16, depth=1, in_features=3 * image_size**2)


def _called_from(error: BaseException) -> list[str]:
    """The names of the functions ``error``'s traceback passed through."""
    names, frame = [], error.__traceback__
    while frame is not None:
        names.append(frame.tb_frame.f_code.co_name)
        frame = frame.tb_next
    return names


def _logits(module: nn.Module, inputs: Any) -> torch.Tensor | None:
    """The logits of ``module``'s network (its ``model``, else itself) on ``inputs``, or
    None when they cannot be computed (not a classifier's batch)."""
    network = getattr(module, "model", module)
    try:
        with torch.no_grad():
            logits = network(inputs)
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None
    return logits.detach() if type(logits) is torch.Tensor else None


def training_step_seen(module: Any, batch: Sequence[Any]) -> dict[str, Any]:
    """What ``module.training_step(batch, 0)`` does, called by hand: whether it asked for
    the Trainer's optimizers (an error outside a Trainer), how many times backward ran
    during it, what it returned (``nothing``; the returned loss, alone or as ``{"loss":
    ...}``: its type's name, and for a tensor whether it is of a subclass (``impostor``:
    :func:`~course_utils.checks.evidence.values.impostor`), requires grad and how many
    numbers it holds), and, for a one-number loss that requires grad, its value with the
    network's logits on the batch, twice, and the targets: the deciding half tells a loss
    that is not the batch's cross-entropy. What else the step raised: ``{"raised": ...}``
    (:func:`~course_utils.checks.evidence.values.exception_seen`)."""
    seen: dict[str, Any] = {"asked optimizers": False, "backwards": 0, "nothing": False}
    seen.update(kind="", tensor=False, impostor=None, requires_grad=False, numel=0, loss=None)
    seen.update(logits=None, again=None, targets=None)
    backwards: list[int] = []
    original = torch.autograd.backward

    def watched(*args: Any, **kwargs: Any) -> Any:
        backwards.append(1)
        return original(*args, **kwargs)

    with warnings.catch_warnings():  # self.log outside a Trainer only warns
        warnings.simplefilter("ignore")
        torch.autograd.backward = watched  # Tensor.backward's too
        try:
            out = module.training_step(batch, 0)
        except NotImplementedError:  # not answered: the grader says so
            raise
        except Exception as error:
            asked = "not attached to a `Trainer`" in str(error)
            if isinstance(error, RuntimeError) and asked and "optimizers" in _called_from(error):
                return {**seen, "asked optimizers": True}
            return {"raised": exception_seen(error)}
        finally:
            torch.autograd.backward = original
    seen["backwards"], seen["nothing"] = len(backwards), out is None
    loss = out.get("loss") if isinstance(out, dict) else out
    seen["kind"], seen["tensor"] = type(loss).__name__, isinstance(loss, torch.Tensor)
    if out is None or not isinstance(loss, torch.Tensor):
        return seen
    seen["impostor"] = impostor(loss, "training_step(batch, 0)")  # its float() is compared
    if seen["impostor"] is not None:
        return seen
    seen["requires_grad"], seen["numel"] = bool(loss.requires_grad), int(loss.numel())
    if seen["requires_grad"] and seen["numel"] == 1:
        seen["loss"] = float(loss.detach())
        seen["logits"] = _logits(module, batch[0])
        seen["again"] = _logits(module, batch[0])  # a model that is not deterministic cannot tell
        seen["targets"] = batch[1] if type(batch[1]) is torch.Tensor else None
    return seen


@observed
def my_module_step(my_module: type, loader: Iterable[Any], image_size: int, lr: float) -> dict:
    """:func:`training_step_seen` of ``my_module(copy of tiny_model(image_size), lr=lr)``
    on ``loader``'s first batch (``{"raised": ...}`` when the class cannot be built)."""
    try:
        yours = my_module(copy.deepcopy(tiny_model(image_size)), lr=lr)
    except NotImplementedError:  # not answered: the grader says so
        raise
    except Exception as error:
        return {"raised": exception_seen(error)}
    return training_step_seen(yours, next(iter(loader)))


#: The settings of the optimizer's first parameter group the deciding half reads.
OPTIMIZER_SETTINGS = ("lr", "initial_lr", "momentum", "nesterov", "weight_decay")


def optimizers_seen(optimizers: Sequence[torch.optim.Optimizer]) -> list[dict[str, Any]]:
    """Each optimizer's class (its name, and whether it is ``torch.optim.SGD`` itself) and
    the :data:`OPTIMIZER_SETTINGS` of its first parameter group
    (:func:`~course_utils.checks.evidence.values.value_of`).

    >>> optimizers_seen([torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.5)])[0]["group"]
    {'value': {'lr': 0.5, 'momentum': 0, 'nesterov': False, 'weight_decay': 0}}
    """
    seen = []
    for optimizer in optimizers:
        group = dict(optimizer.param_groups[0])
        settings = {key: group[key] for key in OPTIMIZER_SETTINGS if key in group}
        seen.append({
            "class": type(optimizer).__name__,
            "sgd": type(optimizer) is torch.optim.SGD,
            "group": value_of(settings, "optimizer.param_groups[0]"),
        })  # fmt: skip
    return seen


@observed
def my_module_fit(my_module: type, loader: Iterable[Any], image_size: int, lr: float) -> dict:
    """Fit ``my_module(copy of tiny_model(image_size), lr=lr)`` with
    ``Trainer(fast_dev_run=3)`` (three batches, nothing written to disk) on ``loader``. The
    evidence: the Trainer's optimizers (:func:`optimizers_seen`), its ``callback_metrics``
    (:func:`~course_utils.checks.evidence.values.value_of`), the trained network's
    parameters by name, and the three batches it trained on (read again from ``loader``),
    for the plain loop's reference; or what the fit raised (``{"raised": ...}``)."""
    import lightning.pytorch as pl  # lazy: see the module's text

    try:
        yours = my_module(copy.deepcopy(tiny_model(image_size)), lr=lr)
        trainer = pl.Trainer(fast_dev_run=3, accelerator="cpu", devices=1,
                             enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(yours, loader)
        named = [(name, p.detach().clone()) for name, p in yours.model.named_parameters()]
    except NotImplementedError:  # not answered: the grader says so
        raise
    except Exception as error:
        return {"raised": exception_seen(error)}
    return {
        "optimizers": optimizers_seen(trainer.optimizers),
        "metrics": value_of(dict(trainer.callback_metrics), "trainer.callback_metrics"),
        "parameters": named,
        "batches": [(batch[0], batch[1]) for _, batch in zip(range(3), loader, strict=False)],
    }


# ----------------------------------------------------- exercise (b): the precision string


@observed
def precision_flag_answers(
    precision_flag: Any, capabilities: list[tuple[int, int]]
) -> list[dict[str, Any]]:
    """What ``precision_flag(capability)`` gives for each of ``capabilities``, with the
    course's precision helpers refused (``lightning_precision``, ``pick_precision``,
    ``precision_support``): :func:`~course_utils.checks.evidence.nb04.answer_refusing`'s
    evidence, in order."""
    from course_utils.device import pick_precision, precision_support  # lazy: as above
    from course_utils.lightning import lightning_precision

    helpers: list[Callable[..., Any]] = [lightning_precision, pick_precision, precision_support]
    return [
        answer_refusing(precision_flag, helpers, f"precision_flag({capability})", capability)
        for capability in capabilities
    ]
