"""The course's training in PyTorch Lightning, comparable step for step with the plain loop
(notebook 05): the module, the Trainer, a utilization logger, the timed comparison,
Lightning's batch-size finder, and checkpoints that survive a Colab disconnect.
"""

from __future__ import annotations

import copy
import csv
import functools
import importlib.util
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import matplotlib.pyplot as plt
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.tuner import Tuner
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_utils import monitor, progress
from course_utils.batch import MaxBatchSize, Trial
from course_utils.device import AUTO, Precision, pick_device, pick_precision
from course_utils.env import where_am_i
from course_utils.footprint import PeakMemory, peak_memory
from course_utils.oom import disguised_out_of_memory_as_cuda
from course_utils.timing import synchronizer
from course_utils.training import TrainConfig, TrainStep, make_optimizer, train

# Lightning's own loggers: "GPU available: ...", tips, the model summary.
LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning")
# Warnings that only matter for real runs (tiny test runs trigger them on purpose).
NOISY_WARNINGS = (
    r".*does not have many workers.*",
    r".*number of training batches .* is smaller than the logging interval.*",
    r".*You're resuming from a checkpoint that ended before the epoch ended.*",
    r".*Checkpoint directory .* exists and is not empty.*",
    r".*is not picklable.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
)


class CourseModule(pl.LightningModule):
    """A course model trained with :class:`~course_utils.training.TrainStep`'s loss and
    optimizer (precision is the Trainer's job); ``lr`` and ``batch_size`` are for
    Lightning's tuners, ``dataset`` for its own ``train_dataloader``."""

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig | None = None,
        dataset: Dataset[Any] | None = None,
        batch_size: int = 32,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.config = config or TrainConfig()
        self.lr = self.config.lr
        self.batch_size = batch_size
        self.dataset = dataset
        self.loss_fn = loss_fn or nn.CrossEntropyLoss()  # TrainStep's default loss

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs)

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch[0], batch[1]
        with disguised_out_of_memory_as_cuda():  # so that Lightning's tuner sees an OOM
            loss = self.loss_fn(self(inputs), targets)
        self.log("train_loss", loss, on_step=True, prog_bar=True, batch_size=len(targets))
        return loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with disguised_out_of_memory_as_cuda():  # cuDNN's backward can disguise one too
            super().backward(loss, *args, **kwargs)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.config.optimizer, self.parameters(), self.lr)

    def train_dataloader(self) -> DataLoader[Any]:
        if self.dataset is None:
            raise ValueError("CourseModule(dataset=None): pass a DataLoader to fit() instead")
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False)


def quiet_by_default() -> bool:
    """Quiet under the tests (``COURSE_WORKLOAD=small``, pytest) and in scripts whose
    output is not a terminal; a learner in Jupyter or at a terminal sees progress bars."""
    small = os.environ.get("COURSE_WORKLOAD", "").strip().lower() == "small"
    if small or "PYTEST_CURRENT_TEST" in os.environ or "pytest" in sys.modules:
        return True
    in_ipython = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)() is not None
    return not in_ipython and not sys.stdout.isatty()


LIGHTNING_PRECISION = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def lightning_precision(
    precision: str | Precision = AUTO, device: torch.device | str | None = None
) -> str:
    """The ``Trainer(precision=...)`` string for a :class:`~course_utils.device.Precision`,
    a course name, or ``"auto"`` (:func:`~course_utils.device.pick_precision` for
    ``device``, default the one ``accelerator="auto"`` uses); Lightning strings pass."""
    if isinstance(precision, Precision):
        return LIGHTNING_PRECISION[precision.name]
    if "-" in precision:  # already a Lightning string such as "16-mixed"
        return precision
    target = torch.device(device) if device is not None else pick_device()
    return LIGHTNING_PRECISION[pick_precision(target, precision).name]


