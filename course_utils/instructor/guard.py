"""The guard of the learner's runtime in the grader (:mod:`course_utils.instructor.judge`):
what was tampered with is reported, and the course's instruments are verified before a
check observes the answer (docs/instructor-guide.md, "Threat model").

The judge is a fresh Python process the grader starts for each submission; it is not the
learner's Jupyter kernel, and no IPython machinery runs cells in it. It decides no verdict
and holds no key: every check is decided by the grader's checker
(:mod:`course_utils.instructor.checker`), from plain data. :func:`arm` runs in the judge
before any learner code: it records what the checks' observing halves rely on (the
course's modules, ``course_utils.checks.evidence``, ``builtins``, ``math``, ``torch`` and the
notebook's imports: every attribute, the code of every function, the attributes of their
classes and of ``torch.Tensor``) and installs an audit hook (:func:`sys.addaudithook`: no
Python code can remove it). The guard module is then taken out of ``sys.modules``: only
the hook holds the guard.

At the place of each check (the audit event ``course.guard``, ``"apart"``, raised by the
judge's own loop), the hook reports as flags what differs from the record. When the
checker asks for evidence, the judge forks a child to observe the answer; there the hook
(``"observe"``) compares everything recorded with what is there now, and refuses
(``PermissionError``) when anything changed: the check then fails, its changes flagged.
The hook also refuses (raises ``PermissionError``) what would let learner code reach the
guard or the course's instruments while they observe: frames (``sys._getframe``,
``sys._current_frames``, ``tb_frame``/``gi_frame``), ``gc``'s object walks, ``/proc/*/mem``,
another audit hook, and replacing the code of a recorded function or an attribute of the
guard's class. Its lines to the grader (``armed``, ``at`` a cell, ``flag``, ``done``) are
plain JSON written by C functions captured at import: a learner could write such lines too,
so the grader takes them for what they are, advice on time and flags for review; no line
of the judge's can give a point.
"""

from __future__ import annotations

import _json  # C: a learner cannot patch what it computes
import builtins
import importlib
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

#: The audit event the judge raises to run a check.
EVENT = "course.guard"
#: Modules every check relies on, recorded whatever the notebook imports.
CORE_MODULES = (
    "builtins",
    "math",
    "operator",
    "functools",
    "statistics",
    "numbers",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.testing",
    "course_utils",
    "course_utils.checks.core",
    "course_utils.checks.boundary",
)
#: The package of the checks' observing halves: each of its modules is recorded (what runs
#: with the answer, verified before and after each observation).
EVIDENCE_PACKAGE = "course_utils.checks.evidence"
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
_CODE_ATTRIBUTES = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__globals__"})
_GC_EVENTS = frozenset({"gc.get_referrers", "gc.get_referents", "gc.get_objects"})
_FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys._current_exceptions"})
_WATCHED_EVENTS = frozenset(
    {
        EVENT,
        "object.__setattr__",
        "object.__delattr__",
        "object.__getattr__",
        "sys.settrace",
        "sys.setprofile",
        "sys.addaudithook",
        "open",
        *_FRAME_EVENTS,
        *_GC_EVENTS,
    }
)
#: Library code that may walk frames or objects on a learner's behalf for its own use:
#: it gives no frame back (``inspect``, ``logging`` and ``traceback`` do: not listed).
_TRUSTED_CALLERS = frozenset(
    {"collections", "typing", "enum", "dataclasses", "warnings", "functools", "abc",
     "importlib", "torch", "lightning", "pytorch_lightning", "lightning_fabric",
     "torchmetrics", "numpy", "IPython", "course_utils", "copy", "pickle", "threading"}
)  # fmt: skip
_MISSING = object()
_MESSAGE_CHARS = 2000  # characters of an error message sent back
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Where installed code lives: the Python installation, the course package and every site
#: folder on ``sys.path`` when the guard is imported, before any learner code (an
#: environment may lend another's site folder through a ``.pth`` file). Read-only in the
#: sandbox.
_INSTALLED = (
    sys.prefix,
    sys.base_prefix,
    sys.exec_prefix,
    *[p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))],
)
_LIBRARIES = tuple(
    {os.path.realpath(p) + os.sep for p in _INSTALLED}
    | {p.rstrip(os.sep) + os.sep for p in _INSTALLED}
    | {_PACKAGE_DIR, os.path.realpath(_PACKAGE_DIR) + os.sep}
)
#: Captured when this module is imported, before any learner code (a C function).
_QUOTE = _json.encode_basestring_ascii


