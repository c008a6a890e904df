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
from typing import Any, TypeVar

from tqdm.auto import tqdm

ENV_VAR = "COURSE_PROGRESS"
MODES = ("bar", "line", "off")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def mode() -> str:
    """``bar``, ``line`` or ``off``: how progress shows here (see the module's doc)."""
    chosen = os.environ.get(ENV_VAR, "").strip().lower()
    if chosen in MODES:
        return chosen
    if chosen:
        raise ValueError(f"{ENV_VAR}={chosen!r}: expected one of {', '.join(MODES)}")
    if "PYTEST_CURRENT_TEST" in os.environ or "pytest" in sys.modules:
        return "off"
    if os.environ.get("COURSE_WORKLOAD", "").strip().lower() == "small":
        return "off"
    return "bar" if _in_jupyter() or _is_terminal(sys.stderr) else "line"


def _in_jupyter() -> bool:
    """Whether this is an IPython kernel (Jupyter, Colab, VS Code): where tqdm.auto
    draws a widget."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


class Task:
    """One piece of long work: a bar, a line at the end, or nothing (see :func:`mode`)."""

    def __init__(self, description: str, total: int | None, unit: str, nested: bool) -> None:
        self.description, self.total, self.unit = description, total, unit
        self.count = 0
        self.mode = mode()
        self.nested = nested
        self._start = time.perf_counter()
        self._bar: Any = None
        if self.mode == "bar":
            self._bar = tqdm(
                total=total, desc=description, unit=f" {unit}", leave=not nested, file=sys.stderr
            )

    def update(self, steps: int = 1) -> None:
        self.count += steps
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.mode == "line" and not self.nested:
            print(self.summary(), file=sys.stderr, flush=True)

    def summary(self) -> str:
        """``sweep: 3 of 9 sizes in 1.2 s`` (``of`` only when it stopped early)."""
        done = str(self.count)
        if self.total is not None and self.count != self.total:
            done += f" of {self.total}"
        seconds = time.perf_counter() - self._start
        return f"{self.description}: {done} {self.unit}s in {seconds:.1f} s"


_active: list[Task] = []


@contextmanager
def task(description: str, *, total: int | None = None, unit: str = "step") -> Iterator[Task]:
    """A :class:`Task` for the duration of the ``with`` block; :func:`tick` advances it."""
    current = Task(description, total, unit, nested=bool(_active))
    _active.append(current)
    try:
        yield current
    finally:
        _active.remove(current)
        current.close()


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
