"""GPU probes: short checks of the GPU-only mechanisms behind the course's review findings.

The reviewer's ``gpu-check.sh`` (``docs/reviews/2026-12-gpu-check.sh``) carried these as a
script; here each is one small function returning a JSON-able dict of its figures and,
where the probe has one, a ``"verdict"``. ``gpu-record`` runs them right after the
doctor's check, in a child process (``python -m course_utils.tooling.gpu_probes --out FILE``)
that writes its results after every probe, so that the recorder never starts CUDA, a
probe that crashes the process costs only the probes after it, and a killed run keeps
the probes done. In that child each probe has its own time limit (:data:`PROBES`); one
that raises is recorded as ``error``, one past its limit as ``timeout``, and the run goes
on. Probes that start a fresh Python (fork safety, CUDA contexts) do it with
``subprocess`` and a timeout. Without a GPU every probe says ``skipped: no GPU`` at once.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Result = dict[str, Any]
STATUSES = ("ok", "error", "timeout", "skipped", "not run")
MIN_PROBE_S = 5.0  # a probe is not started with less time than this left


@dataclass(frozen=True)
class Probe:
    """One probe: its function (called with the CUDA device), the finding it checks and
    its time limit in seconds."""

    name: str
    run: Callable[[Any], Result]
    finding: str
    limit_s: float


# ------------------------------------------------------------------ child-process probes


def in_child(code: str, timeout_s: float) -> Result:
    """Run ``code`` in a fresh Python (this one); its last stdout line is JSON."""
    env = {**os.environ, "COURSE_PROGRESS": "off"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"the child Python failed (exit {done.returncode}): {tail[:300]}")
    found: Result = json.loads(lines[-1])
    return found


FORK = r"""
import json, os
{setup}
import torch
from course_utils import device, env, workload
{before}
parent_initialized = torch.cuda.is_initialized()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        torch.ones(1, device="cuda").sum().item()
        os.write(w, b"child used CUDA")
    except Exception as error:
        os.write(w, ("child failed: " + str(error)[:200]).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = os.read(r, 300).decode()
print(json.dumps({{"parent_initialized": parent_initialized, "child": child,
                  "verdict": "fork-safe" if child == "child used CUDA" else "not fork-safe"}}))
"""


def fork_after_course_helpers(device: Any) -> Result:
    """Review finding 1 (notebook 06, ``ddp_notebook``): after the course's helpers that
    run before a fork (``env.doctor()``, ``device.cuda_gpu_count()``, ``workload.pick``),
    a forked child can still use CUDA. Verdict: ``fork-safe`` or ``not fork-safe``."""
    before = "env.doctor(); device.cuda_gpu_count(); workload.pick(small=1, cpu=2, gpu=3)"
    return in_child(FORK.format(setup="", before=before), PROBE_LIMITS["fork"])


def fork_after_plain_is_available(device: Any) -> Result:
    """Why notebook 06 sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1``: after a plain
    ``torch.cuda.is_available()`` (the CUDA runtime's device count) a forked child may
    find CUDA unusable. Informative: the verdict is what this torch and driver do."""
    setup = "os.environ.pop('PYTORCH_NVML_BASED_CUDA_CHECK', None)"
    code = FORK.format(setup=setup, before="torch.cuda.is_available()")
    return in_child(code, PROBE_LIMITS["fork"])


def fork_after_nvml_is_available(device: Any) -> Result:
    """Notebook 06's remedy: with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` set before torch is
    imported, ``torch.cuda.is_available()`` asks NVML and a forked child can use CUDA.
    Verdict: ``fork-safe`` expected."""
    setup = "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'"
    code = FORK.format(setup=setup, before="torch.cuda.is_available()")
    return in_child(code, PROBE_LIMITS["fork"])


NO_CONTEXT = r"""
import json, torch
from course_utils.device import to_device
to_device(torch.ones(2), "cpu")
after_to_device = torch._C._cuda_hasPrimaryContext(0)
torch.ones(2).is_pinned()
after_is_pinned = torch._C._cuda_hasPrimaryContext(0)
print(json.dumps({"context_after_to_device_cpu": after_to_device,
                  "context_after_is_pinned": after_is_pinned,
                  "verdict": "no context" if not after_to_device else "made a context"}))
"""


def cpu_to_device_makes_no_context(device: Any) -> Result:
    """Review finding 12: ``device.to_device(batch, "cpu")`` must not create a CUDA
    context (``is_pinned()`` did, costing ~500 MiB of GPU memory in a CPU-only step).
    Verdict: ``no context`` expected; ``context_after_is_pinned`` shows torch's own."""
    return in_child(NO_CONTEXT, PROBE_LIMITS["fork"])


# ------------------------------------------------------------------ in-process probes


def machine(device: Any) -> Result:
    """The GPU and the libraries as torch sees them, beside the record's ``machine``
    (from NVML and the doctor, without CUDA: the doctor's finding that it must not start
    CUDA): name, capability, memory, SMs, CUDA, cuDNN, NCCL, Triton."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch

    props = torch.cuda.get_device_properties(device)
    try:
        # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    nccl = getattr(torch.cuda, "nccl", None)
    return {
        "device": str(device),
        "name": props.name,
        "capability": [props.major, props.minor],
        "total_memory_gib": round(props.total_memory / 2**30, 2),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": str(nccl.version()) if nccl is not None else None,
        "triton": triton_version,
    }


def nvml_vs_cuda_identity(device: Any) -> Result:
    """The review's finding on the doctor and the memory readers (``course_utils.nvml``,
    one place maps CUDA's numbering to NVML's): NVML's GPU for
    each CUDA index (PCI order, ``CUDA_VISIBLE_DEVICES``, MIG) is the one torch uses, by
    UUID and memory; the course's GPU count is torch's; the peak-FLOP/s table has a row.
    Verdict: ``agree`` or ``disagree``."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch

    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    from course_utils import flops, nvml
    from course_utils.device import cuda_gpu_count

    rows = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpu = nvml.gpu_for_cuda_index(index)
        torch_uuid = str(getattr(props, "uuid", "") or "")
        course_uuid = gpu.uuid if gpu else None
        rows.append(
            {
                "cuda": index,
                "torch_uuid": torch_uuid or None,
                "course_uuid": course_uuid,
                "course_name": gpu.name if gpu else None,
                "course_total_mib": gpu.memory_total_mib if gpu else None,
                "torch_total_mib": props.total_memory // 2**20,
                "same_gpu": bool(course_uuid and torch_uuid)
                and nvml._bare_uuid(str(course_uuid)) == nvml._bare_uuid(torch_uuid),
            }
        )
    counts = {"course_count": cuda_gpu_count(), "torch_count": torch.cuda.device_count()}
    peak = flops.gpu_peak_flops(torch.cuda.get_device_properties(device).name)
    agree = all(row["same_gpu"] for row in rows) and len(set(counts.values())) == 1
    return {
        "rows": rows,
        **counts,
        "peak_row": str(peak) if peak else None,
        "verdict": "agree" if agree else "disagree",
    }


def sdpa_backends(device: Any) -> Result:
    """Notebook 09 (cells on ``scaled_dot_product_attention``'s kernels, the claim of the
    kernel chosen by default): which SDPA backends run causal attention in fp32, fp16 and
    bf16 on this GPU, and which one PyTorch picks by default (its backward's name)."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import warnings

    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
    backends = [getattr(SDPBackend, name) for name in names if hasattr(SDPBackend, name)]
    table: Result = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(2, 8, 256, 64, device=device, dtype=dtype) for _ in range(3))
        row: dict[str, str] = {}
        for backend in backends:
            with warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore")
                try:
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    row[backend.name] = "runs"
                except RuntimeError:
                    row[backend.name] = "refused"
        q.requires_grad_(True)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        row["default"] = type(out.grad_fn).__name__
        table[str(dtype).removeprefix("torch.")] = row
    return {"dtypes": table}


def attention_backward_determinism(device: Any) -> Result:
    """Notebook 09 (the fused-vs-foreach AdamW cell compares models at ``rtol=1e-5``
    after attention): two backward passes of the same causal attention give the same
    gradients? Verdict: ``deterministic`` or ``differs`` (with the largest difference)."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = (torch.randn(64, 6, 256, 64, device=device, requires_grad=True) for _ in range(3))
    grads = []
    for _ in range(2):
        for tensor in (q, k, v):
            tensor.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v) if t.grad is not None])
    diff = max((a - b).abs().max().item() for a, b in zip(*grads, strict=True))
    return {
        "max_abs_diff_between_two_backwards": diff,
        "verdict": "deterministic" if diff == 0.0 else "differs",
    }