class ForkSafeThreads(Callback):
    """One PyTorch CPU thread in each process that ``ddp_notebook`` (or ``ddp_fork``) forks.

    A forked child inherits the parent's OpenMP thread pool but not its threads: on a
    16-core machine DDP's first broadcast segfaulted in every child (``torch.cat`` in
    ``flatten_dense_tensors``). It acts in the children only, in ``setup``, before DDP.
    """

    def __init__(self) -> None:
        self.parent_pid = os.getpid()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.world_size > 1 and os.getpid() != self.parent_pid:
            torch.set_num_threads(1)


def make_trainer(
    *,
    max_steps: int = -1,
    max_epochs: int | None = None,
    precision: str = "auto",
    accelerator: str = "auto",
    devices: int | str | list[int] = "auto",
    root_dir: Path | str | None = None,
    callbacks: Iterable[Callback] = (),
    logger: bool | Any = True,
    quiet: bool | None = None,
    log_every_n_steps: int = 10,
    **overrides: Any,
) -> pl.Trainer:
    """The course's ``Trainer``. ``precision``: see :func:`lightning_precision`.
    ``root_dir`` (default: a new temporary folder, not the notebook's) gets a CSV log, and
    a TensorBoard one when installed. ``quiet`` (default :func:`quiet_by_default`): no
    progress bar, model summary, "GPU available" lines, tips, or warnings that tiny runs
    trigger on purpose. ``strategy="ddp_notebook"``/``"ddp_fork"`` adds
    :class:`ForkSafeThreads`. Other keyword arguments go to ``Trainer``.
    """
    callbacks = list(callbacks)
    if overrides.get("strategy") in ("ddp_notebook", "ddp_fork"):
        callbacks.append(ForkSafeThreads())
    quiet = quiet_by_default() if quiet is None else quiet
    if quiet:
        for name in LIGHTNING_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        for pattern in NOISY_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
    root = Path(root_dir) if root_dir is not None else Path(tempfile.mkdtemp(prefix="course-pl-"))
    if logger is True:
        logger = [CSVLogger(root, name="course")]
        if importlib.util.find_spec("tensorboard") is not None:
            logger.append(TensorBoardLogger(root, name="course", default_hp_metric=False))
    device = torch.device("cpu") if accelerator == "cpu" else None
    if devices == 1 and accelerator in ("auto", "gpu", "cuda"):
        # One device: the GPU pick_device() chose (the freest: the one memory_cap and
        # the notebook's own loops use), not Lightning's cuda:0 (review finding G11)
        picked = pick_device()
        if picked.type == "cuda":
            devices, device = [picked.index or 0], picked
    options: dict[str, Any] = {
        "accelerator": accelerator,
        "devices": devices,
        "precision": lightning_precision(precision, device),
        "max_steps": max_steps,
        "max_epochs": max_epochs if max_epochs is not None else (-1 if max_steps > 0 else 1),
        "default_root_dir": str(root),
        "callbacks": callbacks,
        "logger": logger,
        "log_every_n_steps": log_every_n_steps,
        "enable_progress_bar": not quiet,
        "enable_model_summary": not quiet,
        "enable_checkpointing": any(isinstance(c, ModelCheckpoint) for c in callbacks),
        "num_sanity_val_steps": 0,
    }
    options.update(overrides)
    return pl.Trainer(**options)


