"""Several GPUs (or CPU processes): DistributedDataParallel under torchrun, its checks,
DataParallel and model parallelism (notebook 06). The training entry point, one process
per GPU (or CPU slot, ``gloo``); for several nodes run it on each with ``--nnodes`` and one
c10d ``--rdzv-endpoint``::

    torchrun --nproc_per_node=2 -m course_utils.distributed train --steps 20 --out build/ddp
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, DistributedSampler

from course_utils import progress
from course_utils.data import SyntheticImages
from course_utils.device import cuda_gpu_count, to_device
from course_utils.models import build_model
from course_utils.training import TrainConfig, TrainStep, train
from course_utils.units import MIB

TOLERANCE = 1e-5
"""Largest parameter difference for "DDP equals one process" on CPU (float32 rounding)."""
DEFAULT_TIMEOUT_S = 120.0
JOB_TIMEOUT_S = 600.0
"""The limit on a whole torchrun job, start-up included: a hang, not a slow start. On a
busy 2-core machine starting torchrun and two workers (each importing torch) took up to
100 s before the first step; a 2-step ``ddp-check`` took 103 s in all."""


# --------------------------------------------------------------------------- process group


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job (``rank`` is global: 0 to ``world_size - 1``)."""

    rank: int
    world_size: int
    device: torch.device
    backend: str


def init_distributed(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the process group torchrun set up: ``nccl`` on GPU ``local_rank`` when this node
    has one per local process (``device="auto"``), else ``gloo`` on the CPU. ``timeout_s``
    bounds every collective: when a rank stops answering the others raise, not hang."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if device == "auto":
        # NVML-based count: does not initialize CUDA before set_device
        device = "cuda" if cuda_gpu_count() >= local_world else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)  # first CUDA call: one GPU per process
        chosen = torch.device("cuda", local_rank)
        # NCCL collectives are asynchronous: without this a failed peer can hang the rest
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    elif device == "cpu":
        chosen = torch.device("cpu")
    else:
        raise ValueError(f"device={device!r}: use 'auto', 'cuda' or 'cpu'")
    backend = "nccl" if chosen.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout)
    if backend == "gloo":
        dist.monitored_barrier(timeout=timeout)  # names a rank that never arrives
    return DistContext(dist.get_rank(), dist.get_world_size(), chosen, backend)


