"""The grader's guard inside a grading kernel: each check runs where the learner's code
cannot change its verdict, and what was tampered with is reported (docs/instructor-guide.md,
"Threat model").

:func:`arm` is the kernel's first cell, before any learner code runs. It reads (and
deletes) the grader's instructions file, records what the checks depend on (the course's
modules, ``builtins``, ``math``, ``torch`` and the notebook's imports: every attribute, the
code of every function, the attributes of their classes and of ``torch.Tensor``), and
installs an audit hook (:func:`sys.addaudithook`: it cannot be removed). A check then runs
when a cell raises the audit event ``course.guard`` (``"check"``, grade id, nonce): the hook
itself runs the instructor's check code, compiled at arming, in a copy of the notebook's
namespace: no IPython input or AST transformer, exception handler or event hook sees it,
and a trace or profile function left on is cleared first. Before and after, it compares
everything recorded with what is there now, and checks that the names the check reads
still refer to what the instructor's imports bound; while the check runs, it watches for
functions' code being replaced, trace functions set, the check's frames inspected and raw
memory access (``ctypes``). Its verdict goes to the grader over a pipe, signed with a key
only the hook holds: a check counts only when the grader sees that signed verdict, so
learner code that stops, skips or kills the check scores it 0.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import importlib
import json
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

#: The audit event a grading cell raises to run a check.
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
    "course_utils.classroom",
)
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_CODE_ATTRIBUTES = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_GC_EVENTS = frozenset({"gc.get_referrers", "gc.get_referents", "gc.get_objects"})
_CTYPES_EVENTS = frozenset({"ctypes.cdata", "ctypes.PyObj_FromPtr", "ctypes.string_at"})
_WATCHED_EVENTS = frozenset(
    {
        EVENT,
        "object.__setattr__",
        "object.__getattr__",
        "sys.settrace",
        "sys.setprofile",
        "sys._getframe",
        "sys.addaudithook",
        *_GC_EVENTS,
        *_CTYPES_EVENTS,
    }
)
#: Attributes the kernel itself rebinds while it runs a cell (ipykernel's input()).
_VOLATILE = frozenset({"builtins.input", "builtins._"})
_MISSING = object()
_MESSAGE_CHARS = 2000  # characters of an error message sent back


def sign(key: bytes, payload: str) -> str:
    """The line the guard writes for ``payload``: its HMAC-SHA256, a space, the payload.

    >>> sign(b"k", "{}")[:8], sign(b"k", "{}")[64:]
    ('add853b1', ' {}')
    """
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest() + " " + payload


def read_signed(key: bytes, line: str) -> dict[str, Any] | None:
    """The message of a signed line, or None when its signature is not the key's."""
    mac, _, payload = line.partition(" ")
    expected = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, expected):
        return None
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


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
_LIBRARIES = tuple(
    {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    | {p + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
)


def _is_code(value: Any) -> bool:
    """Whether an attribute is code (a function, class, module or method), not data."""
    return callable(value) or isinstance(
        value, types.ModuleType | property | classmethod | staticmethod
    )


def _from_library(value: Any) -> bool:
    """Whether ``value`` is a Python function defined in an installed package's file."""
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    filename = str(getattr(code, "co_filename", ""))
    return filename.startswith(_LIBRARIES) and os.path.isfile(filename)


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
                if new is value or f"{name}.{attribute}" in _VOLATILE:
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

    def __init__(self, spec: dict[str, Any], shell: Any) -> None:
        self.key = bytes.fromhex(spec["key"])
        self.fd = os.open(spec["channel"], os.O_WRONLY)
        self.write: Callable[[int, bytes], int] = os.write
        self.shell = shell
        self.user_ns: dict[str, Any] = shell.user_ns
        self.at_arm = dict(self.user_ns)
        self.settrace, self.setprofile = sys.settrace, sys.setprofile
        self.gettrace, self.getprofile = sys.gettrace, sys.getprofile
        self.getframe = sys._getframe
        self.threading_vars = vars(threading)
        self.builtins = dict(vars(builtins))
        self.record = _Record()
        self.lazy: list[str] = []
        for name in [*CORE_MODULES, *spec.get("modules", [])]:
            top = name.split(".")[0]
            if top == "sys":  # its hooks are checked one by one; the rest is the kernel's state
                continue
            if name in sys.modules or top in sys.stdlib_module_names or top == "course_utils":
                try:
                    self.record.add_module(name, importlib.import_module(name))
                except Exception:
                    continue
            else:
                self.lazy.append(name)  # recorded at the first check after the notebook imports it
        self.checks: dict[str, dict[str, Any]] = {}
        transform = _ipython_transform()
        for grade_id, check in spec.get("checks", {}).items():
            entry = dict(check)
            try:
                entry["code"] = compile(transform(check["source"]), f"<check {grade_id}>", "exec")
            except SyntaxError as error:
                entry["code"] = error
            self.checks[grade_id] = entry
        self.pins: dict[str, Any] = {}
        self.shell_state = self._shell_state()
        self.flags: set[str] = set()
        self.running: list[str] | None = None  # the problems of the check running now
        self.check_frame: Any = None
        self.busy = False
        classroom = sys.modules.get("course_utils.classroom")
        spy_maker = getattr(getattr(classroom, "record_tensor_to", None), "__wrapped__", None)
        self.allowed_setters = {getattr(spy_maker, "__code__", None)}

    # -- reporting --------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        line = sign(self.key, json.dumps(message)) + "\n"
        data = line.encode()
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

    # -- what the learner may have changed ---------------------------------------------
    def _shell_state(self) -> dict[str, Any]:
        shell = self.shell
        kernel = getattr(shell, "kernel", None)
        classes = [k for owner in (shell, kernel) for k in type(owner).__mro__ if k is not object]
        return {
            "input_transformers_cleanup": list(getattr(shell, "input_transformers_cleanup", [])),
            "input_transformers_post": list(getattr(shell, "input_transformers_post", [])),
            "ast_transformers": list(getattr(shell, "ast_transformers", [])),
            "events": {k: list(v) for k, v in getattr(shell.events, "callbacks", {}).items()},
            "custom_exceptions": getattr(shell, "custom_exceptions", ()),
            "classes": {id(k): (k, dict(vars(k))) for k in classes},
            "instance": {id(o): (o, set(vars(o))) for o in (shell, kernel) if o is not None},
        }

    def _notebook_changes(self) -> list[str]:
        """Changes to how cells run. Checks run outside IPython, so these cannot change a
        score: they are reported, not scored."""
        found: list[str] = []
        before, shell = self.shell_state, self.shell
        for name in ("input_transformers_cleanup", "input_transformers_post", "ast_transformers"):
            now = list(getattr(shell, name, []))
            if [id(t) for t in now] != [id(t) for t in before[name]]:
                found.append(f"IPython's {name} were changed (they rewrite later cells)")
        events = {k: list(v) for k, v in getattr(shell.events, "callbacks", {}).items()}
        for event, callbacks in events.items():
            added = [
                c for c in callbacks if all(c is not old for old in before["events"].get(event, []))
            ]
            if any(_defined_in_notebook(c, self.user_ns) for c in added):
                found.append(f"a function was registered for IPython's {event} event")
        if getattr(shell, "custom_exceptions", ()) != before["custom_exceptions"]:
            found.append("a custom exception handler was set (set_custom_exc)")
        for klass, attributes in before["classes"].values():
            if any(vars(klass).get(k, _MISSING) is not v for k, v in attributes.items()):
                found.append(f"a method of IPython's {klass.__name__} was replaced")
        for owner, names in before["instance"].values():
            for name in set(vars(owner)) - names:
                if callable(vars(owner)[name]) and hasattr(type(owner), name):
                    found.append(f"IPython's {type(owner).__name__}.{name} was replaced")
        if _defined_in_notebook(self._excepthook(), self.user_ns):
            found.append("sys.excepthook was replaced")
        return found

    def _excepthook(self) -> Any:
        """The notebook's sys.excepthook: IPython swaps in its own while it runs a cell and
        keeps the notebook's as ``sys_excepthook``."""
        return getattr(self.shell, "sys_excepthook", sys.excepthook)

    def _names(self, check: dict[str, Any]) -> list[str]:
        """Names the check reads that no longer refer to what the instructor bound."""
        found: list[str] = []
        for name, (module, attribute) in check.get("pinned", {}).items():
            expected = self._pin(name, module, attribute)
            value = self.user_ns.get(name, _MISSING)
            if expected is not _MISSING and value is not _MISSING and value is not expected:
                what = module if attribute is None else f"{module}.{attribute}"
                found.append(f"the name {name} no longer refers to {what}")
        for name in check.get("builtins", []):
            value = self.user_ns.get(name, _MISSING)
            original = self.at_arm.get(name, self.builtins.get(name, _MISSING))
            if value is not _MISSING and value is not original:
                found.append(f"the name {name} no longer refers to Python's built-in {name}")
        return found

    def _pin(self, name: str, module: str, attribute: str | None) -> Any:
        if name not in self.pins:
            self._record_lazy()
            record = self.record.modules.get(module)
            if record is None:
                return _MISSING  # not recorded before learner code: nothing to compare with
            if attribute is None:
                self.pins[name] = record[0]
            else:
                self.pins[name] = record[1].get(attribute, _MISSING)
                if self.pins[name] is _MISSING and f"{module}.{attribute}" in self.record.modules:
                    self.pins[name] = self.record.modules[f"{module}.{attribute}"][0]
        return self.pins[name]

    def _record_lazy(self) -> None:
        for name in [n for n in self.lazy if n in sys.modules]:
            self.lazy.remove(name)
            self.record.add_module(name, sys.modules[name])

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

    # -- running a check ----------------------------------------------------------------
    def run_check(self, grade_id: str, nonce: str) -> None:
        check = self.checks.get(grade_id)
        if check is None or self.running is not None:
            return
        for change in self._notebook_changes():
            self.tampered(change)
        problems: list[str] = []
        for trace in self._traces():
            self.tampered(trace)
        problems += self._names(check) + self.record.changes()
        self.running = problems
        before = dict(self.user_ns)
        namespace = dict(before)
        ename = evalue = ""
        try:
            code = check["code"]
            if isinstance(code, SyntaxError):
                raise code
            self.check_frame = code
            exec(code, namespace)
        except BaseException as error:
            ename = type(error).__name__
            try:
                evalue = str(error)[:_MESSAGE_CHARS]
            except BaseException:
                evalue = "(its message could not be read)"
        finally:
            self.check_frame = None
        problems += self._names(check) + self.record.changes()
        for trace in self._traces():
            problems.append(trace.replace("was left on", "was set during the check"))
        self.running = None
        problems = list(dict.fromkeys(problems))
        for name, value in namespace.items():  # what the check defined stays defined
            if before.get(name, _MISSING) is not value and name != "__builtins__":
                self.user_ns[name] = value
        self.send(
            {
                "kind": "result",
                "nonce": nonce,
                "ename": ename,
                "evalue": evalue,
                "tampering": problems,
            }
        )

    # -- the audit hook -----------------------------------------------------------------
    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _WATCHED_EVENTS or self.busy:
            return
        self.busy = True
        try:
            self._event(event, args)
        except Exception:
            pass
        finally:
            self.busy = False
        if event == EVENT and args[:1] == ("check",) and len(args) == 3:
            self.run_check(str(args[1]), str(args[2]))

    def _event(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "object.__setattr__" and len(args) >= 2:
            target, name = args[0], args[1]
            recorded = self.record.functions.get(id(target))
            if name in _CODE_ATTRIBUTES and recorded is not None and recorded[0] is target:
                self.tampered(f"the {name} of {recorded[1]} was replaced")
            elif (
                isinstance(target, type)
                and id(target) in self.record.classes
                and self._caller_code() not in self.allowed_setters
            ):
                self.tampered(f"{target.__qualname__}.{name} was set")
        elif event in ("sys.settrace", "sys.setprofile") and self.running is not None:
            self.tampered(f"{event} was called while the check ran")
        elif event in _GC_EVENTS and self._from_notebook():
            self.tampered(f"{event} was called: it reaches any object, the grader's own included")
        elif event in _CTYPES_EVENTS and self._from_notebook():
            self.flag(f"{event}: the notebook's code read or wrote raw memory (ctypes)")
        elif event == "sys.addaudithook":
            self.tampered("an audit hook was added (sys.addaudithook)")
        elif (
            self.running is not None
            and (
                event == "sys._getframe"
                or (event == "object.__getattr__" and args[1:2] and args[1] in _FRAME_ATTRIBUTES)
            )
            and self._from_notebook()
        ):
            self.tampered("the notebook's code inspected the running check's frames")

    def _caller_code(self) -> Any:
        frame = self.getframe(3)
        return frame.f_code if frame is not None else None

    def _from_notebook(self) -> bool:
        """Whether the code that raised the event (past ``inspect``'s helpers) is the
        notebook's: a function defined in a cell, or a cell itself."""
        frame: Any = self.getframe(3)  # 0: this, 1: _event, 2: hook, 3: the caller
        while frame is not None and frame.f_globals.get("__name__") == "inspect":
            frame = frame.f_back
        return frame is not None and frame.f_globals is self.user_ns


def _defined_in_notebook(function: Any, user_ns: dict[str, Any]) -> bool:
    target = getattr(function, "__func__", function)
    return getattr(target, "__globals__", None) is user_ns or not getattr(
        getattr(target, "__code__", None), "co_filename", "<"
    ).startswith(("/", "<frozen"))


def _ipython_transform() -> Callable[[str], str]:
    """A fresh IPython cell transformer (magics to calls), not the shell's own lists."""
    try:
        # lazy: IPython exists only in a kernel; the doctests of this module run without it
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return lambda source: source
    return TransformerManager().transform_cell


def arm(path: str) -> None:
    """Arm the guard from the grader's instructions file at ``path`` (deleted here):
    ``key`` (hex), ``channel`` (the pipe), ``checks`` (grade id: ``source``, ``pinned``
    names, ``builtins`` names) and ``modules`` to record. The grading kernel's first cell."""
    with open(path, encoding="utf-8") as file:
        spec = json.load(file)
    os.unlink(path)
    # lazy: a grading kernel always has IPython; importing this module need not
    from IPython import get_ipython

    guard = _Guard(spec, get_ipython())
    sys.addaudithook(guard.hook)
    guard.send({"kind": "armed", "modules": sorted(guard.record.modules)})