class UtilizationLogger(Callback):
    """Log what ``nvidia-smi`` shows (:func:`course_utils.monitor.sample`) every
    ``every_n_steps`` steps (without a GPU: CPU utilization and resident memory), as
    ``gpu/<field>`` or ``cpu/<field>`` metrics to the Trainer's loggers and
    :attr:`history`, readings to :attr:`readings`. ``gpu_index`` (NVML numbering)
    overrides the Trainer's GPU; NVML figures include other processes.
    """

    def __init__(self, every_n_steps: int = 10, gpu_index: int | None = None) -> None:
        if every_n_steps < 1:
            raise ValueError("every_n_steps must be at least 1")
        self.every_n_steps = every_n_steps
        self.gpu_index = gpu_index
        self.history: list[dict[str, Any]] = []
        self.readings: list[monitor.Reading] = []

    def _index(self, trainer: pl.Trainer) -> int | None:
        root = trainer.strategy.root_device
        if self.gpu_index is not None or root.type != "cuda":
            return self.gpu_index
        return monitor.nvml_index_of(root)  # NVML numbers the GPUs differently from CUDA

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        monitor.sample(None)  # psutil's CPU percent counts from the previous call: prime it

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        step = trainer.global_step
        if step % self.every_n_steps != 0:
            return
        reading = monitor.sample(self._index(trainer))
        self.readings.append(reading)
        prefix = "gpu" if reading.on_gpu else "cpu"
        metrics = {f"{prefix}/{key}": value for key, value in reading.numeric().items()}
        self.history.append({"step": step, "source": reading.source, **metrics})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


def metrics_csv(trainer: pl.Trainer) -> Path | None:
    """The ``metrics.csv`` written by the Trainer's ``CSVLogger``, if it has one."""
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            logger.save()
            return Path(logger.log_dir) / "metrics.csv"
    return None


def read_metrics(path: Path | str) -> dict[str, list[tuple[int, float]]]:
    """Read a ``CSVLogger`` ``metrics.csv`` into ``{metric: [(step, value), ...]}``."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in (None, ""):
                    series.setdefault(key, []).append((step, float(value)))
    return series


def plot_metrics(
    series: dict[str, list[tuple[int, float]]],
    names: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """One small plot per metric against the training step."""
    chosen = [name for name in (names or sorted(series)) if series.get(name)]
    if not chosen:
        raise ValueError(f"no such metrics; logged: {sorted(series)}")
    columns = min(3, len(chosen))
    rows = math.ceil(len(chosen) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    for ax, name in zip(axes.flat, chosen, strict=False):
        steps, values = zip(*series[name], strict=True)
        ax.plot(steps, values, marker=".")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(chosen) :]:
        ax.axis("off")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


# ---------------------------------------------------- plain loop vs Lightning, timed


class _EpochTimer(Callback):
    """Record the wall-clock seconds of every training epoch (device synchronized)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        synchronizer(trainer.strategy.root_device)()
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        synchronizer(trainer.strategy.root_device)()
        self.seconds.append(time.perf_counter() - self._start)
        progress.tick()


def _kept(runs: Sequence[Sequence[float]]) -> list[float]:
    """The runs' epoch times, each run without its first epoch (warm-up) when it has 3+."""
    return [s for run in runs for s in (run[1:] if len(run) >= 3 else run)]


BUSY_NOISE = 0.25
"""Epoch times whose median is this far above their fastest: the machine was busy, and a
difference of a few milliseconds per step between two ways of training is not readable."""


