"""The grader's judge: the learner's runtime, where a submission's code cells run for
grading (not for the feedback's outputs). It decides no verdict and holds no key.

At the place of each check it runs nothing of the check and holds none of its source: it
serves the grader's checker (:mod:`course_utils.instructor.checker`, a process that never
runs learner code) over the pipes the grader passed (``--requests``, ``--replies``) until
the checker says the check is over: the value of a name, by value and only as plain data;
a call of a function of the notebook; or an observation (:func:`_observe`): one of the
course's observing halves (:mod:`course_utils.checks.evidence`) run on the answer in a
child forked here, whose only output is its evidence, as plain data. The checker decides
the verdict from that data. The guard reports, as flags, what was tampered with at each
check's place, and verifies the course's instruments in each observing child.

The grader starts it fresh for each submission (``python -I``: no working folder or
``PYTHONPATH`` on ``sys.path``, no user site, no start-up file), in its own sandbox when
bubblewrap works, with a fresh HOME, IPython directory and working folder of its own. It
is not the learner's Jupyter kernel: that kernel only produces the outputs of the feedback
notebook, and no check enters it.

The grader writes the program on the judge's stdin as one JSON line, read before any
learner code: the modules to record, the names each check reads that the instructor's
imports bind (for the guard's flags), and the cells: the learner's code cells that ran
without hanging or killing their kernel, and each check's place.
:func:`course_utils.instructor.guard.arm` records what the observing halves depend on and
installs its audit hook; the learner's cells run as plain Python (IPython magics through a
bare, grader-owned shell: no input transformer, event or exception handler runs anything).
Before each cell the judge says where it is (``at``), so the grader can stop a cell that
runs too long, and at the end that it is ``done``. Those lines are advice on time: learner
code could write them too, and no line of the judge's gives a point.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import pickle
import sys
from typing import Any

from course_utils.instructor import checker


def _shell() -> Any:
    """A bare IPython shell for magics (``!cmd``, ``%%writefile``) in the learner's cells:
    it loads no profile, start-up file or extension and runs no cell itself."""
    try:
        # lazy: IPython is optional, and loads only when the judge runs
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        return None
    return InteractiveShell.instance(colors="nocolor", autocall=0)


class _Refs(pickle.Unpickler):
    """Unpickles the checker's requests (the grader's own process: trusted here); an
    :class:`~course_utils.instructor.checker.Answer` comes back as the notebook's name."""

    def __init__(self, data: bytes, namespace: dict[str, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.namespace = namespace

    def persistent_load(self, pid: Any) -> Any:
        return self.namespace[pid[1]]


def _serve(namespace: dict[str, Any], requests: int, replies: int, grade_id: str) -> None:
    """At the place of a check graded apart: answer the checker's requests (the value of
    a name, a call of a function of the notebook) until it says the check is over."""

    def reply(header: dict[str, Any], blob: bytes | None = None) -> None:
        checker.write_frame(replies, json.dumps(header).encode())
        if blob is not None:
            checker.write_frame(replies, blob)

    missing = object()
    reply({"kind": "begin", "grade_id": grade_id})
    while True:
        try:
            request = _Refs(checker.read_frame(requests, 1 << 30), namespace).load()
        except checker.ChannelBroken:
            os._exit(0)  # the checker ended: nothing more can be graded
        except Exception as error:  # a name the check passes that the notebook no longer has
            reply(checker.raised(error))
            continue
        if request[0] == "end":
            return
        if request[0] == "get":
            reply(*checker.describe_value(namespace.get(request[1], missing), missing))
            continue
        if request[0] == "observe":
            for frame in _observe(request[1], request[2], request[3], request[4]):
                checker.write_frame(replies, frame)
            continue
        try:
            _, name, args, kwargs = request
            result = namespace[name](*args, **kwargs)
        except BaseException as error:  # what the answer raised goes back as text
            reply(checker.raised(error))
            continue
        try:
            reply(*checker.describe_value(result, missing))
        except BaseException as error:
            reply(checker.raised(error))


#: The most an observation's reply may hold (its header's frame and its data's).
_OBSERVED_BYTES = checker.HEADER_BYTES + checker.DATA_BYTES + 16


def _observe(module: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bytes]:
    """The frames of the reply to an ``observe`` request: the evidence of ``module.name``
    (an observing half of :mod:`course_utils.checks`) on these arguments, gathered in a
    child forked from this runtime. No thread of the learner's and no timer survives the
    fork; the child resets every signal handler, closes the pipes to the grader and to the
    checker, lets the guard verify the course's instruments (their changes fail the check,
    as ``tampered``), runs the observing half, and writes only its result, as plain data,
    on a pipe of its own. A child that ends without a whole reply is ``ended``."""
    import signal  # lazy: only an observation needs it

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a forked child cannot use it
        why = "CUDA was initialized before the fork"
        return [json.dumps({"kind": "ended", "why": why}).encode()]
    read_end, write_end = checker.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: it never returns
        try:
            for number in signal.valid_signals():
                if number not in (signal.SIGKILL, signal.SIGSTOP):
                    with contextlib.suppress(OSError, ValueError, RuntimeError):
                        signal.signal(number, signal.SIG_DFL)
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd > 2 and fd != write_end:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if torch is not None:
                torch.set_num_threads(1)  # the parent's OpenMP pool is not the child's
            gc.freeze()  # the runtime's objects: a collection here neither scans nor copies them
            try:
                sys.audit(_EVENT, "observe", "", "")  # the guard verifies the instruments
                function = getattr(importlib.import_module(module), name)
                function = getattr(function, "__wrapped__", function)  # the observing half
                try:
                    value = function(*args, **kwargs)
                    header, blob = checker.describe_value(value, _MISSING)
                except BaseException as error:
                    header, blob = checker.raised(error), None
                sys.audit(_EVENT, "observed", "", "")  # and what was done to them meanwhile
            except PermissionError as found:
                text = str(found)
                if not text.startswith("tampered\n"):
                    raise
                what = [line for line in text.split("\n")[1:] if line]
                header, blob = {"kind": "tampered", "what": what}, None
            if header["kind"] not in ("data", "raised", "tampered"):
                header, blob = {"kind": "opaque"}, None
            checker.write_frame(write_end, json.dumps(header).encode())
            if blob is not None:
                checker.write_frame(write_end, blob)
        finally:
            os._exit(0)
    os.close(write_end)
    frames: list[bytes] = []
    try:
        while True:
            try:
                frame = checker.read_frame(read_end, _OBSERVED_BYTES)
            except checker.ChannelBroken:
                break
            frames.append(frame)
    finally:
        os.close(read_end)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        try:
            _, status = os.waitpid(pid, 0)
        except OSError:
            status = 0
    if frames and _whole(frames):
        return frames
    why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no result"
    return [json.dumps({"kind": "ended", "why": why}).encode()]


def _whole(frames: list[bytes]) -> bool:
    """Whether ``frames`` are one whole reply: a JSON header, and data's blob after it."""
    try:
        header = json.loads(frames[0])
    except (ValueError, RecursionError):
        return False
    if type(header) is not dict:
        return False
    return len(frames) == (2 if header.get("kind") == "data" else 1)


_MISSING = object()
_EVENT = "course.guard"


def run_judge(argv: list[str]) -> None:
    fd = int(argv[argv.index("--fd") + 1])
    requests = int(argv[argv.index("--requests") + 1]) if "--requests" in argv else -1
    replies = int(argv[argv.index("--replies") + 1]) if "--replies" in argv else -1
    spec = json.loads(sys.stdin.readline())
    sys.stdin.close()
    cells: list[dict[str, Any]] = spec.pop("cells")
    # lazy: imported after the spec is read, so the guard records them as they are
    import course_utils.checks.core  # noqa: F401  (recorded by the guard)
    from course_utils.instructor import guard

    shell = _shell()
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {"__name__": "__main__"}
    transform = guard._ipython_transform()
    event = guard.EVENT
    guard.arm(spec, namespace, fd, observer=_observe.__code__)
    del guard, spec
    for number, cell in enumerate(cells):
        sys.audit(event, "at", str(number), "")  # the guard says it (advice on time)
        if cell["kind"] == "apart":
            sys.audit(event, "apart", cell["grade_id"], "")  # the guard's findings: flags
            _serve(namespace, requests, replies, cell["grade_id"])
            continue
        try:
            code = compile(transform(cell["source"]), f"<cell {number + 1}>", "exec")
            exec(code, namespace)
        except BaseException:  # a cell that raises does not stop the run
            pass
    sys.audit(event, "done", "", "")
    sys.stdout.flush()
    os._exit(0)  # threads the learner's code left running do not keep the judge alive


if __name__ == "__main__":
    run_judge(sys.argv[1:])
