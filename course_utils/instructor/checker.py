"""The checker: the process that decides the verdict of each check graded *apart* from
the learner's code (docs/instructor-guide.md, "Threat model").

Each submission is graded by two processes. The learner's runtime
(:mod:`course_utils.instructor.judge`, sandboxed, guarded) runs every code cell in order;
at the place of a check graded apart it runs nothing of the check: it serves this
checker's requests until the checker says the check is over. The checker is a child the
grader forks from itself (:func:`start`): it never runs learner code, and only it holds
the checks' source (hidden tests included). For each check it compiles the instructor's
code and fills a fresh namespace with the names that code reads
(:func:`names_read`, every nested code object's ``co_names``):

- a name the instructor's imports bind (``pinned``) is the checker's own import; a
  Python built-in is the checker's own built-in;
- any other name is asked of the learner's runtime (:func:`describe_value` there). Plain data
  crosses by value: the runtime writes it with ``torch.save``, the checker reads it with
  ``torch.load(weights_only=True)`` (a restricted unpickler: tensors, numbers, strings,
  lists, tuples, dicts, ``torch.Size``, dtypes; the course's own dataclasses, rebuilt as
  the checker's classes) and then refuses any value whose type is not exactly one of
  those (:func:`plain`): no learner class, no ``__eq__`` that lies, no Tensor subclass. A
  function or class defined in the notebook becomes an :class:`Answer` (calling it runs
  the real one in the learner's runtime; the arguments go there pickled, the result comes
  back by value as above, an exception as its class's name and message: one of
  :data:`ERRORS` is raised again as itself, anything else as :class:`AnswerError`). A
  function of an installed module the checker has imported is the checker's own. A
  module is the checker's own import of that name.

The checker writes each verdict on its own pipe to the grader, which the learner's
runtime cannot reach (no signature needed). Checks that need the answer's objects in the
same process (they watch ``Tensor.to``, fake a clock or a GPU, mutate what they pass in,
run a Trainer on the learner's class, pass closures) are marked in the instructor's
notebook with :data:`BESIDE` as their first line: they run in the learner's runtime under
the guard, as before (:mod:`course_utils.instructor.guard`).

Frames between the two processes: four bytes of length, then the bytes. The runtime's
replies are a JSON header (and, for data, the ``torch.save`` bytes): the checker never
unpickles anything the runtime sends except through the restricted unpickler.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import dataclasses
import fcntl
import importlib
import io
import json
import os
import pickle
import struct
import sys
import types
from typing import Any

#: The first line that marks a check cell graded beside the answer, in the learner's
#: runtime under the guard: ``# graded beside the answer: <why>``.
BESIDE = "# graded beside the answer:"
HEADER_BYTES = 1 << 16  # the largest reply header
DATA_BYTES = 1 << 29  # the largest value that crosses (512 MiB)
MESSAGE_CHARS = 2000  # characters of an error message kept
_LENGTH = struct.Struct(">I")


def beside(source: str) -> bool:
    """Whether a check cell is graded beside the answer (its first line is the marker).

    >>> beside("# graded beside the answer: it watches Tensor.to\\ncheck(True, '')")
    True
    >>> beside("check(True, '')")
    False
    """
    return source.lstrip().startswith(BESIDE)


class AnswerError(Exception):
    """What the learner's function raised, when it is not one of :data:`ERRORS`; or a
    result that cannot cross to the checker (its message says why)."""


class ChannelBroken(BaseException):
    """The learner's runtime broke the protocol or ended: the check stops (not an
    ``Exception``: a check's ``except Exception`` does not swallow it)."""


def _errors() -> dict[tuple[str, str], type[BaseException]]:
    found: list[type[BaseException]] = [
        ValueError, TypeError, RuntimeError, ZeroDivisionError, NotImplementedError,
        KeyError, IndexError, AssertionError, ArithmeticError, OverflowError,
        AttributeError, LookupError, MemoryError, StopIteration,
    ]  # fmt: skip
    torch = sys.modules.get("torch")
    if torch is not None:
        found += [torch.cuda.OutOfMemoryError]
    return {(error.__module__, error.__qualname__): error for error in found}


#: Exceptions raised again in the checker as themselves: (module, qualified name): class.
ERRORS = _errors()


# -- frames -------------------------------------------------------------------------------


def pipe() -> tuple[int, int]:
    """A pipe whose ends are not standard streams' numbers (a worker of a process pool
    may run with its stdin closed: a pipe end could be fd 0, and a child's stdio would
    then replace it)."""
    ends = []
    for fd in os.pipe():
        if fd < 3:
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(fd)
            fd = high
        ends.append(fd)
    return ends[0], ends[1]


