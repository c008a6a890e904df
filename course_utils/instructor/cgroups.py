"""A control group per sandbox: the memory, processes and CPU of everything a sandboxed
kernel or judge starts, counted together (rlimits count one process at a time).

Made where this process may (root, or a delegated cgroup v2 tree): cgroup v2
(``memory.max``, ``pids.max``, ``cpu.max``) or the v1 ``memory``, ``pids`` and ``cpu``
hierarchies. :func:`join_command` is a prefix that moves the command into a new group
before it starts (so every process it makes is in it); :func:`collect` says which limits
the groups made since the last call hit, ends what is left in them and removes them.
Where no group can be made, both do nothing and the sandbox's rlimits stand alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

ROOT = Path("/sys/fs/cgroup")
_made: list[tuple[list[Path], Any]] = []


def _version() -> int:
    """2 or 1 when this process can make groups here, else 0."""
    if (ROOT / "cgroup.controllers").is_file():
        return 2 if os.access(ROOT, os.W_OK) else 0
    needed = [ROOT / name for name in ("memory", "pids", "cpu")]
    return 1 if all(os.access(path, os.W_OK) for path in needed) else 0


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def _make(limits: Any) -> list[Path]:
    """New groups with the limits set (one path for v2, one per hierarchy for v1)."""
    name = f"course-grade-{os.getpid()}-{secrets.token_hex(4)}"
    version = _version()
    period = 100_000
    quota = str(max(1000, int(limits.cpus * period)))
    try:
        if version == 2:
            with contextlib.suppress(OSError):
                (ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            group = ROOT / name
            group.mkdir()
            _write(group / "memory.max", str(limits.memory_bytes))
            _write(group / "memory.swap.max", "0")
            _write(group / "pids.max", str(limits.processes))
            _write(group / "cpu.max", f"{quota} {period}")
            return [group]
        if version == 1:
            groups = [ROOT / hierarchy / name for hierarchy in ("memory", "pids", "cpu")]
            for group in groups:
                group.mkdir()
            _write(groups[0] / "memory.limit_in_bytes", str(limits.memory_bytes))
            _write(groups[1] / "pids.max", str(limits.processes))
            _write(groups[2] / "cpu.cfs_period_us", str(period))
            _write(groups[2] / "cpu.cfs_quota_us", quota)
            return groups
    except OSError:
        return []
    return []


def join_command(limits: Any) -> list[str]:
    """A command prefix that puts what follows in new groups with ``limits``: memory
    (``memory_bytes`` in all), processes (``processes``), CPU (``cpus`` cores); [] where
    no group can be made."""
    procs = join_files(limits)
    if not procs:
        return []
    script = (
        'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f"; shift; done; shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", *map(str, procs), "--"]


def join_files(limits: Any) -> list[Path]:
    """New groups with ``limits`` (collected by :func:`collect_hits`): the files a process
    writes its own id to, to enter them (every process it then makes is in them too); []
    where no group can be made."""
    groups = _make(limits)
    if groups:
        _made.append((groups, limits))
    return [group / "cgroup.procs" for group in groups]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _hits(groups: list[Path], limits: Any) -> list[str]:
    """What limits the groups' processes ran into."""
    memory = f"{limits.memory_bytes / 2**30:g} GiB"
    found = []
    if len(groups) == 1:  # v2
        events = dict(
            line.split() for line in _read(groups[0] / "memory.events").splitlines() if " " in line
        )
        if int(events.get("oom_kill", 0) or 0) or int(events.get("max", 0) or 0):
            found.append(f"it reached the sandbox's memory limit ({memory} in all)")
        pids = _read(groups[0] / "pids.events")
        if "max" in pids and pids.split()[-1] != "0":
            found.append(f"it reached the sandbox's limit of {limits.processes} processes")
    else:
        if (_read(groups[0] / "memory.failcnt").strip() or "0") != "0":
            found.append(f"it reached the sandbox's memory limit ({memory} in all)")
        pids = _read(groups[1] / "pids.events")
        if pids.strip() and pids.split()[-1] != "0":
            found.append(f"it reached the sandbox's limit of {limits.processes} processes")
    return found


def collect_hits() -> list[str]:
    """The limits hit in the groups made since the last call; their processes are ended
    and the groups removed."""
    found: list[str] = []
    while _made:
        groups, limits = _made.pop()
        found += [hit for hit in _hits(groups, limits) if hit not in found]
        for _ in range(50):
            pids = {p for g in groups for p in _read(g / "cgroup.procs").split()}
            for pid in pids:
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            if all(_remove(g) for g in groups):
                break
            time.sleep(0.02)
    return found


def sweep() -> int:
    """Remove the empty groups that grading processes which have ended left behind (a
    grader killed before :func:`collect`); their processes are not touched. How many."""
    removed = 0
    for hierarchy in (ROOT, ROOT / "memory", ROOT / "pids", ROOT / "cpu"):
        for group in hierarchy.glob("course-grade-*-*") if hierarchy.is_dir() else []:
            pid = group.name.split("-")[2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists() and _remove(group):
                removed += 1
    return removed


def _remove(group: Path) -> bool:
    try:
        group.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