def adamw_fused_vs_foreach_one_step(device: Any) -> Result:
    """Notebook 09's fused AdamW claim (issue 31): one step of ``AdamW(fused=True)`` and
    of the default (foreach) AdamW from the same model and batch give the same parameters
    within notebook 09's ``rtol=1e-5``. Verdict: ``agree`` or ``differ``."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch

    torch.manual_seed(0)
    layers = (torch.nn.Linear(384, 1536), torch.nn.GELU(), torch.nn.Linear(1536, 384))
    foreach = torch.nn.Sequential(*layers).to(device)
    fused = copy.deepcopy(foreach)
    optimizers = (
        torch.optim.AdamW(foreach.parameters(), lr=1e-3),
        torch.optim.AdamW(fused.parameters(), lr=1e-3, fused=True),
    )
    x = torch.randn(4096, 384, device=device)
    for model, optimizer in zip((foreach, fused), optimizers, strict=True):
        model(x).square().mean().backward()
        optimizer.step()
    pairs = list(zip(foreach.parameters(), fused.parameters(), strict=True))
    diff = max((a - b).abs().max().item() for a, b in pairs)
    close = all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in pairs)
    return {"max_abs_param_diff": diff, "verdict": "agree" if close else "differ"}


def memory_cap_finder_repeatability(device: Any) -> Result:
    """Notebook 03 (the memory-capped batch finder; ``tests/test_nb03_gpu.py``): under
    ``memory.memory_cap(device, 512)``, ``batch.find_max_batch_size``'s limit fits and the
    limit + 1 runs out of memory, three times over. Verdict: ``repeatable`` or not."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    from course_utils.batch import TrainTrial, find_max_batch_size
    from course_utils.memory import memory_cap
    from course_utils.oom import is_out_of_memory

    trial = TrainTrial("small_cnn", str(device), model_kwargs={"width": 16})
    again: list[list[Any]] = []
    with memory_cap(device, 512):
        found = find_max_batch_size(trial, low=2, high=2**16)
        limit = found.limit
        for _ in range(3):
            for size in (limit, limit + 1):
                try:
                    trial(size)
                    again.append([size, "fits"])
                except RuntimeError as error:
                    again.append([size, "oom" if is_out_of_memory(error) else repr(error)[:120]])
    expected = [[limit, "fits"], [limit + 1, "oom"]] * 3
    return {
        "cap_mib": 512,
        "limit": limit,
        "trials": found.trials,
        "capped": found.capped,
        "repeat": again,
        "errors_seen": sorted({t.error[:80] for t in found.history if t.error}),
        "verdict": "repeatable" if again == expected and not found.capped else "not repeatable",
    }