@dataclass
class Comparison:
    """Plain loop vs Lightning, taking turns: each run's epoch times (one run of each way
    per round, in :attr:`order`). Each way is summed up by its **fastest** epoch over all
    its runs (a run's first epoch is left out as warm-up when it has 3 or more): other
    work on the machine only ever adds time, so the fastest epoch is the least disturbed
    one, and the table, the plot and the ratio all use it. Totals are medians over the
    runs, peaks the first run's."""

    device: str
    precision: str
    epochs: int
    steps_per_epoch: int = 0
    order: list[str] = field(default_factory=list)
    plain_runs: list[list[float]] = field(default_factory=list)
    lightning_runs: list[list[float]] = field(default_factory=list)
    plain_total_s: float = 0.0  # building the step + all epochs (median over runs)
    lightning_total_s: float = 0.0  # building the Trainer + fit(), setup included
    plain_peak: PeakMemory | None = None
    lightning_peak: PeakMemory | None = None

    @property
    def plain_s_per_epoch(self) -> float:
        """The plain loop's fastest epoch (seconds)."""
        return min(_kept(self.plain_runs))

    @property
    def lightning_s_per_epoch(self) -> float:
        """Lightning's fastest epoch (seconds)."""
        return min(_kept(self.lightning_runs))

    @property
    def overhead_ratio(self) -> float:
        """Lightning's fastest epoch over the plain loop's."""
        return self.lightning_s_per_epoch / self.plain_s_per_epoch

    @property
    def overhead_s_per_epoch(self) -> float:
        return self.lightning_s_per_epoch - self.plain_s_per_epoch

    @property
    def overhead_s_per_step(self) -> float:
        return self.overhead_s_per_epoch / max(self.steps_per_epoch, 1)

    @property
    def noise(self) -> float:
        """How far the typical epoch is above the fastest, the larger over the two ways:
        0.1 means that repeating the same work took a median 10% longer than at best."""
        kept = [_kept(self.plain_runs), _kept(self.lightning_runs)]
        return max(statistics.median(k) / min(k) - 1 for k in kept)

    @property
    def busy(self) -> bool:
        """The machine was too busy for a verdict (:data:`BUSY_NOISE`): run it again."""
        return self.noise > BUSY_NOISE

    def rows(self) -> list[dict[str, Any]]:
        """The side-by-side table: one row per way of training."""
        ways = [
            ("plain loop", self.plain_s_per_epoch, self.plain_total_s, self.plain_peak),
            ("Lightning", self.lightning_s_per_epoch, self.lightning_total_s, self.lightning_peak),
        ]
        return [
            {"way": way, "s_per_epoch": s, "total_s": total, "peak_mib": peak.peak_mib}
            for way, s, total, peak in ways
            if peak is not None
        ]

    def __str__(self) -> str:
        lines = [f"{'':12}{'fastest epoch s':>16}{'total s':>10}{'peak MiB':>10}"]
        lines += [
            f"{r['way']:12}{r['s_per_epoch']:16.3f}{r['total_s']:10.2f}{r['peak_mib']:10.1f}"
            for r in self.rows()
        ]
        lines.append(
            f"Lightning / plain, fastest epochs: {self.overhead_ratio:.3f}x "
            f"({self.overhead_s_per_epoch * 1000:+.1f} ms per epoch, "
            f"{self.overhead_s_per_step * 1000:+.2f} ms per step), {self.epochs} epochs of "
            f"{self.steps_per_epoch} steps, {len(self.plain_runs)} rounds "
            f"({', '.join(self.order)}), median epoch {self.noise:.0%} above the fastest, "
            f"{self.device}, precision {self.precision}"
        )
        return "\n".join(lines)


def compare_with_plain_loop(
    build: Callable[[], nn.Module],
    loader: DataLoader[Any],
    *,
    epochs: int = 3,
    config: TrainConfig | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    rounds: int = 2,
) -> Comparison:
    """Train ``build()`` for ``epochs`` with the plain loop and with Lightning, ``rounds``
    times each, taking turns (each round starts with the way the previous one ended with,
    so a drifting machine favours neither), from the same weights (``seed``), data,
    optimizer and precision, after one untimed warm-up step. Lightning's totals include
    building the Trainer; peak memory: :func:`~course_utils.footprint.peak_memory` (on the
    CPU the process's RSS). Lightning's module logs the loss every step, as a real run would.
    """
    if rounds < 1 or epochs < 1:
        raise ValueError("rounds and epochs must be at least 1")
    config = config or TrainConfig()
    target = torch.device(device) if device is not None else pick_device()
    precision = lightning_precision(config.precision, target)
    torch.manual_seed(seed)
    initial = build()
    result = Comparison(str(target), precision, epochs, steps_per_epoch=len(loader))
    # one untimed step first, so neither measured run pays for the first use of the device,
    # its kernels and the memory allocator's growth
    TrainStep(copy.deepcopy(initial), target, config)(next(iter(loader)))

    def plain(seconds: list[float]) -> None:
        step = TrainStep(copy.deepcopy(initial), target, config)
        for _ in progress.track(range(epochs), "plain PyTorch loop", unit="epoch"):
            seconds.append(train(step, loader, epochs=1).seconds)

    def lightning(seconds: list[float]) -> None:
        timer = _EpochTimer()
        trainer = make_trainer(
            max_epochs=epochs,
            precision=precision,
            accelerator="gpu" if target.type == "cuda" else target.type,
            devices=[target.index or 0] if target.type == "cuda" else 1,
            callbacks=[timer],
            logger=False,
            quiet=True,
        )
        with progress.task("Lightning", total=epochs, unit="epoch"):
            trainer.fit(CourseModule(copy.deepcopy(initial), config), loader)
        seconds.extend(timer.seconds)

    runs = {"plain": (plain, result.plain_runs), "lightning": (lightning, result.lightning_runs)}
    totals: dict[str, list[float]] = {"plain": [], "lightning": []}
    peaks: dict[str, PeakMemory] = {}
    for index in range(rounds):
        for way in ("plain", "lightning")[:: -1 if index % 2 else 1]:
            seconds: list[float] = []
            start = time.perf_counter()
            peak = peak_memory(functools.partial(runs[way][0], seconds), target, rss=True)
            peaks.setdefault(way, peak)
            totals[way].append(time.perf_counter() - start)
            result.order.append(way)
            runs[way][1].append(seconds)
    result.plain_total_s = statistics.median(totals["plain"])
    result.lightning_total_s = statistics.median(totals["lightning"])
    result.plain_peak, result.lightning_peak = peaks["plain"], peaks["lightning"]
    return result


