"""The grader's judge: the process that decides a submission's scores.

The grader starts it fresh for each submission (``python -I``: no working folder or
``PYTHONPATH`` on ``sys.path``, no user site, no start-up file), in its own sandbox when
bubblewrap works, with a fresh HOME, IPython directory and working folder of its own. It
is not the learner's Jupyter kernel: that kernel only produces the outputs of the feedback
notebook, and neither the checks nor the key ever enter it.

The grader writes the program on the judge's stdin as one JSON line, read before any
learner code: the key, the checks (hidden parts included), the modules to record, and the
cells: the learner's code cells that ran without hanging or killing their kernel, and at
each check's place, the check. :func:`course_utils.instructor.guard.arm` then records
what checks depend on and installs its audit hook; the learner's cells run as plain Python
(IPython magics through a bare, grader-owned shell: no input transformer, event or
exception handler runs anything); each check runs through the hook, which writes its
signed verdict on the pipe the grader passed (``--fd``). Before each cell the judge says
where it is (``at``), so the grader can stop a cell that runs too long.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _shell() -> Any:
    """A bare IPython shell for magics (``!cmd``, ``%%writefile``) in the learner's cells:
    it loads no profile, start-up file or extension and runs no cell itself."""
    try:
        # lazy: IPython is optional, and loads only when the judge runs
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        return None
    return InteractiveShell.instance(colors="nocolor", autocall=0)


def run_judge(argv: list[str]) -> None:
    fd = int(argv[argv.index("--fd") + 1])
    spec = json.loads(sys.stdin.readline())
    sys.stdin.close()
    cells: list[dict[str, Any]] = spec.pop("cells")
    # lazy: imported after the spec is read, so the guard records them as they are
    import course_utils.classroom  # noqa: F401  (recorded by the guard)
    from course_utils.instructor import guard

    shell = _shell()
    namespace: dict[str, Any] = shell.user_ns if shell is not None else {"__name__": "__main__"}
    transform = guard._ipython_transform()
    event = guard.EVENT
    guard.arm(spec, namespace, fd)
    del guard, spec
    for number, cell in enumerate(cells):
        os.write(fd, f"at {number}\n".encode())
        if cell["kind"] == "check":
            sys.audit(event, "check", cell["grade_id"], cell["nonce"])
            continue
        try:
            code = compile(transform(cell["source"]), f"<cell {number + 1}>", "exec")
            exec(code, namespace)
        except BaseException:  # a cell that raises does not stop the run
            pass
    os.write(fd, b"done\n")
    sys.stdout.flush()
    os._exit(0)  # threads the learner's code left running do not keep the judge alive


if __name__ == "__main__":
    run_judge(sys.argv[1:])