def free_port() -> int:
    """A TCP port that is free on this machine right now (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_train(
    config: RunConfig, nproc: int, device: str = "cpu", *, nnodes: int = 1, endpoint: str = ""
) -> list[str]:
    """The torchrun command that runs :func:`train_worker` with ``config`` on ``nproc``
    processes per node, c10d rendezvous on ``endpoint`` (default: a free local port)."""
    endpoint = endpoint or f"127.0.0.1:{free_port()}"  # IPv4: the address free_port checked
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}"]
    command += [f"--nproc_per_node={nproc}", "--rdzv-backend=c10d"]
    command += [f"--rdzv-endpoint={endpoint}", "--rdzv-id=course"]
    command += ["-m", "course_utils.distributed", "train", f"--device={device}"]
    values = {name: value for name, value in asdict(config).items() if value is not None}
    return command + [f"--{name.replace('_', '-')}={value}" for name, value in values.items()]


def launch_nodes(
    commands: Sequence[Sequence[str]],
    timeout_s: float,
    env: dict[str, str] | None = None,
    *,
    retries: int = 0,
    grace_s: float = 60.0,
) -> list[subprocess.CompletedProcess[str]]:
    """Run torchrun agents at once (for several "nodes": ``--nnodes=N`` and one c10d
    endpoint) and wait for all. If they outlive ``timeout_s``, or one outlives another by
    ``grace_s`` (agents leave torchrun's exit barrier together, or wait 300 s in it), kill
    their process groups and raise ``RuntimeError`` with each one's last lines.

    ``retries``: run again that often, after a warning with each node's last lines, when
    the job failed or hung; a retry rendezvouses on a fresh local port. Two agents on
    127.0.0.1 hang about 1 run in 25-50 (a rank aborts at exit). Each agent writes to a
    file, not a pipe: a full pipe would stall one node and so the whole job.
    """
    for attempt in range(retries + 1):
        try:
            done = _run_agents(commands, timeout_s, env or {}, grace_s)
            if attempt == retries or all(node.returncode == 0 for node in done):
                return done
            problem = "; ".join(f"node {n}: {_tail(node.stdout)}" for n, node in enumerate(done))
        except RuntimeError as error:
            if attempt == retries:
                raise
            problem = str(error)
        warnings.warn(f"torchrun agents, attempt {attempt + 1} failed ({problem})", stacklevel=2)
        port = free_port()
        commands = [
            [re.sub(r"^(--rdzv-endpoint=[^:]+):\d+$", rf"\g<1>:{port}", arg) for arg in command]
            for command in commands
        ]
    raise AssertionError("unreachable")


def _tail(output: str) -> str:
    return f"{failure_summary(output)} [last lines: {' | '.join(output.splitlines()[-12:])}]"


def _run_agents(
    commands: Sequence[Sequence[str]], timeout_s: float, env: dict[str, str], grace_s: float
) -> list[subprocess.CompletedProcess[str]]:
    """One attempt of :func:`launch_nodes`."""
    with tempfile.TemporaryDirectory(prefix="nodes-") as folder, contextlib.ExitStack() as stack:
        logs = [Path(folder) / f"node-{n}.txt" for n in range(len(commands))]
        agents = [
            subprocess.Popen(
                list(command),
                stdout=stack.enter_context(open(log, "w")),
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, **env},
                start_new_session=True,  # its own process group: the workers die with it
            )
            for command, log in zip(commands, logs, strict=True)
        ]
        deadline, why = time.monotonic() + timeout_s, f"did not finish in {timeout_s:g} s"
        while any(agent.poll() is None for agent in agents) and time.monotonic() < deadline:
            ended = any(agent.poll() is not None for agent in agents)
            if ended and deadline - time.monotonic() > grace_s:  # the exit barrier is over
                deadline, why = time.monotonic() + grace_s, f"outlived another by {grace_s:g} s"
            time.sleep(0.05)
        hung = [agent for agent in agents if agent.poll() is None]
        for agent in hung:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        outputs = [log.read_text() for log in logs]
    if hung:
        tails = "; ".join(f"node {n}: {_tail(out)}" for n, out in enumerate(outputs))
        raise RuntimeError(f"{len(hung)} torchrun agent(s) {why} ({tails})")
    return [
        subprocess.CompletedProcess(list(command), agent.returncode, output, "")
        for command, agent, output in zip(commands, agents, outputs, strict=True)
    ]


def failure_summary(output: str) -> str:
    """The line of a failed job's output that says why (its last ``...Error: ...`` line).

    >>> failure_summary("starting\\n[rank1]: RuntimeError: boom\\nChildFailedError:\\n")
    '[rank1]: RuntimeError: boom'
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "Error: " in line]
    return ((errors or lines or ["no output"])[-1])[:300]


# --------------------------------------------------------------------------- training


@dataclass
class RunConfig:
    """One DDP training run. ``batch_size`` is per process (the global batch is ``batch_size
    * world_size``). ``mlp``, or ``small_cnn`` with ``norm="group"``, give a result that
    does not depend on how a batch is split (see :func:`split_batch_gradient_difference`)."""

    model: str = "mlp"
    norm: str = "group"  # small_cnn only
    steps: int = 8
    batch_size: int = 16
    dataset_size: int = 256
    lr: float = 0.05
    seed: int = 0
    warmup_steps: int = 0  # untimed steps first (for throughput)
    # batches made and moved to the device before the clock starts, as DataParallel's in
    # data_parallel_report: the timed steps race DDP, not the input pipeline
    preload: bool = False
    out: str | None = None  # rank 0 writes checkpoint.pt and summary.json here
    timeout_s: float = DEFAULT_TIMEOUT_S

    def build_model(self) -> nn.Module:
        """The model, initialized from ``seed`` (the same on every rank)."""
        torch.manual_seed(self.seed)
        kwargs: dict[str, Any] = {"norm": self.norm} if self.model == "small_cnn" else {}
        return build_model(self.model, **kwargs)