# ------------------------------------------- Lightning's batch-size finder, for comparison


class _TrialModule(pl.LightningModule):
    """A module whose training step is ``trial(len(batch))``, so that Lightning's ``Tuner``
    can search the batch size of a plain trial function; every call goes to ``history``."""

    def __init__(self, trial: Callable[[int], Any], history: list[Trial], batch_size: int) -> None:
        super().__init__()
        self.trial, self.history, self.batch_size = trial, history, batch_size
        self.weight = nn.Parameter(torch.zeros(()))  # an optimizer step counts a step

    def train_dataloader(self) -> DataLoader[Any]:
        # Lightning stops growing at the dataset's length: make it never the limit
        return DataLoader(range(2**31), batch_size=self.batch_size)  # type: ignore[arg-type]

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        start = time.perf_counter()
        try:
            with disguised_out_of_memory_as_cuda():  # Lightning must see it as an OOM
                self.trial(len(batch))
        except Exception as error:
            self.history.append(Trial(len(batch), False, time.perf_counter() - start, str(error)))
            raise
        self.history.append(Trial(len(batch), True, time.perf_counter() - start))
        return self.weight * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def scale_batch_size(
    trial: Callable[[int], Any],
    mode: str = "power",
    *,
    init_val: int = 2,
    max_trials: int = 25,
    max_val: int = 8192,
    margin: float = 0.05,
) -> MaxBatchSize:
    """Lightning's ``Tuner(trainer).scale_batch_size`` on a plain ``trial`` (one step per
    size), with Lightning's defaults: ``"power"`` doubles until a trial fails and returns
    half that size; ``"binsearch"`` then bisects (``margin`` applies there only). Any
    out-of-memory error of :func:`~course_utils.oom.is_out_of_memory` ends a trial, cuDNN's
    and cuBLAS's disguised ones too (:func:`~course_utils.oom.disguised_out_of_memory_as_cuda`).

    >>> from course_utils.oom import MemoryBudget
    >>> def trial(n):
    ...     MemoryBudget(100).charge(n)  # a budget of 100 bytes, one byte per sample
    >>> scale_batch_size(trial, "power").batch_size, scale_batch_size(trial, "binsearch").batch_size
    (64, 95)
    """
    history: list[Trial] = []
    module = _TrialModule(trial, history, init_val)  # the first trial runs at init_val
    trainer = make_trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, quiet=True, precision="fp32"
    )
    found = Tuner(trainer).scale_batch_size(
        module,
        mode=mode,
        steps_per_trial=1,
        init_val=init_val,
        max_trials=max_trials,
        max_val=max_val,
        margin=margin,
    )
    limit = max((t.batch_size for t in history if t.fits), default=0)
    return MaxBatchSize(batch_size=found or 0, limit=limit, trials=len(history), history=history)