def write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int, limit: int) -> bytes:
    """One frame; :class:`ChannelBroken` at the end of the pipe or past ``limit`` bytes."""
    size = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))[0]
    if size > limit:
        raise ChannelBroken(f"a frame of {size} bytes (at most {limit})")
    return _read_exactly(fd, size)


def _read_exactly(fd: int, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            raise ChannelBroken("the learner's runtime ended")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


# -- the learner's side ------------------------------------------------------------------


def describe_value(value: Any, missing: Any) -> tuple[dict[str, Any], bytes | None]:
    """In the learner's runtime: how ``value`` crosses (a header, and the data's bytes)."""
    import torch  # lazy: the doctests of this module run without torch

    tname = type(value).__name__
    if value is missing:
        return {"kind": "missing"}, None
    if isinstance(value, types.ModuleType):
        return {"kind": "module", "name": str(value.__name__)}, None
    if callable(value) and not isinstance(value, torch.Tensor):
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        header = {"kind": "callable", "type": tname}
        if type(module) is str and type(qualname) is str:
            header.update(module=module, qualname=qualname)
        return header, None
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception:
        return {"kind": "opaque", "type": tname}, None
    return {"kind": "data", "type": tname}, buffer.getvalue()


def raised(error: BaseException) -> dict[str, Any]:
    """In the learner's runtime: the header that says what a call raised."""
    kind = type(error)
    try:
        message = str(error)[:MESSAGE_CHARS]
    except BaseException:
        message = "(its message could not be read)"
    return {"kind": "raised", "module": str(getattr(kind, "__module__", "")),
            "name": str(getattr(kind, "__qualname__", "")), "message": message}  # fmt: skip


# -- the checker's side -------------------------------------------------------------------

_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _course_dataclasses() -> list[type]:
    """The course's own dataclasses, loaded in the checker: they may cross (rebuilt as
    the checker's own classes, fields checked by :func:`plain`)."""
    found = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "course_utils" or module is None:
            continue
        for value in list(vars(module).values()):
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and getattr(value, "__module__", "") == name
            ):
                found.append(value)
    return found


def plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data of exact types (a subclass is not).

    >>> plain([1, 2.0, "a", None, (True,), {"k": b"v"}])
    True
    >>> class Liar(int):
    ...     def __eq__(self, other): return True
    >>> plain([Liar(0)])
    False
    """
    if depth > 200:
        return False
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind in (list, tuple, set, frozenset):
        return all(plain(item, depth + 1) for item in value)
    if kind in (dict, collections.OrderedDict):
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if kind in (torch.Tensor, torch.nn.Parameter):
        return True
    if kind is torch.Size:
        return all(type(item) is int for item in value)
    if kind in (torch.dtype, torch.device):
        return True
    if dataclasses.is_dataclass(value) and str(kind.__module__).startswith("course_utils"):
        return all(plain(v, depth + 1) for v in vars(value).values())
    return False


class _Unavailable:
    """A name the check reads whose value cannot cross: any use says why."""

    def __init__(self, why: str) -> None:
        object.__setattr__(self, "_why", why)

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise AnswerError(object.__getattribute__(self, "_why"))

    __call__ = __getattr__ = __iter__ = __len__ = __bool__ = __getitem__ = _fail
    __eq__ = __lt__ = __gt__ = __le__ = __ge__ = __float__ = __int__ = __index__ = _fail
    __hash__ = None  # type: ignore[assignment]


class Answer:
    """A function or class of the learner's notebook, seen from the checker: calling it
    runs the real one in the learner's runtime; only plain data comes back."""

    def __init__(self, channel: Channel, name: str) -> None:
        self._channel = channel
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<your {self.__name__}>"


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:  # an Answer travels as its name
        return ("answer", obj.__name__) if type(obj) is Answer else None