def encode_message(message: dict[str, Any]) -> str:
    """JSON for a message of strings, numbers and lists of strings, written with C
    functions only (a learner's ``json.dumps = ...`` changes nothing).

    >>> encode_message({"kind": "flag", "what": ["a", 'b"']})
    '{"kind":"flag","what":["a","b\\\\""]}'
    """
    parts = []
    for name, value in message.items():
        if type(value) is list:
            text = "[" + ",".join([_QUOTE(str(item)) for item in value]) + "]"
        elif type(value) is int or type(value) is float:  # a share of the points
            text = repr(value)
        else:
            text = _QUOTE(str(value))
        parts.append(_QUOTE(name) + ":" + text)
    return "{" + ",".join(parts) + "}"


def _function_state(function: Any) -> tuple[Any, ...]:
    """What decides what a Python function does, as object identities."""
    closure = getattr(function, "__closure__", None) or ()
    contents: list[int | None] = []
    for cell in closure:
        try:
            contents.append(id(cell.cell_contents))
        except ValueError:  # an empty cell
            contents.append(None)
    kwdefaults = function.__kwdefaults__
    return (
        id(function.__code__),
        id(function.__defaults__),
        id(kwdefaults),
        tuple(map(id, kwdefaults.values())) if kwdefaults else (),
        id(function.__globals__),
        tuple(contents),
    )


#: Modules where any change is tampering; elsewhere a library may wrap its own functions
#: (importing lightning wraps ``torch.compile``): a replacement defined in an installed
#: package's file is accepted there.
_STRICT = ("course_utils", "builtins", "math")


def _is_code(value: Any) -> bool:
    """Whether an attribute is code (a function, class, module or method), not data."""
    return callable(value) or isinstance(
        value, types.ModuleType | property | classmethod | staticmethod
    )