# ------------------------------------------------------------ checkpoint and resume


class SimulatedDisconnect(RuntimeError):
    """Raised by :class:`DisconnectAfter` to stand in for a Colab runtime going away."""


class DisconnectAfter(Callback):
    """Raise :class:`SimulatedDisconnect` after ``steps`` steps. It runs before
    ``ModelCheckpoint`` (Lightning runs checkpoint callbacks last), so the step it stops at
    is not saved: resuming starts from the last periodic checkpoint."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.global_step >= self.steps:
            raise SimulatedDisconnect(f"runtime disconnected after step {trainer.global_step}")


DRIVE_MOUNT = Path("/content/drive")
DRIVE_FOLDER = "MyDrive/pytorch-gpu-course"
_DRIVE_REFUSED: set[str] = set()  # mount points where mounting failed: ask only once


def mount_drive(environment: str | None = None, mount_point: Path | str = DRIVE_MOUNT) -> bool:
    """Mount Google Drive on Colab (asking the learner); ``True`` when it is mounted.

    Refused, failed or timed out: one line printed, ``False``, and no second question in
    this session, so "Run all" goes on. Elsewhere: ``False``."""
    if (environment or where_am_i()) != "colab":
        return False
    mount_point = Path(mount_point)
    if (mount_point / "MyDrive").is_dir():
        return True
    if str(mount_point) in _DRIVE_REFUSED:
        return False
    try:
        from google.colab import drive  # lazy: platform-only (Colab)

        drive.mount(str(mount_point))  # asks for permission once per session
    except Exception as error:  # refused, timed out, or google.colab missing
        _DRIVE_REFUSED.add(str(mount_point))
        print(
            f"Google Drive not mounted ({type(error).__name__}: {str(error)[:120]}); "
            "checkpoints go to this runtime's disk and are lost when it disconnects."
        )
        return False
    return (mount_point / "MyDrive").is_dir()


CHECKPOINT_DIR_VAR = "COURSE_CHECKPOINT_DIR"


def checkpoint_dir(
    name: str, environment: str | None = None, *, drive_mounted: bool | None = None
) -> Path:
    """Where a notebook's checkpoints go: on Colab with Drive mounted (``None``: look),
    under Drive, where they survive the session; else under ``$COURSE_CHECKPOINT_DIR``
    when it is set; else a temporary folder (never the course's checkout). The notebook
    prints the folder before it writes.

    >>> checkpoint_dir("demo", environment="colab", drive_mounted=True).as_posix()
    '/content/drive/MyDrive/pytorch-gpu-course/demo'
    >>> checkpoint_dir("demo", environment="colab", drive_mounted=False).name
    'demo'
    """
    if drive_mounted is None:
        drive_mounted = (DRIVE_MOUNT / "MyDrive").is_dir()
    if (environment or where_am_i()) == "colab" and drive_mounted:
        return DRIVE_MOUNT / DRIVE_FOLDER / name
    chosen = os.environ.get(CHECKPOINT_DIR_VAR, "").strip()
    if chosen:
        return Path(chosen).expanduser() / name
    return Path(tempfile.gettempdir()) / "course-checkpoints" / name


def checkpointing(folder: Path | str, every_n_steps: int) -> ModelCheckpoint:
    """A ``ModelCheckpoint`` that saves every ``every_n_steps`` steps and keeps
    ``last.ckpt`` (the one to resume from) in ``folder``."""
    return ModelCheckpoint(
        str(folder), "step-{step}", every_n_train_steps=every_n_steps, save_last=True
    )


def saved_step(path: Path | str) -> int:
    """The ``global_step`` stored in a Lightning checkpoint."""
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


# ----------------------------------------------------------- exercise 05 feedback