class Channel:
    """The checker's end of the pipes to the learner's runtime."""

    def __init__(self, requests: int, replies: int, modules: set[str]) -> None:
        self.requests, self.replies, self.modules = requests, replies, modules
        self.safe: list[Any] = _course_dataclasses()

    def send(self, message: tuple[Any, ...]) -> None:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
        write_frame(self.requests, buffer.getvalue())

    def reply(self) -> tuple[dict[str, Any], bytes | None]:
        try:
            header = json.loads(read_frame(self.replies, HEADER_BYTES))
        except (ValueError, RecursionError) as error:
            raise ChannelBroken(f"a reply that is not JSON ({type(error).__name__})") from None
        if type(header) is not dict or type(header.get("kind")) is not str:
            raise ChannelBroken("a reply without its kind")
        blob = read_frame(self.replies, DATA_BYTES) if header["kind"] == "data" else None
        return header, blob

    def begin(self) -> str:
        """The grade id the learner's runtime says it reached."""
        header, _ = self.reply()
        if header.get("kind") != "begin" or type(header.get("grade_id")) is not str:
            raise ChannelBroken("the runtime did not start a check")
        return str(header["grade_id"])

    def end(self) -> None:
        self.send(("end",))

    def load(self, blob: bytes, what: str, tname: str) -> Any:
        import torch  # lazy: the checker has it (forked from the grader)

        refused = AnswerError(
            f"{what} a {_text(tname)}, which is not plain data (a class defined in your "
            "notebook, or a subclass): use a plain int, float, str, list, tuple, dict or "
            "torch.Tensor"
        )
        try:
            with torch.serialization.safe_globals(self.safe):
                value = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
        except Exception:
            raise refused from None
        if not plain(value):
            raise refused
        return value

    def value(self, name: str) -> Any:
        """The value of a name of the learner's notebook, as the checker may hold it."""
        self.send(("get", name))
        header, blob = self.reply()
        kind, tname = header["kind"], _text(header.get("type"))
        if kind == "missing":
            raise KeyError(name)
        if kind == "data" and blob is not None:
            try:
                return self.load(blob, f"{name} is", tname)
            except AnswerError as error:
                return _Unavailable(str(error))
        if kind == "module":
            module = self.module(_text(header.get("name")))
            if module is not None:
                return module
            return _Unavailable(
                f"the check uses the module {_text(header.get('name'))}, which only your "
                "notebook has (one it wrote?): the checker cannot import it"
            )
        if kind == "callable":
            own = self.own(header.get("module"), header.get("qualname"))
            return own if own is not None else Answer(self, name)
        return _Unavailable(
            f"the check reads {name}, a {tname} that cannot cross to the grader's checker "
            "(only plain data, functions and classes can)"
        )

    def module(self, name: str) -> Any:
        """The checker's own import of ``name``, for a package the instructor's notebook or
        the checker already imports (never one only the learner's notebook has)."""
        if name.split(".")[0] not in self.modules and name not in sys.modules:
            return None
        try:
            return importlib.import_module(name)
        except Exception:
            return None

    def own(self, module: Any, qualname: Any) -> Any:
        """The checker's own function or class ``module.qualname``, for one of a module the
        checker has imported (a library's), else None."""
        if type(module) is not str or type(qualname) is not str or module == "__main__":
            return None
        value = sys.modules.get(module)
        for part in qualname.split("."):
            value = getattr(value, part, None) if value is not None else None
        return value if callable(value) else None

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            self.send(("call", name, args, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise AnswerError(
                f"the check could not pass its arguments to {name} ({error}): a check that "
                f"passes functions or objects to the answer is graded beside it ({BESIDE})"
            ) from None
        header, blob = self.reply()
        kind, tname = header["kind"], _text(header.get("type"))
        if kind == "data" and blob is not None:
            return self.load(blob, f"{name} returned", tname)
        if kind == "raised":
            kind_of = ERRORS.get((_text(header.get("module")), _text(header.get("name"))))
            message = _text(header.get("message"))
            if kind_of is not None:
                raise kind_of(message)
            raise AnswerError(f"{name} raised {_text(header.get('name'))}: {message}")
        raise AnswerError(
            f"{name} returned a {tname}, which is not plain data (a function, a class or an "
            "object defined in your notebook?): return a plain int, float, str, list, tuple, "
            "dict or torch.Tensor"
        )


def _text(value: Any) -> str:
    return str.__str__(value)[:MESSAGE_CHARS] if type(value) is str else ""


def names_read(code: types.CodeType) -> list[str]:
    """Every name ``code`` and the code nested in it may read as a global (attribute
    names included: asking for one more name is harmless).

    >>> names_read(compile("def f():\\n    return [g(y) for y in z]\\nf()", "<c>", "exec"))
    ['f', 'g', 'z']
    """
    found: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        found.update(current.co_names)
        stack += [c for c in current.co_consts if isinstance(c, types.CodeType)]
    return sorted(found)


def _pinned(module: str, attribute: str | None) -> Any:
    try:
        value = importlib.import_module(module)
    except Exception:
        return _MISSING
    if attribute is None:
        return value
    if hasattr(value, attribute):
        return getattr(value, attribute)
    try:
        return importlib.import_module(f"{module}.{attribute}")
    except Exception:
        return _MISSING


_MISSING = object()


def run_check(channel: Channel, check: dict[str, Any]) -> dict[str, Any]:
    """Run one check in the checker; its verdict (``ename`` empty when it passed)."""
    classroom = importlib.import_module("course_utils.classroom")
    verdict: dict[str, Any] = {"ename": "", "evalue": ""}
    try:
        code = compile(check["source"], f"<check {check['grade_id']}>", "exec")
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        pinned = check.get("pinned", {})
        for name in names_read(code):
            if name in pinned:
                value = _pinned(*pinned[name])
                if value is not _MISSING:
                    namespace[name] = value
            elif name not in check.get("builtins", ()) and name != "__builtins__":
                with contextlib.suppress(KeyError):
                    namespace[name] = channel.value(name)
        exec(code, namespace)
    except ChannelBroken:
        raise
    except BaseException as error:
        verdict["ename"] = type(error).__name__ if isinstance(error, Exception) else "Stopped"
        try:
            verdict["evalue"] = str(error)[:MESSAGE_CHARS]
        except BaseException:
            verdict["evalue"] = "(its message could not be read)"
        earned = vars(error).get("earned") if type(error) is classroom.PartialCredit else None
        if type(earned) is float and 0.0 < earned < 1.0:
            verdict["earned"] = earned
    return verdict


def _serve_checks(
    checks: list[dict[str, Any]], requests: int, replies: int, verdicts: int, modules: set[str]
) -> None:
    channel = Channel(requests, replies, modules)

    def report(message: dict[str, Any]) -> None:  # one JSON line (it holds no newline)
        data = memoryview((json.dumps(message) + "\n").encode())
        while data:
            data = data[os.write(verdicts, data) :]

    for check in checks:
        try:
            reached = channel.begin()
        except ChannelBroken as error:
            if "ended" not in str(error):
                report({"kind": "flag", "what": "the notebook's code wrote on the channel "
                        f"between its process and the grader's checker ({error})"})  # fmt: skip
            return
        if reached != check["grade_id"]:
            report({"kind": "flag", "what": "the notebook's code started a check out of turn "
                    f"on the grader's checker channel ({_text(reached)[:80]!r})"})  # fmt: skip
            return
        try:
            verdict = run_check(channel, check)
        except ChannelBroken as error:
            if "ended" not in str(error):
                report({"kind": "flag", "what": "the notebook's code broke the channel "
                        f"between its process and the grader's checker ({error})"})  # fmt: skip
            return
        report({"kind": "result", "nonce": check["nonce"], **verdict})
        try:
            channel.end()
        except OSError:
            return


def prepare(modules: list[str]) -> None:
    """Import torch and the checks' modules in the grading process, where each submission's
    checker is forked from: once per process, not once per submission (~3 s each). The
    grading process runs no learner code, so what it imports is the instructor's."""
    for name in ["torch", *modules]:
        if name not in sys.modules:
            with contextlib.suppress(Exception):  # the checker reports a missing module
                importlib.import_module(name)


def start(
    checks: list[dict[str, Any]],
    modules: list[str],
    folder: str,
    threads: int | None,
    keep: tuple[int, int],
) -> tuple[int, int]:
    """Fork the checker for one submission: ``checks`` in the order the runtime reaches
    them (``grade_id``, ``nonce``, ``source``, ``pinned``, ``builtins``); ``keep`` the
    checker's ends of the pipes to the runtime (requests it writes, replies it reads).
    Returns the checker's process id and the read end of its verdicts' pipe (lines of
    JSON: ``result`` and ``flag`` messages)."""
    prepare(modules)
    read_end, write_end = pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, read_end
    try:  # the checker: it never returns
        wanted = {*keep, write_end}
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd > 2 and fd not in wanted:
                with contextlib.suppress(OSError):
                    os.close(fd)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (never closed)
        os.chdir(folder)
        sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
        os.environ.update(COURSE_WORKLOAD="small", COURSE_DEVICE="cpu", CUDA_VISIBLE_DEVICES="",
                          COURSE_PROGRESS="off", MPLBACKEND="Agg")  # fmt: skip
        import torch  # lazy: the grading worker has imported it already (a cache lookup)

        torch.set_num_threads(threads or 1)
        roots = {name.split(".")[0] for name in modules}
        for name in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        importlib.import_module("course_utils.classroom").mark_checker_process()
        _serve_checks(checks, keep[0], keep[1], write_end, roots | {"course_utils", "torch"})
    finally:
        os._exit(0)