def run_training(
    config: RunConfig, context: DistContext | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """Train ``config.steps`` steps, as one DDP rank with ``context``, else in one process;
    return the unwrapped model and a summary (this rank's losses, global samples/s). Rank
    ``r`` of W gets samples ``r, r + W, ...``: a step's W batches are one process's W*B."""
    rank, world = (context.rank, context.world_size) if context else (0, 1)
    device = context.device if context else torch.device("cpu")
    model: nn.Module = config.build_model().to(device)
    if context is not None:
        ids = [device.index] if device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters, then all-reduces gradients during backward()
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    step = TrainStep(model, device, TrainConfig(precision="fp32", optimizer="sgd", lr=config.lr))
    data = SyntheticImages(size=config.dataset_size, seed=config.seed)
    sampler: DistributedSampler[Any] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=config.seed
    )
    loader = DataLoader(data, batch_size=config.batch_size, sampler=sampler)
    warm_batches: Any = loader
    batches: Any = loader
    if config.preload:  # the same batches in the same order, made now, on the device
        warm_batches = to_device(list(_batch_order(loader, config.warmup_steps)), device)
        batches = to_device(list(_batch_order(loader, config.steps)), device)
    warm = train(step, warm_batches, max_steps=config.warmup_steps) if config.warmup_steps else None
    if context is not None:
        dist.barrier()  # start the clock together
    # as many epochs as the steps need (train calls sampler.set_epoch for each)
    result = train(step, batches, max_steps=config.steps, epochs=config.steps)
    summary = {
        "world_size": world,
        "device": str(device),
        "global_batch": config.batch_size * world,
        "losses": (warm.losses if warm else []) + result.losses,
        "samples_per_s": result.samples_per_s * world,
    }
    return getattr(model, "module", model), summary


def _batch_order(loader: DataLoader[Any], steps: int) -> Iterator[Any]:
    """The first ``steps`` batches :func:`~course_utils.training.train` would draw from
    ``loader``, epoch after epoch (``sampler.set_epoch`` before each)."""
    drawn = 0
    for epoch in range(steps):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        for batch in loader:
            if drawn == steps:
                return
            drawn += 1
            yield batch


def train_worker(config: RunConfig, device: str = "auto") -> dict[str, Any]:
    """The body of one torchrun worker: join, train, and on rank 0 alone log and save
    (``checkpoint.pt``, the unwrapped ``state_dict``, and ``summary.json`` in ``out``)."""
    context = init_distributed(device, config.timeout_s)
    try:
        model, summary = run_training(config, context)
        if context.rank == 0:  # one log and one checkpoint, not world_size of them
            for number, loss in enumerate(summary["losses"], start=1):
                print(f"[rank 0] step {number} loss {loss:.4f}")
            print(
                f"[rank 0] {context.world_size} process(es), backend {context.backend}, "
                f"{summary['samples_per_s']:.1f} samples/s",
                flush=True,
            )
            if config.out:
                out = Path(config.out)
                out.mkdir(parents=True, exist_ok=True)
                torch.save(model.state_dict(), out / "checkpoint.pt")
                (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if context.backend == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=config.timeout_s))
        return summary
    finally:
        dist.destroy_process_group()