def ddp_vs_dp_inputs(device: Any) -> Result:
    """Notebook 06 (DDP against DataParallel): a DataLoader of ``SyntheticImages`` made
    on the CPU caps what one DDP rank can train; hence ``distributed.RunConfig(
    preload=True)`` (the batches made and moved before the clock starts, as
    ``data_parallel_report`` does). Figures: the loader's and one GPU step's samples/s.
    Verdict: ``loader-bound`` (preload needed for a fair race) or ``gpu-bound``."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch
    from torch.utils.data import DataLoader

    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    from course_utils.data import SyntheticImages
    from course_utils.models import build_model
    from course_utils.timing import benchmark
    from course_utils.training import TrainConfig, TrainStep

    loader = iter(DataLoader(SyntheticImages(size=4096, seed=0), batch_size=256))
    next(loader)
    start = time.perf_counter()
    for _ in range(4):
        next(loader)
    load_s = (time.perf_counter() - start) / 4
    model = build_model("small_cnn", norm="group").to(device)
    step = TrainStep(model, device, TrainConfig(precision="fp32", optimizer="sgd"))
    batch = (
        torch.randn(512, 3, 32, 32, device=device),
        torch.randint(0, 10, (512,), device=device),
    )
    gpu_s = benchmark(lambda: step(batch), device=device, repeats=5).median_s
    loader_rate, gpu_rate = 256 / load_s, 512 / gpu_s
    return {
        "loader_s_per_256": load_s,
        "one_gpu_step_s_512": gpu_s,
        "loader_samples_per_s": loader_rate,
        "one_gpu_samples_per_s": gpu_rate,
        "verdict": "loader-bound" if loader_rate < gpu_rate else "gpu-bound",
    }


def reduce_overhead_training_step(device: Any) -> Result:
    """Notebook 09 (``torch.compile(mode="reduce-overhead")`` at batch 1, CUDA graphs): a
    small transformer-like MLP's whole training step, eager against compiled, taking
    turns (``timing.time_in_turns``). Verdict: ``faster`` or ``not faster`` (minimums)."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch

    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    from course_utils.timing import time_in_turns

    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(
            torch.nn.LayerNorm(384), torch.nn.Linear(384, 1536), torch.nn.GELU(),
            torch.nn.Linear(1536, 384),
        )
        for _ in range(6)
    ]  # fmt: skip
    net = torch.nn.Sequential(*blocks).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(1, 256, 384, device=device)

    def stepper(model: Any) -> Callable[[], Any]:
        def step() -> Any:
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        return step

    start = time.perf_counter()
    compiled = torch.compile(net, mode="reduce-overhead")
    for _ in range(3):
        stepper(compiled)()
    compile_s = time.perf_counter() - start
    turns = time_in_turns(
        {"eager": stepper(net), "compiled": stepper(compiled)}, device=device, warmup=2, rounds=20
    )
    eager, fast = turns["eager"].min_s, turns["compiled"].min_s
    return {
        "compile_s": compile_s,
        "eager_min_s": eager,
        "compiled_min_s": fast,
        "speedup": eager / fast,
        "verdict": "faster" if fast < eager else "not faster",
    }