def _all_code(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and every code object nested in it (its functions, comprehensions)."""
    found = [code]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found += _all_code(constant)
    return found


def _library_file(filename: str) -> bool:
    return filename.startswith(_LIBRARIES) and os.path.isfile(filename)


def _from_library(value: Any) -> bool:
    """Whether ``value`` is a Python function defined in an installed package's file."""
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    return _library_file(str(getattr(code, "co_filename", "")))


def _evidence_modules() -> list[str]:
    """The modules of :data:`EVIDENCE_PACKAGE` the checks' own modules imported (each
    deciding module imports its observing half; a notebook's judge imports no other
    notebook's, nor what those need, such as Lightning)."""
    return sorted(
        name for name in list(sys.modules)
        if name == EVIDENCE_PACKAGE or name.startswith(EVIDENCE_PACKAGE + ".")
    )  # fmt: skip


def _unwrapped(function: Any) -> list[Any]:
    """``function`` and the functions it wraps (``functools.wraps``' ``__wrapped__``)."""
    found = [function]
    inner = vars(function).get("__wrapped__") if hasattr(function, "__dict__") else None
    while isinstance(inner, types.FunctionType) and inner not in found and len(found) < 8:
        found.append(inner)
        inner = vars(inner).get("__wrapped__")
    return found


def _describe(module: str, name: str) -> str:
    return name if module == "builtins" else f"{module}.{name}"


class _Record:
    """Identities of what checks depend on, taken before any learner code ran."""

    def __init__(self) -> None:
        self.modules: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.functions: dict[int, tuple[Any, str, tuple[Any, ...]]] = {}
        self.classes: dict[int, tuple[type, str, dict[str, Any], set[str]]] = {}

    def add_module(self, name: str, module: types.ModuleType) -> None:
        if name in self.modules:
            return
        attributes = {k: v for k, v in vars(module).items() if _is_code(v)}
        self.modules[name] = (module, attributes)
        for attribute, value in attributes.items():
            where = _describe(name, attribute)
            if isinstance(value, types.FunctionType):
                self.functions[id(value)] = (value, where, _function_state(value))
            elif isinstance(value, type) and getattr(value, "__module__", "") == name:
                self.add_class(value, where)
        if name == "torch":
            self.add_class(module.Tensor, "torch.Tensor")

    def add_class(self, cls: type, where: str) -> None:
        for klass in cls.__mro__:
            if klass is object or id(klass) in self.classes:
                continue
            attributes = {k: v for k, v in vars(klass).items() if _is_code(v)}
            name = where if klass is cls else klass.__qualname__
            self.classes[id(klass)] = (klass, name, attributes, set(vars(klass)))
            for name, value in attributes.items():
                if isinstance(value, types.FunctionType):
                    state = _function_state(value)
                    self.functions[id(value)] = (value, f"{where}.{name}", state)

    def changes(self, limit: int = 5) -> list[str]:
        """What differs now from what was recorded (the first ``limit`` differences)."""
        found: list[str] = []
        for name, (module, attributes) in self.modules.items():
            if sys.modules.get(name, module) is not module:
                found.append(f"the module {name} was replaced in sys.modules")
            now, strict = vars(module), name.split(".")[0] in _STRICT
            for attribute, value in attributes.items():
                new = now.get(attribute, _MISSING)
                if new is value:
                    continue
                if strict or not _from_library(new):
                    found.append(f"{_describe(name, attribute)} was replaced or deleted")
                    if len(found) >= limit:
                        return found
        for klass, where, attributes, keys in self.classes.values():
            now = vars(klass)
            for attribute, value in attributes.items():
                new = now.get(attribute, _MISSING)
                if new is not value and not _from_library(new):
                    found.append(f"{where}.{attribute} was replaced or deleted")
            for attribute in now.keys() - keys:
                inherited = next(
                    (vars(b)[attribute] for b in klass.__mro__[1:-1] if attribute in vars(b)),
                    now[attribute],  # new, not over an inherited one
                )
                if inherited is not now[attribute] and not _from_library(now[attribute]):
                    found.append(f"{where}.{attribute} was added over the inherited one")
            if len(found) >= limit:
                return found[:limit]
        for function, where, state in self.functions.values():
            if _function_state(function) != state:
                found.append(f"the code, defaults or globals of {where} were changed")
                if len(found) >= limit:
                    return found
        return found


class _Guard:
    """The state behind the audit hook (only the hook holds a reference to it)."""

    def __init__(self, spec: dict[str, Any], namespace: dict[str, Any], fd: int) -> None:
        self.fd = fd
        self.write: Callable[[int, bytes], int] = os.write
        self.namespace = namespace
        self.settrace, self.setprofile = sys.settrace, sys.setprofile
        self.gettrace, self.getprofile = sys.gettrace, sys.getprofile
        self.getframe = sys._getframe
        self.threading_vars = vars(threading)
        self.builtins_module = builtins
        self.builtins = dict(vars(builtins))
        self.record = _Record()
        for name in [*CORE_MODULES, *spec.get("modules", []), *_evidence_modules()]:
            if name.split(".")[0] == "sys":  # its hooks are checked one by one
                continue
            try:  # imported now, before any learner code, and recorded
                self.record.add_module(name, importlib.import_module(name))
            except Exception:
                continue
        self.checks: dict[str, dict[str, Any]] = {}
        #: The code of the course's observing halves (nested code too), while one runs in a
        #: child forked to observe: a frame is theirs by identity, never by a file name
        #: learner code could also give ``compile``.
        self.check_code: set[int] = set()
        self.runner: Any = None
        self.observer: Any = None
        #: The frozen standard modules' globals (``<frozen importlib._bootstrap>``), kept
        #: alive so that their ids stay theirs: installed code too.
        self.frozen = [
            vars(module)
            for module in list(sys.modules.values())
            if getattr(getattr(module, "__spec__", None), "origin", None) == "frozen"
        ]
        self.frozen_ids = {id(space) for space in self.frozen}
        for grade_id, check in spec.get("checks", {}).items():
            entry: dict[str, Any] = {"builtins": list(check.get("builtins", [])), "pins": {}}
            for name, (module, attribute) in check.get("pinned", {}).items():
                value = self._pinned(module, attribute)
                if value is not _MISSING:
                    entry["pins"][name] = value
            self.checks[grade_id] = entry
        self.flags: set[str] = set()
        self.running: list[str] | None = None  # what was tampered with while observing
        #: Torch's mode stacks' depths (C functions, captured before any learner code).
        torch_c = getattr(sys.modules.get("torch"), "_C", None)
        self.mode_stacks = [
            (count, what)
            for name, what in (("_len_torch_function_stack", "function"),
                               ("_len_torch_dispatch_stack", "dispatch"))
            if callable(count := getattr(torch_c, name, None))
        ]  # fmt: skip
        self.busy = False
        #: The course's own code (recorded now, wrapped functions too): it may set a
        #: recorded class's attribute (a spy on ``Tensor.to``) or swap a course helper's
        #: code for a refusal and back, where learner code may not.
        self.course_code = {
            id(code)
            for function, where, _ in self.record.functions.values()
            if where.startswith("course_utils")
            for inner in _unwrapped(function)
            for code in _all_code(inner.__code__)
        }
        self.observing_code = {
            id(code)
            for function, where, _ in self.record.functions.values()
            if where.startswith("course_utils.checks.evidence")
            for inner in _unwrapped(function)
            for code in _all_code(inner.__code__)
        }

    def _pinned(self, module: str, attribute: str | None) -> Any:
        record = self.record.modules.get(module)
        if record is None:
            return _MISSING
        if attribute is None:
            return record[0]
        value = record[1].get(attribute, _MISSING)
        if value is _MISSING:
            value = vars(record[0]).get(attribute, _MISSING)  # data, not code
        if value is _MISSING and f"{module}.{attribute}" in self.record.modules:
            value = self.record.modules[f"{module}.{attribute}"][0]
        return value

    # -- reporting --------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        data = (encode_message(message) + "\n").encode()
        while data:
            written = self.write(self.fd, data)
            data = data[written:]

    def flag(self, what: str) -> None:
        """Report ``what`` without scoring anything 0."""
        if what not in self.flags:
            self.flags.add(what)
            self.send({"kind": "flag", "what": what})

    def tampered(self, what: str) -> None:
        """Report ``what``; while a check runs, it also scores that check 0."""
        if self.running is not None:
            if what not in self.running:
                self.running.append(what)
            return
        self.flag(what)

    def _rebound(self, check: dict[str, Any]) -> list[str]:
        """Names the check reads that the learner's code rebound (the check does not see
        those bindings: it gets the instructor's)."""
        found: list[str] = []
        for name, value in check["pins"].items():
            mine = self.namespace.get(name, _MISSING)
            if mine is not _MISSING and mine is not value:
                what = getattr(value, "__name__", name)
                module = getattr(value, "__module__", None)
                if isinstance(value, types.ModuleType):
                    found.append(f"the name {name} no longer refers to {what}")
                else:
                    found.append(f"the name {name} no longer refers to {module}.{what}")
        for name in check["builtins"]:
            mine = self.namespace.get(name, _MISSING)
            if mine is not _MISSING and mine is not self.builtins.get(name, _MISSING):
                found.append(f"the name {name} no longer refers to Python's built-in {name}")
        if self.namespace.get("__builtins__", builtins) not in (builtins, vars(builtins)):
            found.append("the notebook's __builtins__ were replaced")
        return found

    def _traces(self) -> list[str]:
        found = []
        if self.gettrace() is not None:
            found.append("a trace function (sys.settrace) was left on")
        if self.getprofile() is not None:
            found.append("a profile function (sys.setprofile) was left on")
        for hook in ("_trace_hook", "_profile_hook"):
            if self.threading_vars.get(hook) is not None:
                found.append(f"threading.set{hook[1:-5]} was called (it traces new threads)")
                self.threading_vars[hook] = None
        self.busy = True
        try:  # cleared: the check runs without them (their setting is reported)
            self.settrace(None)
            self.setprofile(None)
        finally:
            self.busy = False
        return found

    def _modes(self) -> list[str]:
        """Torch's function and dispatch mode stacks, when not empty: a mode the learner's
        code left on would see, and could change, every torch call the observing half
        makes (its counters, its spies' tensors)."""
        found = []
        for count, what in self.mode_stacks:
            try:
                depth = count()
            except Exception:
                continue
            if depth:
                found.append(f"a torch {what} mode was left on ({depth} on the stack)")
        return found

    def observation_problems(self, stage: str) -> list[str]:
        """In a child forked to observe the answer (:func:`course_utils.instructor.judge.
        _observe`), before it (``observe``) and after (``observed``): what was changed of
        what the guard recorded, a trace or profile function on (then cleared), and what
        the hook saw tampered with while the observing half ran. Any of it: the
        observation is not the course's."""
        if stage == "observe":
            found = [*self._traces(), *self._modes(), *self.record.changes()]
            self.running, self.check_code = [], self.observing_code
        else:
            found = [*(self.running or []), *self._modes(), *self.record.changes()]
            found += [t.replace("was left on", "was set while observing") for t in self._traces()]
            self.running = None
        return list(dict.fromkeys(found))

    # -- running a check ----------------------------------------------------------------
    def inspect(self, grade_id: str) -> None:
        """At the place of a check graded apart (by the checker, which the learner's code
        cannot reach): what was tampered with is reported, as flags only."""
        check = self.checks.get(grade_id)
        if check is None or self.running is not None:
            return
        for what in [*self._rebound(check), *self._traces(), *self.record.changes()]:
            self.flag(what)

    # -- the audit hook -----------------------------------------------------------------
    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _WATCHED_EVENTS or self.busy:
            return
        self.busy = True
        try:
            refused = self._event(event, args)
        except Exception:
            refused = ""
        finally:
            self.busy = False
        if refused:
            raise PermissionError(f"the grader does not allow this while it grades: {refused}")
        what = args[0] if event == EVENT and len(args) == 3 else None
        if what in ("observe", "observed") and self.getframe(1).f_code is self.observer:
            found = self.observation_problems(what)
            if found:  # the child forked to observe the answer refuses to: it says why
                raise PermissionError("\n".join(["tampered", *found]))
            return
        if what is None or self.getframe(1).f_code is not self.runner:  # a learner's audit
            return
        if what == "apart":
            self.inspect(str(args[1]))
        elif what == "at":  # where the judge is (advice on time: learner code could say it too)
            self.send({"kind": "at", "cell": str(args[1])})
        elif what == "done":
            self.send({"kind": "done"})

    def _event(self, event: str, args: tuple[Any, ...]) -> str:
        """What the event does that is refused ("" when it is allowed); reports it."""
        if event in ("object.__setattr__", "object.__delattr__") and len(args) >= 2:
            target, name = args[0], args[1]
            if target is _Guard or target is _Record:
                self.tampered("the grader's guard was patched")
                return "patching the grader's guard"
            recorded = self.record.functions.get(id(target))
            if (
                name in _CODE_ATTRIBUTES
                and recorded is not None
                and recorded[0] is target
                and id(self._caller_code()) not in self.course_code
            ):
                self.tampered(f"the {name} of {recorded[1]} was replaced")
                return f"replacing the {name} of {recorded[1]}"
            if (
                isinstance(target, type)
                and id(target) in self.record.classes
                and id(self._caller_code()) not in self.course_code
            ):
                self.tampered(f"{target.__qualname__}.{name} was set")
        elif event == "object.__getattr__" and args[1:2] and args[1] in _FRAME_ATTRIBUTES:
            if self._learner_asked():
                self.tampered("the notebook's code inspected the running check's frames (refused)")
                return f"reading .{args[1]}"
        elif event in _FRAME_EVENTS:
            if self._learner_asked():
                self.tampered(f"the notebook's code inspected the running check's frames ({event})")
                return event
        elif event in _GC_EVENTS:
            if self._learner_asked():
                self.tampered(f"{event} was called: it reaches any object, the grader's own too")
                return event
        elif event in ("sys.settrace", "sys.setprofile") and self.running is not None:
            self.tampered(f"{event} was called while the check ran")
        elif event == "sys.addaudithook":
            self.tampered("an audit hook was added (sys.addaudithook)")
            return "adding an audit hook"
        elif event == "open" and args and _is_memory_file(args[0]):
            self.tampered("the notebook's code opened a process's memory")
            return "opening a process's memory"
        return ""

    def _caller_code(self) -> Any:
        frame = self.getframe(3)
        return frame.f_code if frame is not None else None

    def _library_frame(self, frame: Any) -> bool:
        return _library_file(frame.f_code.co_filename) or id(frame.f_globals) in self.frozen_ids

    def _learner_asked(self) -> bool:
        """Whether learner code asked for what raised the event: its caller (past
        ``inspect``) is learner code; or, while a check runs, library code that has learner
        code further up before any trusted library or the check's own code. Outside a
        check no check frame exists: library code (``typing``, ``traceback`` on torch's
        behalf, ``logging``) may walk frames then."""
        frame: Any = self.getframe(3)  # 0: this, 1: _event, 2: hook, 3: the caller
        while frame is not None and _module_name(frame) == "inspect":
            frame = frame.f_back
        if frame is None:
            return False
        if not self._library_frame(frame):
            return id(frame.f_code) not in self.check_code
        if self.running is None:
            return False
        while frame is not None:  # logging.currentframe, traceback.walk_stack, ...
            if id(frame.f_code) in self.check_code:
                return False
            if not self._library_frame(frame):
                return True
            if _module_name(frame).split(".")[0] in _TRUSTED_CALLERS:
                return False  # a trusted library asked (it gives no frame back)
            frame = frame.f_back
        return False


def _module_name(frame: Any) -> str:
    """The module a frame runs in, read so that no learner code runs (a dict subclass's
    ``get``, a str subclass's ``__eq__``): "" when it is not a plain string."""
    name = dict.get(frame.f_globals, "__name__")
    return str.__str__(name) if type(name) is str else ""


def _is_memory_file(path: Any) -> bool:
    text = os.fsdecode(path) if isinstance(path, str | bytes) else ""
    return text.startswith("/proc/") and text.rstrip("/").endswith(("/mem", "/pagemap"))


def _ipython_transform() -> Callable[[str], str]:
    """A fresh IPython cell transformer (magics to calls), not a shell's own lists."""
    try:
        # lazy: the doctests of this module run without IPython
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return lambda source: source
    return TransformerManager().transform_cell


def arm(spec: dict[str, Any], namespace: dict[str, Any], fd: int, observer: Any = None) -> None:
    """Arm the guard in the judge, before any learner code: ``spec`` has ``checks`` (grade
    id: ``pinned`` names, ``builtins`` names; never their source) and ``modules`` to record;
    ``namespace`` is where the learner's cells run; ``fd`` the pipe to the grader;
    ``observer`` the code of the judge's function that forks an observing child (only it
    may ask for the instruments to be verified). Afterwards only the audit hook holds the
    guard."""
    guard = _Guard(spec, namespace, fd)
    guard.runner = sys._getframe(1).f_code  # only this code (the judge's loop) says where it is
    guard.observer = observer  # only this code asks for the instruments to be verified
    spec.clear()  # what the guard was told lives on only inside it
    sys.addaudithook(guard.hook)
    guard.send({"kind": "armed", "modules": sorted(guard.record.modules)})
    package = sys.modules.get("course_utils.instructor")
    for name in ("guard", "judge"):
        sys.modules.pop(f"course_utils.instructor.{name}", None)
        if package is not None:
            vars(package).pop(name, None)
