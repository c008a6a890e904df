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
- any other name is asked of the learner's runtime (:func:`describe_value` there). Plain
  data crosses by value, in a format that cannot run code (:func:`encode_reply`,
  :func:`decode_reply`: a JSON description, then raw tensor bytes, every size checked against
  what was sent before anything is made; never ``pickle`` or ``torch.load``), and the
  checker refuses any value whose type is not exactly plain (:func:`plain`): no learner
  class, no ``__eq__`` that lies, no Tensor subclass. A function or class becomes an
  :class:`Answer`, whatever module and name the runtime claims for it (calling it runs the
  real one in the learner's runtime; the arguments go there pickled, the result comes
  back by value, an exception as its class's name and message: one of :data:`ERRORS` is
  raised again as itself, marked as the answer's, anything else as :class:`AnswerError`).
  A module is the checker's own import only when the instructor's notebook imports it.

The checker runs isolated (:func:`_isolate`): its own PID namespace, user id (as root),
cgroup and scratch folder. A verdict passes only as an explicit ``completed``
(:func:`verdict_of`); a failure's message is shown only when the instructor's code raised
it.

The checker writes each verdict on its own pipe to the grader, which the learner's
runtime cannot reach (no signature needed). Checks that need the answer's objects in the
learner's process (they watch ``Tensor.to``, fake a clock or a GPU, mutate what they pass
in, run a Trainer on the learner's class, pass closures) ask for *evidence*: an observing
half of :mod:`course_utils.checks.evidence` runs there, in a child forked from the
runtime at the check's place (:meth:`Channel.observe`), and returns plain data; the check's
deciding half (:mod:`course_utils.checks`) runs here. A name of the notebook whose value
cannot cross travels to an observing half by name.

Frames between the two processes: four bytes of length, then the bytes. The runtime's
replies are a JSON header (and, for data, the bytes of :func:`encode_reply`): the checker never
unpickles anything the runtime sends.
"""

from __future__ import annotations

import builtins
import contextlib
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

from course_utils.checks.data_format import (
    DATA_BYTES,
    ERRORS,
    AnswerError,
    Tampered,
    _course_dataclasses,
    encode_reply,
    load_plain,
    not_plain_message,
)
from course_utils.feedback import builtin_error

HEADER_BYTES = 1 << 16  # the largest reply header
MESSAGE_CHARS = 2000  # characters of an error message kept
_LENGTH = struct.Struct(">I")


class ChannelBroken(BaseException):
    """The learner's runtime broke the protocol or ended: the check stops (not an
    ``Exception``: a check's ``except Exception`` does not swallow it)."""


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
    """In the learner's runtime: how ``value`` crosses (a header, and the data's bytes in
    the format of :func:`encode_reply`, which cannot run code when read)."""
    import torch  # lazy: the doctests of this module run without torch

    if value is missing:
        return {"kind": "missing"}, None
    if isinstance(value, types.ModuleType):
        return {"kind": "module", "name": str(value.__name__)}, None
    if callable(value) and not isinstance(value, torch.Tensor):
        return {"kind": "callable"}, None
    try:
        blob = encode_reply(value)
    except Exception:
        return {"kind": "opaque"}, None
    return {"kind": "data"}, blob


def raised(error: BaseException) -> dict[str, Any]:
    """In the learner's runtime: the header that says what a call raised."""
    kind = type(error)
    try:
        message = str(error)[:MESSAGE_CHARS]
    except BaseException:
        message = ""
    module, name = getattr(kind, "__module__", ""), getattr(kind, "__qualname__", "")
    return {"kind": "raised", "module": module if type(module) is str else "",
            "name": name if type(name) is str else "",
            "message": message if type(message) is str else ""}  # fmt: skip


# -- the format of plain data (it cannot run code; its size is checked before decoding) --


# -- the checker's side -------------------------------------------------------------------


class _Unavailable:
    """A name the check reads whose value cannot cross: any use says why."""

    def __init__(self, why: str, name: str = "") -> None:
        object.__setattr__(self, "_why", why)
        object.__setattr__(self, "_name", name)

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
        if type(obj) is Answer:
            return ("answer", obj.__name__)
        if type(obj) is _Unavailable and object.__getattribute__(obj, "_name"):
            return ("answer", object.__getattribute__(obj, "_name"))  # the notebook's object
        return None


#: The channel of this checker process, once it serves checks: an observing half called
#: here (:func:`course_utils.checks.boundary.observed`) asks the learner's runtime for its
#: evidence over it.
CHANNEL: list[Channel | None] = [None]


class Channel:
    """The checker's end of the pipes to the learner's runtime."""

    def __init__(self, requests: int, replies: int, modules: set[str]) -> None:
        self.requests, self.replies, self.modules = requests, replies, modules
        self.safe: list[Any] = _course_dataclasses()
        #: What the answer's exceptions said during the check running now: never shown
        #: in feedback, even inside the check's own message (:func:`run_check`).
        self.learner_texts: list[str] = []

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

    def load(self, blob: bytes, what: str) -> Any:
        """The plain data in ``blob`` (:func:`decode_reply`); :class:`AnswerError` for anything
        else."""
        return load_plain(blob, what, self.safe)

    def observe(self, module: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The evidence of ``module.name`` (an observing half of :mod:`course_utils.checks`),
        run in the learner's runtime, in a process forked at the check's place, on these
        arguments: plain data only comes back (:meth:`load`). What the instruments found
        tampered with there fails the check (:class:`Tampered`)."""
        header, blob = self._request(
            ("observe", module, name, args, kwargs),
            name,
            "pass the answer, the notebook's objects and plain data only",
        )
        kind = header["kind"]
        if kind == "data" and blob is not None:
            return self.load(blob, f"the evidence of {name} holds")
        if kind == "tampered":
            found = header.get("what")
            raise Tampered([_text(t) for t in found] if type(found) is list else [])
        if kind == "raised":
            self._raise_again(header, f"your code (observed by {name})")
        if kind == "ended":
            raise AnswerError(
                f"the process that ran your code for {name} ended before it gave its result "
                f"({_text(header.get('why'))})"
            )
        raise AnswerError(not_plain_message(f"the evidence of {name} holds"))

    def _request(
        self, message: tuple[Any, ...], name: str, hint: str
    ) -> tuple[dict[str, Any], bytes | None]:
        """Send a call or an observation of ``name`` and read its reply; arguments that
        cannot be sent are an :class:`AnswerError` that says so (``hint``: what can)."""
        try:
            self.send(message)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise AnswerError(
                f"the check could not pass its arguments to {name} ({error}): {hint}"
            ) from None
        return self.reply()

    def _raise_again(self, header: dict[str, Any], name: str) -> None:
        """What the learner's code raised (``header``), raised again here, marked as the
        answer's; a class the notebook defines as :class:`AnswerError` (``name`` says
        whose)."""
        kind_of = ERRORS.get((_text(header.get("module")), _text(header.get("name"))))
        message = _text(header.get("message"))
        if message:
            self.learner_texts.append(message)
        if kind_of is not None:
            again: Any = kind_of(message)
            again.course_from_answer = True
            raise again
        library = _library_error(_text(header.get("module")), _text(header.get("name")))
        if library:
            raise AnswerError(f"{name} raised {library}")
        raise AnswerError(f"{name} raised an exception of a class your notebook defines")

    def value(self, name: str) -> Any:
        """The value of a name of the learner's notebook, as the checker may hold it: plain
        data by value; a function or class as an :class:`Answer` (it runs in the learner's
        runtime, whatever name or module the runtime says it has: the checker never turns
        a name it is told into one of its own functions); a module only when it is one the
        instructor's notebook imports."""
        self.send(("get", name))
        header, blob = self.reply()
        kind = header["kind"]
        if kind == "missing":
            raise KeyError(name)
        if kind == "data" and blob is not None:
            try:
                return self.load(blob, f"{name} is")
            except AnswerError as error:
                return _Unavailable(str(error), name)
        if kind == "module":
            module = self.module(_text(header.get("name")))
            if module is not None:
                return module
            return _Unavailable(
                f"the check uses {name} as a module the instructor's notebook does not "
                "import: the checker cannot use it",
                name,
            )
        if kind == "callable":
            return Answer(self, name)
        return _Unavailable(
            f"the check reads {name}, a value that cannot cross to the grader's checker "
            "(only plain data, functions and classes can; an observing half of "
            "course_utils.checks can take it)",
            name,
        )

    def module(self, name: str) -> Any:
        """The checker's own import of ``name``, only for a module the instructor's
        notebook imports (or the course's package, or torch), or one of their submodules
        already imported: never any other module the runtime names (``os``)."""
        allowed = name in self.modules or (
            name.split(".")[0] in self.modules and name in sys.modules
        )
        if not allowed:
            return None
        try:
            return importlib.import_module(name)
        except Exception:
            return None

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        header, blob = self._request(
            ("call", name, args, kwargs),
            name,
            "a check that passes functions or objects to the answer does so in an observing "
            "half (course_utils.checks.evidence)",
        )
        kind = header["kind"]
        if kind == "data" and blob is not None:
            return self.load(blob, f"{name} returned")
        if kind == "raised":
            self._raise_again(header, name)
        raise AnswerError(
            f"{name} returned a value that is not plain data (a function, a class or an "
            "object defined in your notebook?): return a plain int, float, str, list, tuple, "
            "dict or torch.Tensor"
        )


def _library_error(module: str, qualname: str) -> str:
    """``module.qualname`` when that names an exception class of a module this checker
    has imported (torch's, pickle's: not the notebook's, whatever name it claims), else ""."""
    found: Any = sys.modules.get(module) if module not in ("__main__", "builtins") else None
    for part in qualname.split(".") if found is not None else []:
        found = vars(found).get(part) if hasattr(found, "__dict__") else None
    if isinstance(found, type) and issubclass(found, BaseException):
        return f"{module}.{qualname}"
    return ""


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


#: The names a failed check's verdict may give (anything else is ``Error``); the grader
#: shows a message only for those the instructor's code raised.
TRUSTED_NAMES = frozenset(
    {"CheckFailed", "PartialCredit", "AssertionError", "NotImplementedError", "AnswerError",
     "NeedsBeside", "Stopped", "Error"}
)  # fmt: skip


#: The failures whose message is feedback, when the instructor's code raised them
#: (a ``NameError``'s names a name the check's own code reads).
MESSAGE_NAMES = frozenset(
    {"CheckFailed", "PartialCredit", "AssertionError", "AnswerError", "NeedsBeside", "NameError"}
)


def verdict_of(error: BaseException | None, core: Any, trusted_message: bool) -> dict[str, Any]:
    """A check's verdict: ``completed`` when ``error`` is None, else ``failed`` with a name
    from :data:`TRUSTED_NAMES` (by the exact class: a learner's class named ``CheckFailed``
    or ``""`` is ``Error``) and a message only when ``trusted_message`` (the instructor's
    code raised it) and the class is one whose message is feedback.

    >>> verdict_of(None, None, False)
    {'status': 'completed', 'ename': '', 'evalue': ''}
    >>> verdict_of(type("", (Exception,), {})("secret"), None, True)["ename"]
    'Error'
    """
    if error is None:
        return {"status": "completed", "ename": "", "evalue": ""}
    kind = type(error)
    names = {
        getattr(core, "CheckFailed", None): "CheckFailed",
        getattr(core, "PartialCredit", None): "PartialCredit",
        getattr(core, "NeedsBeside", None): "NeedsBeside",
        AssertionError: "AssertionError",
        NotImplementedError: "NotImplementedError",
        AnswerError: "AnswerError",
    }
    names.pop(None, None)
    ename = names.get(kind) or builtin_error(kind)
    ename = ename or ("Error" if isinstance(error, Exception) else "Stopped")
    evalue = ""
    if trusted_message and ename in MESSAGE_NAMES:
        try:
            text = BaseException.__str__(error)
        except BaseException:
            text = ""
        evalue = text[:MESSAGE_CHARS] if type(text) is str else ""
    return {"status": "failed", "ename": ename, "evalue": evalue}


def run_check(channel: Channel, check: dict[str, Any]) -> dict[str, Any]:
    """Run one check in the checker; its verdict (:func:`verdict_of`). No learner code runs
    here, so a message is the instructor's, except what the answer's exceptions said
    (raised again here, marked): those never reach the verdict, not even quoted inside a
    check's own message."""
    core = importlib.import_module("course_utils.checks.core")
    channel.learner_texts = []
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
    except Tampered as error:
        what = error.what or ["the course's instruments were changed"]
        return {"status": "failed", "ename": "Error", "evalue": "", "tampering": what}
    except BaseException as error:
        learners = (
            bool(vars(error).get("course_from_answer")) if hasattr(error, "__dict__") else False
        )
        verdict = verdict_of(error, core, trusted_message=not learners)
        verdict["evalue"] = without_learner_texts(verdict["evalue"], channel.learner_texts)
        earned = vars(error).get("earned") if type(error) is core.PartialCredit else None
        if type(earned) is float and 0.0 < earned < 1.0:
            verdict["earned"] = earned
        return verdict
    return verdict_of(None, core, False)


def without_learner_texts(message: str, texts: list[str]) -> str:
    """``message`` with each of ``texts`` (what the learner's code said) replaced by
    "(your code's message)": a text of a few characters only where it stands as a word of
    its own, so that a learner's ``ValueError("e")`` does not cut every "e" of the message.

    >>> without_learner_texts("double(17) failed: 17 is odd", ["17 is odd", "e"])
    "double(17) failed: (your code's message)"
    >>> without_learner_texts("raised ValueError: e", ["e"])
    "raised ValueError: (your code's message)"
    """
    import re  # lazy: only a failed check's message is read

    for text in sorted({t for t in texts if type(t) is str and t}, key=len, reverse=True):
        if len(text) >= 8:
            message = message.replace(text, "(your code's message)")
        else:
            word = rf"(?<!\w){re.escape(text)}(?!\w)"
            message = re.sub(word, lambda _: "(your code's message)", message)
    return message


def _serve_checks(
    checks: list[dict[str, Any]], requests: int, replies: int, verdicts: int, modules: set[str]
) -> None:
    channel = Channel(requests, replies, modules)
    CHANNEL[0] = channel  # evidence is asked of the learner's runtime from now on

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
    limits: Any = None,
) -> tuple[int, int]:
    """Fork the checker for one submission: ``checks`` in the order the runtime reaches
    them (``grade_id``, ``nonce``, ``source``, ``pinned``, ``builtins``); ``keep`` the
    checker's ends of the pipes to the runtime (requests it writes, replies it reads);
    ``limits`` the sandbox's (:class:`course_utils.instructor.sandbox.Limits`), or None.
    Returns the checker's process id and the read end of its verdicts' pipe (lines of
    JSON: ``result`` and ``flag`` messages). The checker runs isolated (:func:`_isolate`)."""
    from course_utils.instructor import cgroups, sandbox  # lazy: only the grader forks

    prepare(modules)
    limits = limits or sandbox.Limits()
    procs = cgroups.join_files(limits)
    read_end, write_end = pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    grader = os.getpid()
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
        stdlib = os.path.dirname(os.__file__)  # the interpreter's own modules (cProfile ...)
        own_user = os.geteuid() == 0 and _others_can_read(
            sys.prefix, sys.base_prefix, stdlib, sandbox._PACKAGE_DIR
        )
        user = sandbox.UID_BASE + 2 * 2**22 + grader if own_user else None
        os.chdir(folder)
        _isolate(folder, procs, limits, user)
        sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
        os.environ.update(COURSE_WORKLOAD="small", COURSE_DEVICE="cpu", CUDA_VISIBLE_DEVICES="",
                          COURSE_PROGRESS="off", MPLBACKEND="Agg")  # fmt: skip
        import torch  # lazy: the grading worker has imported it already (a cache lookup)

        torch.set_num_threads(threads or 1)
        roots = {name.split(".")[0] for name in modules}
        for name in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        importlib.import_module("course_utils.checks.core").mark_checker_process()
        allowed = set(modules) | roots | {"course_utils", "torch"}
        _serve_checks(checks, keep[0], keep[1], write_end, allowed)
    finally:
        os._exit(0)