PROBE_LIMITS = {"fork": 50.0}  # a fresh Python's timeout, under its probe's 60 s
PROBES: tuple[Probe, ...] = (
    Probe("fork_after_course_helpers", fork_after_course_helpers, "review finding 1", 60),
    Probe("fork_after_plain_is_available", fork_after_plain_is_available, "notebook 06", 60),
    Probe("fork_after_nvml_is_available", fork_after_nvml_is_available, "notebook 06", 60),
    Probe("cpu_to_device_makes_no_context", cpu_to_device_makes_no_context, "finding 12", 60),
    Probe("machine", machine, "the record's machine", 30),
    Probe("nvml_vs_cuda_identity", nvml_vs_cuda_identity, "the doctor, nvml", 30),
    Probe("sdpa_backends", sdpa_backends, "notebook 09", 60),
    Probe("attention_backward_determinism", attention_backward_determinism, "notebook 09", 30),
    Probe("adamw_fused_vs_foreach_one_step", adamw_fused_vs_foreach_one_step, "notebook 09", 30),
    Probe("memory_cap_finder_repeatability", memory_cap_finder_repeatability, "notebook 03", 120),
    Probe("ddp_vs_dp_inputs", ddp_vs_dp_inputs, "notebook 06", 60),
    Probe("reduce_overhead_training_step", reduce_overhead_training_step, "notebook 09", 180),
)
PROBE_NAMES = tuple(probe.name for probe in PROBES)


# ------------------------------------------------------------------ running them


def entry(probe: Probe, status: str, seconds: float = 0.0, **fields: Any) -> Result:
    """A probe's record entry (schema: ``probes`` in ``records/schema.json``)."""
    return {
        "name": probe.name,
        "finding": probe.finding,
        "status": status,
        "seconds": round(max(0.0, seconds), 2),
        "result": fields.get("result"),
        "verdict": fields.get("verdict"),
        "error": fields.get("error"),
    }


