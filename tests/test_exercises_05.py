"""Exercise (a) of notebook 05: its check passes right answers written several ways and
fails the usual mistakes with feedback that names them.

The check cell runs as the grader runs it: after the notebook's imports and knobs, with the
learner's ``MyModule`` defined in the same namespace.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from notebook_cells import grade_cell, run_cells
from torch import nn

from course_utils.classroom import CheckFailed

NB05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_lightning.ipynb"


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB05, grade_id)


@pytest.fixture(scope="module")
def nb05() -> dict:
    return run_cells(NB05, ("nb05-04", "nb05-04b", "nb05-05", "nb05-05b"))


def _check(nb05: dict, module_class: type) -> None:
    namespace = dict(nb05, MyModule=module_class)
    exec(_grade_cell("05-training-step-check"), namespace)


class _Base(pl.LightningModule):
    def __init__(self, model, lr):
        super().__init__()
        self.model, self.lr = model, lr

    def loss(self, batch):
        inputs, targets = batch
        return nn.functional.cross_entropy(self.model(inputs), targets)


class Right(_Base):
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class RightDictWithScheduler(Right):
    def training_step(self, batch, batch_idx):
        loss = nn.CrossEntropyLoss()(self.model(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True, prog_bar=True)
        return {"loss": loss}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class RightLists(Right):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.0)], []


class StepAndEpoch(Right):  # 05-N1: Lightning's documented idiom
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss


class WeightDecay(Right):  # 05-N2
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=1e-4)


class IgnoresLr(Right):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Momentum(Right):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Adam(Right):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class ReturnsNothing(Right):
    def training_step(self, batch, batch_idx):
        self.log("train_loss", self.loss(batch))


class ReturnsItem(Right):
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss.item()


class ReturnsDetached(Right):
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss.detach()


class NoLog(Right):
    def training_step(self, batch, batch_idx):
        return self.loss(batch)


class WrongLoss(Right):
    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.nll_loss(self.model(inputs), targets)  # no log_softmax
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize("answer", [Right, RightDictWithScheduler, RightLists, StepAndEpoch])
def test_right_answers_pass(nb05, answer, capsys):
    _check(nb05, answer)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (IgnoresLr, "self.lr"),
        (Momentum, "momentum"),
        (Adam, "torch.optim.SGD, not Adam"),
        (ReturnsNothing, "returns nothing"),
        (ReturnsItem, "loss tensor itself"),
        (ReturnsDetached, "loss tensor itself"),
        (NoLog, 'self.log("train_loss"'),
        (WrongLoss, "train_loss"),
        (WeightDecay, "leave out weight_decay (yours is 0.0001"),
    ],
)
def test_wrong_answers_are_told_their_mistake(nb05, answer, feedback):
    with pytest.raises(CheckFailed, match=None) as failure:
        _check(nb05, answer)
    assert feedback in str(failure.value), str(failure.value)


# ----------------------------------------------------------------------- (c), issue 35


def _resume(every, lost_at):
    return (lost_at // every) * every if lost_at % every else lost_at - every


def _check_c(nb05, wasted) -> None:
    namespace = dict(nb05, resume_step=_resume, wasted=wasted, saved_at=_resume(5, 7),
                     steps_per_epoch=5)
    exec(_grade_cell("05-resume-step-check"), namespace)


def test_wasted_steps_written_another_way_pass(nb05, capsys):
    _check_c(nb05, lambda every, lost_at: lost_at - _resume(every, lost_at))
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wasted", "feedback"),
    [
        (lambda every, lost_at: lost_at % every, "lost at 20, just before the checkpoint"),
        (lambda every, lost_at: every - lost_at % every, "lost at 23: 3 steps are trained again"),
    ],
    ids=["remainder", "every-minus-remainder"],
)
def test_wasted_steps_are_checked_at_and_between_checkpoints(nb05, wasted, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_c(nb05, wasted)