def _torchrun_job(
    config: RunConfig, nproc: int, device: str, timeout_s: float, env: dict[str, str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Run :func:`train_worker` under torchrun; return rank 0's summary and final state."""
    with tempfile.TemporaryDirectory(prefix="ddp-") as folder:
        run = RunConfig(**{**asdict(config), "out": folder})
        done = launch_nodes([torchrun_train(run, nproc, device)], timeout_s, env)[0]
        if done.returncode != 0:
            raise RuntimeError(
                f"the DDP run on {nproc} process(es) failed (exit {done.returncode}): "
                f"{failure_summary(done.stdout)}"
            )
        summary = json.loads((Path(folder) / "summary.json").read_text())
        return summary, torch.load(Path(folder) / "checkpoint.pt", weights_only=True)


# --------------------------------------------------------------------------- checks


def max_parameter_difference(
    first: dict[str, torch.Tensor] | nn.Module, second: dict[str, torch.Tensor] | nn.Module
) -> float:
    """The largest absolute difference between two models' parameters.

    >>> a = nn.Linear(2, 2); b = nn.Linear(2, 2); b.load_state_dict(a.state_dict())
    <All keys matched successfully>
    >>> max_parameter_difference(a, b)
    0.0
    """
    one = first.state_dict() if isinstance(first, nn.Module) else first
    two = second.state_dict() if isinstance(second, nn.Module) else second
    if one.keys() != two.keys():
        raise ValueError(f"different parameters: {sorted(set(one) ^ set(two))}")
    gaps = (one[key].detach().cpu().double() - two[key].detach().cpu().double() for key in one)
    return max(gap.abs().max().item() for gap in gaps)


def split_batch_gradient_difference(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, parts: int = 2
) -> float:
    """How far the average of ``parts`` sub-batch gradients (what DDP's all-reduce gives)
    is from the full-batch gradient (one process). Zero up to rounding when the forward
    treats samples independently; not with BatchNorm, which normalizes each sub-batch with
    its own statistics (``nn.SyncBatchNorm`` uses all ranks')."""
    loss_fn = nn.CrossEntropyLoss()
    model.zero_grad(set_to_none=True)
    loss_fn(model(inputs), targets).backward()
    full = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    for sub_inputs, sub_targets in zip(inputs.chunk(parts), targets.chunk(parts), strict=True):
        (loss_fn(model(sub_inputs), sub_targets) / parts).backward()  # the all-reduce average
    averaged = [p.grad for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return max((a - b).abs().max().item() for a, b in zip(full, averaged, strict=True))


def reference_model(config: RunConfig, world_size: int) -> nn.Module:
    """One process, batch ``world_size * config.batch_size``, the same samples and steps.

    It runs with one CPU thread, as torchrun's CPU workers do: with many threads matmuls
    add in another order, and over tens of steps the differences grew to 1.3e-5 (16 cores).
    """
    single = RunConfig(**{**asdict(config), "batch_size": config.batch_size * world_size})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = run_training(single)
    finally:
        torch.set_num_threads(threads)
    return model


def equivalence_check(nproc: int, config: RunConfig, timeout_s: float = JOB_TIMEOUT_S) -> float:
    """Train with DDP on ``nproc`` CPU processes (gloo, torchrun), then in this process on
    the combined batch (:func:`reference_model`); return the largest parameter difference.
    They agree: the average of the ranks' mean-loss gradients is the combined batch's.
    """
    if config.dataset_size % (nproc * config.batch_size):
        raise ValueError("dataset_size must be a multiple of nproc * batch_size (no padding)")
    _, ddp_state = _torchrun_job(config, nproc, "cpu", timeout_s, {})
    return max_parameter_difference(ddp_state, reference_model(config, nproc))


def measure_scaling(
    process_counts: Sequence[int],
    config: RunConfig | None = None,
    device: str = "auto",
    timeout_s: float = JOB_TIMEOUT_S,
    repeats: int = 1,
) -> list[dict[str, Any]]:
    """Global throughput of the same per-process batch for each process count (a torchrun
    job each) and the efficiency ``throughput(N) / (N * throughput(1))``. Each process has
    one CPU thread (``OMP_NUM_THREADS=1``), or drives one GPU. ``repeats``: the counts run
    that many times, taking turns (1, 2, 2, 1, ...); each count keeps its fastest run
    (other work on the machine only slows a run down), and ``runs`` lists them all."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    config = config or RunConfig(model="small_cnn", steps=10, warmup_steps=2, batch_size=32)
    order = [
        count
        for turn in range(repeats)
        for count in (process_counts if turn % 2 == 0 else list(process_counts)[::-1])
    ]
    best: dict[int, dict[str, Any]] = {}
    runs: dict[int, list[float]] = {count: [] for count in process_counts}
    for count in progress.track(order, "DDP scaling", unit="run"):
        summary, _ = _torchrun_job(config, count, device, timeout_s, {"OMP_NUM_THREADS": "1"})
        runs[count].append(summary["samples_per_s"])
        if count not in best or summary["samples_per_s"] > best[count]["samples_per_s"]:
            best[count] = summary
    keys = ("device", "samples_per_s", "global_batch")  # global: per-process x processes
    rows = [
        {"processes": count, **{key: best[count][key] for key in keys}, "runs": runs[count]}
        for count in process_counts
    ]
    base = rows[0]["samples_per_s"] / rows[0]["processes"]
    for row in rows:
        row["efficiency"] = row["samples_per_s"] / (row["processes"] * base)
    return rows


def plot_scaling(rows: Sequence[dict[str, Any]], label: str) -> Any:
    """Throughput against processes, with the ideal (linear) line; returns the axes."""
    ax = plt.subplots(figsize=(5, 3.5))[1]
    counts = [row["processes"] for row in rows]
    measured = [row["samples_per_s"] for row in rows]
    ideal = [measured[0] / counts[0] * count for count in counts]
    ax.plot(counts, ideal, "--", color="gray", label="ideal (linear)")
    ax.plot(counts, measured, "o-", label="measured")
    for count, value, row in zip(counts, measured, rows, strict=True):
        ax.annotate(
            f"{row['efficiency']:.0%}", (count, value), textcoords="offset points", xytext=(4, -12)
        )
    ax.set(xticks=counts, xlabel="processes", ylabel="samples / s (all processes)")
    ax.set_title(f"DDP scaling, {label}", fontsize=9)
    ax.legend()
    return ax


# --------------------------------------------------------------------------- ranks by fork


@dataclass
class RanksRun:
    """What :func:`run_as_ranks` saw: each rank's exit code (``None``: stopped) and error,
    the ranks that called ``torch.save``, the epochs given to ``set_epoch``, the ranks that
    built a ``DistributedSampler`` and those that returned with the process group open."""

    exit_codes: list[int | None]
    errors: dict[int, str]
    saved_by: list[int]
    set_epoch_calls: dict[int, list[int]]
    made_sampler: list[int] = field(default_factory=list)
    left_group_open: list[int] = field(default_factory=list)
    wrapped_in_ddp: list[int] = field(default_factory=list)  # ranks that built a DDP model
    # each rank's DistributedSamplers as (shuffle, seed), DataLoaders' batch sizes, steps
    sampler_settings: dict[int, list[tuple[bool, int]]] = field(default_factory=dict)
    batch_sizes: dict[int, list[int | None]] = field(default_factory=dict)
    optimizer_steps: dict[int, int] = field(default_factory=dict)
    # what each failed rank's exception said: its message, and its class's name unless
    # the class is Python's own (the learner's words, which a grader does not quote)
    said: dict[int, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exit_codes)

    def first_error(self) -> str:
        """The first failed rank's error (or why it was stopped), one line."""
        ended = [f"rank {r} ended with exit code {c}" for r, c in enumerate(self.exit_codes) if c]
        return next(iter(self.errors.values()), ended[0] if ended else "")


def _rank_main(
    fn: Any, rank: int, world_size: int, port: int, folder: str, args: tuple[Any, ...]
) -> None:
    """One forked rank: torchrun's environment variables, one thread, the spies, ``fn``."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ.update(WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # a forked child must not use the parent's OpenMP pool
    seen: dict[str, Any] = {"saved": False, "epochs": [], "error": None, "samplers": 0}
    seen.update(ddp=0, sampler_settings=[], batch_sizes=[], steps=0)
    save, set_epoch = torch.save, DistributedSampler.set_epoch
    make_sampler, make_ddp = DistributedSampler.__init__, DDP.__init__
    make_loader = DataLoader.__init__

    def spied_save(*save_args: Any, **kwargs: Any) -> Any:
        seen["saved"] = True
        return save(*save_args, **kwargs)

    def spied_set_epoch(sampler: Any, epoch: int) -> None:
        seen["epochs"].append(epoch)
        set_epoch(sampler, epoch)

    def spied_init(sampler: Any, *init_args: Any, **kwargs: Any) -> None:
        seen["samplers"] += 1
        make_sampler(sampler, *init_args, **kwargs)
        seen["sampler_settings"].append((bool(sampler.shuffle), int(sampler.seed)))

    def spied_ddp(wrapper: Any, *init_args: Any, **kwargs: Any) -> None:
        seen["ddp"] += 1
        make_ddp(wrapper, *init_args, **kwargs)

    def spied_loader(loader: Any, *init_args: Any, **kwargs: Any) -> None:
        make_loader(loader, *init_args, **kwargs)
        seen["batch_sizes"].append(loader.batch_size)

    def count_step(*hook_args: Any) -> None:
        seen["steps"] += 1

    def joined_by_all(*init_args: Any, **kwargs: Any) -> None:
        # Every rank has made its connections before any goes on: a rank whose code then
        # ends at once (an answer that never communicates) must not close its side while
        # another is still connecting (gloo: "connectFullMesh failed ... closed by peer").
        init_group(*init_args, **kwargs)
        dist.barrier()

    register_optimizer_step_post_hook(count_step)
    init_group = dist.init_process_group
    dist.init_process_group = joined_by_all
    DDP.__init__ = spied_ddp  # type: ignore[method-assign,assignment]
    DataLoader.__init__ = spied_loader  # type: ignore[method-assign,assignment]
    torch.save = spied_save
    DistributedSampler.set_epoch = spied_set_epoch  # type: ignore[method-assign,assignment]
    DistributedSampler.__init__ = spied_init  # type: ignore[method-assign,assignment]
    with open(os.devnull, "w") as log:  # the errors are reported, the prints dropped
        sys.stdout = sys.stderr = log
        try:
            fn(*args)
        except BaseException as error:  # reported to the parent, which decides
            seen["error"] = f"rank {rank}: {type(error).__name__}: {error}"
            seen["said"] = [str(error)] + ([] if _pythons(error) else [type(error).__name__])
        seen["group_open"] = dist.is_available() and dist.is_initialized()
        log.flush()
    (Path(folder) / f"rank-{rank}.json").write_text(json.dumps(seen))
    os._exit(1 if seen["error"] else 0)  # skip the parent's exit handlers (a Jupyter kernel's)


def run_as_ranks(
    fn: Any, world_size: int = 2, args: Sequence[Any] = (), timeout_s: float = 60.0
) -> RanksRun:
    """Run ``fn(*args)`` in ``world_size`` forked CPU processes with torchrun's environment
    (fork lets ``fn`` live in a notebook). When one rank fails the others are stopped, all
    after ``timeout_s``; a ``NotImplementedError`` (an unanswered exercise) is raised here."""
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="ranks-") as folder:
        port = free_port()
        ranks = [
            context.Process(
                target=_rank_main, args=(fn, rank, world_size, port, folder, tuple(args))
            )
            for rank in range(world_size)
        ]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + timeout_s
        while any(p.exitcode is None for p in ranks) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in ranks):
                break  # one failed: stop the rest instead of letting them wait for it
            time.sleep(0.02)
        late = time.monotonic() >= deadline
        why = f"after {timeout_s:g} s (still waiting?)" if late else "because another rank failed"
        stopped = {}
        for rank, process in enumerate(ranks):
            if process.exitcode is None:
                process.kill()
                stopped[rank] = f"rank {rank} was stopped {why}"
            process.join()
        # in the order the ranks ended: the first error is the cause, the rest follow
        files = sorted(Path(folder).glob("rank-*.json"), key=lambda path: path.stat().st_mtime_ns)
        seen = {int(path.stem.split("-")[1]): json.loads(path.read_text()) for path in files}
        errors = {rank: report["error"] for rank, report in seen.items() if report["error"]}
        errors.update({rank: why for rank, why in stopped.items() if rank not in errors})
        if any(text.split(": ", 2)[1:2] == ["NotImplementedError"] for text in errors.values()):
            raise NotImplementedError(next(iter(errors.values())))
        return RanksRun(
            exit_codes=[None if rank in stopped else p.exitcode for rank, p in enumerate(ranks)],
            errors=errors,
            saved_by=sorted(rank for rank, report in seen.items() if report["saved"]),
            set_epoch_calls={
                rank: seen.get(rank, {}).get("epochs", []) for rank in range(world_size)
            },
            made_sampler=sorted(rank for rank, report in seen.items() if report["samplers"]),
            left_group_open=sorted(rank for rank, report in seen.items() if report["group_open"]),
            wrapped_in_ddp=sorted(rank for rank, report in seen.items() if report["ddp"]),
            sampler_settings={
                rank: [(bool(a), int(b)) for a, b in report["sampler_settings"]]
                for rank, report in seen.items()
            },
            batch_sizes={rank: report["batch_sizes"] for rank, report in seen.items()},
            optimizer_steps={rank: report["steps"] for rank, report in seen.items()},
            said={rank: report.get("said", []) for rank, report in seen.items() if report["error"]},
        )


def _pythons(error: BaseException) -> bool:
    """Whether ``error``'s class is one of Python's own exceptions (its name is not the
    learner's words)."""
    from course_utils.feedback import builtin_error  # lazy: only a failed rank

    return bool(builtin_error(type(error)))


# ------------------------------------------------------ exercise 06 (a): rank indices


def sampler_indices(size: int, world_size: int, rank: int, seed: int, epoch: int) -> list[int]:
    """The indices ``DistributedSampler(range(size), world_size, rank, shuffle=True,
    seed=seed)`` gives ``rank`` in ``epoch``."""
    data: Any = range(size)  # a sampler needs only len()
    sampler: DistributedSampler[int] = DistributedSampler(
        data, world_size, rank, shuffle=True, seed=seed
    )
    sampler.set_epoch(epoch)
    return list(sampler)


# --------------------------------------------------------- exercise 06 (b): all-reduce


def exercise_gradient(rows: slice | None = None) -> torch.Tensor:
    """The weight gradient of a seeded ``nn.Linear(5, 3)``'s mean squared error over
    ``rows`` of a seeded batch of 8 (all of them by default): a share, or the whole."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 3)
    inputs, targets = torch.randn(8, 5), torch.randn(8, 3)
    chosen = rows if rows is not None else slice(None)
    nn.functional.mse_loss(layer(inputs[chosen]), targets[chosen]).backward()
    assert layer.weight.grad is not None
    return layer.weight.grad


# --------------------------------------------------------------------------- DataParallel


def data_parallel_report(model: nn.Module, batch_size: int = 64, steps: int = 5) -> dict[str, Any]:
    """What ``nn.DataParallel`` does here. With 2+ GPUs: throughput on one GPU and with
    DataParallel, and each GPU's peak memory; else the explanation, and a check that it
    runs the module unchanged. Timed as :func:`run_training` times a DDP run with
    ``RunConfig(preload=True)``: fp32 SGD, the batch already on the GPU, one untimed step,
    then ``steps`` steps with one synchronization at the end (:func:`train`), so that the
    two race the same work. Initializes CUDA: call it after any fork."""
    gpus = cuda_gpu_count()
    wrapped = nn.DataParallel(model if gpus >= 2 else model.cpu())
    report: dict[str, Any] = {"gpus": gpus, "device_ids": list(wrapped.device_ids)}
    if gpus < 2:
        # with one GPU, DataParallel has moved the module to cuda:0 (device_ids == [0])
        device = next(model.parameters()).device
        inputs = torch.randn(2, 3, 32, 32, device=device)
        with torch.no_grad():
            same = torch.allclose(wrapped(inputs), model(inputs), rtol=0.0, atol=1e-6)
        report["runs_module_unchanged"] = same
        where = "no GPU: it calls the module on the CPU" if not gpus else "one GPU: on cuda:0"
        report["explanation"] = (
            f"nn.DataParallel with {where} (device_ids == {report['device_ids']}), nothing in "
            "parallel. With 2+ GPUs, each forward it would: "
            "scatter the batch into one chunk per GPU, replicate the model onto every GPU, "
            "run the replicas in threads (parallel_apply), and gather the outputs on GPU 0, "
            "where the loss and the summed gradients live."
        )
        return report
    rows: dict[str, dict[str, Any]] = {}
    inputs = torch.randn(batch_size, 3, 32, 32, device="cuda:0")
    targets = torch.randint(0, 10, (batch_size,), device="cuda:0")
    for name, module in (("one_gpu", model.to("cuda:0")), ("data_parallel", wrapped)):
        for index in range(gpus):
            torch.cuda.reset_peak_memory_stats(index)
        step = TrainStep(module, "cuda:0", TrainConfig(precision="fp32", optimizer="sgd"))
        step((inputs, targets))  # warm-up, untimed, as the DDP run's warmup_steps
        timed = train(step, [(inputs, targets)] * steps)  # one synchronization, at the end
        peaks = [torch.cuda.max_memory_allocated(index) / MIB for index in range(gpus)]
        rows[name] = {"samples_per_s": timed.samples_per_s, "peak_mib_per_gpu": peaks}
    report["measured"] = rows
    report["speedup"] = rows["data_parallel"]["samples_per_s"] / rows["one_gpu"]["samples_per_s"]
    return report


# --------------------------------------------------------------------------- model parallel


class SplitModel(nn.Module):
    """A model cut into stages, each on its own device, one working at a time (no
    pipelining). ``handoffs``: each activation moved in the last forward, ``(from, to,
    shape, bytes)``."""

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[str | torch.device]):
        super().__init__()
        self.devices = [torch.device(device) for device in devices]
        self.stages = nn.ModuleList(
            stage.to(device) for stage, device in zip(stages, self.devices, strict=True)
        )
        self.handoffs: list[tuple[str, str, tuple[int, ...], int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.handoffs = []
        for stage, device in zip(self.stages, self.devices, strict=True):
            if x.device != device:
                nbytes = x.numel() * x.element_size()
                self.handoffs.append((str(x.device), str(device), tuple(x.shape), nbytes))
                x = x.to(device)  # the hand-off: autograd sends gradients back the same way
            x = stage(x)
        return x


def split_model(model: nn.Module, devices: Sequence[str | torch.device]) -> SplitModel:
    """Split a course model (``blocks``, ``head``) in two: the first half of the blocks on
    ``devices[0]``, the rest and the head on ``devices[1]``."""
    blocks = getattr(model, "blocks", None)
    head = getattr(model, "head", None)
    if not isinstance(blocks, nn.Sequential) or head is None or len(devices) != 2:
        raise ValueError("split_model needs a course model (small_cnn or mlp) and two devices")
    children = list(blocks.children())
    half = max(1, len(children) // 2)
    first: list[nn.Module] = [getattr(model, "flatten", nn.Identity()), *children[:half]]
    second = nn.Sequential(*children[half:], head)
    return SplitModel([nn.Sequential(*first), second], devices)


# --------------------------------------------------------------------------- command line


def _flag(text: str) -> bool:
    """A yes/no option's value: ``True``/``False`` (as ``torchrun_train`` writes), 1/0."""
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, not {text!r}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m course_utils.distributed",
        description="DDP training entry point (run under torchrun).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("train", help="train with DDP; rank 0 logs and saves")
    trainer.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    for name, value in asdict(RunConfig()).items():
        kind: Any = str if name == "out" else type(value)  # out's default is None
        if kind is bool:  # "--preload=False" must not read as True
            kind = _flag
        trainer.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)
    return parser


def train_main(argv: list[str] | None = None) -> int:
    """Run ``train`` as one torchrun worker; return its exit code."""
    args = vars(_parser().parse_args(argv))
    args.pop("command")
    device = args.pop("device")
    train_worker(RunConfig(**args), device)
    return 0


if __name__ == "__main__":
    sys.exit(train_main())
