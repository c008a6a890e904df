"""Progress for long helpers (sweeps, finders, comparisons): :func:`track`, or
:func:`task` / :func:`tracked` advanced by :func:`tick`.

``COURSE_PROGRESS`` (``bar``, ``line`` or ``off``) decides what shows; unset: a bar
(``tqdm.auto``) in Jupyter or at a terminal, one line at the end elsewhere (logs,
``make course``), nothing under pytest or ``COURSE_WORKLOAD=small``. A task inside
another shows a nested bar and no line of its own.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tqdm.auto import tqdm

ENV_VAR = "COURSE_PROGRESS"
_MODES = ("bar", "line", "off")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def mode() -> str:
    """``bar``, ``line`` or ``off``: how progress shows here (see the module's doc)."""
    chosen = os.environ.get(ENV_VAR, "").strip().lower()
    if chosen and chosen not in _MODES:
        raise ValueError(f"{ENV_VAR}={chosen!r}: expected one of {', '.join(_MODES)}")
    small = os.environ.get("COURSE_WORKLOAD", "").strip().lower() == "small"
    if chosen or small or "PYTEST_CURRENT_TEST" in os.environ or "pytest" in sys.modules:
        return chosen or "off"
    # An IPython kernel (Jupyter, Colab, VS Code), where tqdm.auto draws a widget?
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    jupyter = shell is not None and "IPKernelApp" in getattr(shell, "config", {})
    try:
        terminal = bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        terminal = False
    return "bar" if jupyter or terminal else "line"


@dataclass
class _Task:
    """One piece of long work: its count, and its bar in ``bar`` mode."""

    description: str
    total: int | None
    unit: str
    count: int = 0
    start: float = field(default_factory=time.perf_counter)
    bar: Any = None

    def update(self, steps: int = 1) -> None:
        self.count += steps
        if self.bar is not None:
            self.bar.update(steps)


_active: list[_Task] = []


@contextmanager
def task(description: str, *, total: int | None = None, unit: str = "step") -> Iterator[_Task]:
    """A task for the duration of the ``with`` block; :func:`tick` advances it. In ``line``
    mode it ends with ``sweep: 3 of 9 sizes in 1.2 s`` (``of``: only when it stopped early)."""
    current, nested, shown = _Task(description, total, unit), bool(_active), mode()
    if shown == "bar":
        leave = not nested
        current.bar = tqdm(total=total, desc=description, unit=f" {unit}", leave=leave)
    _active.append(current)
    try:
        yield current
    finally:
        _active.remove(current)
        if current.bar is not None:
            current.bar.close()
        elif shown == "line" and not nested:
            done = str(current.count) + ("" if total in (None, current.count) else f" of {total}")
            seconds = time.perf_counter() - current.start
            print(f"{description}: {done} {unit}s in {seconds:.1f} s", file=sys.stderr)


def tick(steps: int = 1) -> None:
    """Advance the innermost task begun by :func:`task` or :func:`tracked` (none: nothing)."""
    if _active:
        _active[-1].update(steps)


def track(
    items: Iterable[T], description: str, *, total: int | None = None, unit: str = "step"
) -> Iterator[T]:
    """Yield ``items``, advancing a task by one per item (``total`` defaults to
    ``len(items)`` when it has one). Breaking out of the loop ends the task."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with task(description, total=total, unit=unit) as current:
        for item in items:
            yield item
            current.update()


def tracked(description: str, *, unit: str = "step") -> Callable[[F], F]:
    """Run the decorated function inside a :func:`task` (for work that :func:`tick` s)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _active and _active[-1].description == description:  # the same work, called
                return function(*args, **kwargs)  # from inside itself: one task counts all
            with task(description, unit=unit):
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