def run_probe(probe: Probe, device: Any, limit_s: float) -> Result:
    """Run one probe in a daemon thread, at most ``limit_s``: its entry, ``ok`` (figures
    and verdict), ``error`` (what it raised) or ``timeout`` (the thread is left behind)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = probe.run(device)
        except BaseException as error:  # recorded, never raised: the run goes on
            outcome["error"] = f"{type(error).__name__}: {error}"[:400]
            outcome["trace"] = traceback.format_exc()[-1200:]

    start = time.monotonic()
    thread = threading.Thread(target=target, name=f"probe-{probe.name}", daemon=True)
    thread.start()
    thread.join(limit_s)
    seconds = time.monotonic() - start
    if thread.is_alive():
        return entry(probe, "timeout", seconds, error=f"stopped after its limit of {limit_s:.0f} s")
    if "error" in outcome:
        return entry(probe, "error", seconds, error=outcome["error"])
    result = json.loads(json.dumps(outcome["result"], default=str))  # JSON-able
    verdict = result.pop("verdict", None) if isinstance(result, dict) else None
    if not isinstance(result, dict):
        result = {"value": result}
    return entry(probe, "ok", seconds, result=result, verdict=verdict)


def run_probes(
    probes: Sequence[Probe],
    device: Any,
    budget_s: float,
    save: Callable[[list[Result]], None] = lambda entries: None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Result]:
    """Every probe in turn within ``budget_s``; ``save(entries)`` after each. ``device``
    ``None``: no GPU, every probe skipped. Probes that no longer fit are ``not run``."""
    deadline = clock() + budget_s
    entries: list[Result] = []
    for probe in probes:
        left = deadline - clock()
        if device is None:
            entries.append(entry(probe, "skipped", error="skipped: no GPU"))
        elif left < MIN_PROBE_S:
            entries.append(entry(probe, "not run", error=f"not run: {max(0, left):.0f} s left"))
        else:
            entries.append(run_probe(probe, device, min(probe.limit_s, left)))
        save(entries)
        if entries[-1]["status"] == "timeout":  # its thread runs on, with its memory cap
            break  # in force: the next probes run in a fresh process (probe_step)
    return entries


def gpu_device() -> Any:
    """The CUDA device the probes use, or ``None`` when this torch has no usable GPU
    (asked without starting CUDA)."""
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    from course_utils.device import cuda_gpu_count

    if cuda_gpu_count() == 0:
        return None
    # lazy: a probe imports what it probes when it runs (torch, CUDA, its helper)
    import torch

    return torch.device("cuda", 0)


def write_entries(entries: list[Result], path: Path) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)


def probe_command(out: Path, budget_s: float, only: Sequence[str] = ()) -> list[str]:
    """The child process that runs the probes (``only``: these; replaced in tests)."""
    command = [sys.executable, "-m", "course_utils.tooling.gpu_probes", "--out", str(out)]
    return (
        command + ["--budget-s", f"{budget_s:.0f}"] + (["--only", ",".join(only)] if only else [])
    )


def probe_step(out: Path, limit_s: float) -> list[Result]:
    """``gpu-record``'s probe step: run :data:`PROBES` in a child process within
    ``limit_s`` and return their entries. The child stops at a probe past its limit (its
    thread would run on beside the next probes, its memory cap in force: review finding
    G13), and the probes after it run in a fresh child. A probe a child did not finish (it
    was killed at ``limit_s``, or it crashed) is ``timeout`` or ``error``, the rest
    ``not run``."""
    start = time.monotonic()
    env = {**os.environ, "COURSE_PROGRESS": "off", "MPLBACKEND": "Agg"}
    entries: list[Result] = []
    problem: str | None = None
    part = out.with_suffix(out.suffix + ".part")
    while problem is None:
        left = [probe.name for probe in PROBES if probe.name not in {e["name"] for e in entries}]
        remaining = limit_s - (time.monotonic() - start)
        if not left or (entries and remaining < MIN_PROBE_S):  # the first always runs
            break
        budget = max(1.0, remaining - 5)
        command = probe_command(part, budget, left) if entries else probe_command(part, budget)
        part.unlink(missing_ok=True)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=remaining, env=env
            )
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
                problem = f"the probes' process failed (exit {done.returncode}): {lines[-1][:200]}"
        except subprocess.TimeoutExpired:
            problem = f"the probes' process was stopped at {limit_s:.0f} s"
        found: list[Result] = []
        if part.is_file():
            try:
                found = json.loads(part.read_text(encoding="utf-8"))
            except ValueError:
                found = []
        entries += found
        write_entries(entries, out)
        if not found and problem is None:
            problem = "the probes' process wrote no result"
    part.unlink(missing_ok=True)
    done_names = {found["name"] for found in entries}
    left_probes = [probe for probe in PROBES if probe.name not in done_names]
    if left_probes and problem is not None:  # the probe running when it stopped, the rest
        seconds = time.monotonic() - start - sum(found["seconds"] for found in entries)
        status = "timeout" if "stopped" in problem else "error"
        entries.append(entry(left_probes[0], status, seconds, error=problem))
        entries += [
            entry(probe, "not run", error="not run: " + problem) for probe in left_probes[1:]
        ]
    elif left_probes:
        entries += [entry(p, "not run", error="not run: no time left") for p in left_probes]
    write_entries(entries, out)
    return entries


def run_from_command_line(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tooling.gpu_probes")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of entries")
    parser.add_argument("--budget-s", type=float, default=600.0)
    parser.add_argument("--only", help="probe names, comma-separated (default: all)")
    args = parser.parse_args(argv)
    wanted = args.only.split(",") if args.only else list(PROBE_NAMES)
    unknown = sorted(set(wanted) - set(PROBE_NAMES))
    if unknown:
        print(f"error: unknown probe(s) {', '.join(unknown)}: use {', '.join(PROBE_NAMES)}")
        return 2
    probes = [probe for probe in PROBES if probe.name in wanted]
    entries = run_probes(
        probes, gpu_device(), args.budget_s, save=lambda found: write_entries(found, args.out)
    )
    for found in entries:
        print(f"{found['name']}: {found['status']} {found['verdict'] or found['error'] or ''}")
    return 0


if __name__ == "__main__":
    code = run_from_command_line()
    sys.stdout.flush()
    os._exit(code)  # a probe thread past its limit may still be running: do not wait for it