_CLONE_NEWUSER, _CLONE_NEWPID = 0x10000000, 0x20000000


def _others_can_read(*paths: str | os.PathLike[str]) -> bool:
    """Whether a user other than the owner can reach each of ``paths`` (every folder above
    it searchable by others): the checker runs as its own user only then, as root, else it
    could not import what it needs (an environment under ``/root``, mode 700); it then
    keeps root's user id in a user namespace of its own, without root's powers.

    >>> _others_can_read("/")
    True
    """
    import stat  # lazy: only the forked checker, as root, asks
    from pathlib import Path  # lazy: as above

    for path in paths:
        current = Path(path).resolve()
        for folder in (current, *current.parents):
            try:
                mode = folder.stat().st_mode
            except OSError:
                return False
            if not mode & stat.S_IXOTH:
                return False
    return True


_PR_SET_PDEATHSIG = 1


def _isolate(folder: str, procs: list[Any], limits: Any, user: int | None) -> None:
    """In the forked checker, before it reads anything of the learner's: a PID namespace
    of its own (it then sees and can signal no process of the grader's: ``os.kill`` with
    any number reaches nothing outside), the cgroups ``procs`` (memory, processes), an
    unprivileged user id of its own (``user``, as root; as a user, a user namespace without
    a mapping), rlimits, and its scratch ``folder``. The process that forked stays as the
    namespace's parent and ends with the checker; the checker ends with it."""
    import ctypes  # lazy: only the forked checker needs it
    import resource
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    for path in procs:  # before the fork: the checker is in the groups from its start
        with contextlib.suppress(OSError), open(path, "w") as file:
            file.write(str(os.getpid()))
    flags = _CLONE_NEWPID | (0 if user is not None else _CLONE_NEWUSER)
    if libc.unshare(flags) == 0:
        child = os.fork()  # the first child in the new namespace: its process 1
        if child:
            with contextlib.suppress(OSError):
                os.waitpid(child, 0)
            os._exit(0)
    if user is not None:
        os.chown(folder, user, user)
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the user's change, which clears it
    counted = [(resource.RLIMIT_NPROC, limits.processes)] if user is not None else []
    for kind, value in (
        *counted,  # counted per user: only the checker's own user is fresh
        (resource.RLIMIT_DATA, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, 16 * 2**20),
        (resource.RLIMIT_CORE, 0),
    ):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(kind, (value, value))
