"""The bubblewrap (``bwrap``) sandbox a grading kernel runs in (docs/instructor-guide.md, 6).

The kernel and its processes get no network, one writable scratch folder (plus a private,
capped ``/tmp`` and ``/dev/shm``), read-only views of the system, Python, the environment
and the course package only (never other submissions, instructor notebooks or grades),
their own PID namespace and ``setrlimit`` limits. As root, the kernel switches to an
unused uid (``UID_BASE + the grader's pid``: root is exempt from ``RLIMIT_NPROC``); as a
user, ``RLIMIT_NPROC`` counts all that user's processes, so the limit adds those running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import site
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

if __name__ != "__main__":  # the launcher, run as a script in the sandbox, needs none of it
    from course_utils.instructor import cgroups
    from course_utils.language import catalog_folders

UID_BASE = 2_000_000_000
#: The course package (course_utils/), bound read-only into the sandbox.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Limits:
    """What one sandboxed process may use. (Numbers, not ``units``: the launcher runs this
    file as a script inside the sandbox, where only the standard library is importable.)"""

    memory_bytes: int = 4 * 2**30  # RLIMIT_DATA per process; the sandbox's total (cgroup)
    processes: int = 512  # RLIMIT_NPROC: processes and threads (and the cgroup's pids.max)
    file_bytes: int = 2**30  # RLIMIT_FSIZE: the largest file it may write
    tmpfs_bytes: int = 256 * 2**20  # the size of the private /tmp and /dev/shm, each
    scratch_bytes: int = 2**30  # the size of the working folder (a tmpfs): all it may write
    cpu_seconds: int = 3600  # RLIMIT_CPU: CPU time of one process
    cpus: float = 1.0  # the sandbox's share of the CPU (cgroup), in cores


@dataclass(frozen=True)
class Sandbox:
    """How to start a command inside bubblewrap; ``hidden``: host paths to keep out of
    sight even if they sit under a folder the sandbox shows (submissions, notebooks)."""

    bwrap: str
    limits: Limits = Limits()
    hidden: tuple[str, ...] = field(default=())
    #: 0 for a learner's kernel, 1 for the grader's judge: each has its own user id.
    role: int = 0

    def user_id(self) -> int | None:
        """The user id the sandboxed process switches to (root only), else None: one per
        grading process and role (PIDs are below 2**22)."""
        return UID_BASE + self.role * 2**22 + os.getpid() if os.geteuid() == 0 else None

    def prepare(self, control: Path, *files: Path) -> None:
        """Give the process's control folder (its start-up folders, connection file and
        sockets) and files it must read to the sandbox's user."""
        uid = self.user_id()
        os.chmod(control, 0o700)
        if uid is not None:
            for path in (control, *control.rglob("*"), *files):
                os.chown(path, uid, uid)

    def environment(self, scratch: Path, course: dict[str, str]) -> dict[str, str]:
        """A clean environment: none of the grader's variables (tokens, keys) leak in."""
        bin_dir = str(Path(sys.executable).parent)
        return {
            "PATH": os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            "IPYTHONDIR": str(scratch / ".ipython"),
            "MPLCONFIGDIR": str(scratch / ".matplotlib"),
            "XDG_CACHE_HOME": str(scratch / ".cache"),
            "JUPYTER_RUNTIME_DIR": str(scratch / ".jupyter"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(_PACKAGE_DIR.parent),
            **course,
        }

    def command(self, argv: list[str], scratch: Path, control: Path | None = None) -> list[str]:
        """``argv`` wrapped: a cgroup of its own when one can be made, bubblewrap, then the
        limits and the user switch, then argv. ``scratch`` (the working folder) is a fresh
        tmpfs of ``scratch_bytes`` inside; ``control``, the grader's folder for this process
        (connection file, sockets), is the one folder shared with the grader."""
        binds, uid, size = _read_only_binds(), self.user_id(), str(self.limits.tmpfs_bytes)
        options = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        options += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        if uid is not None:  # the launcher needs these two to drop to its own user id
            options += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            options += ["--unshare-user"]
        options += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                options += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                options += ["--ro-bind", top, top]
        # The private /tmp first, then the binds: a checkout (its .venv) or a scratch
        # folder that lies under /tmp must stay visible on top of it.
        options += ["--proc", "/proc", "--dev", "/dev"]
        for tmp in ("/tmp", "/dev/shm"):
            options += ["--perms", "1777", "--size", size, "--tmpfs", tmp]
        shared = [str(control)] if control is not None else []
        options += _parent_dirs([d for _, d in binds] + [str(scratch), *shared])
        for source, destination in binds:
            options += ["--ro-bind", source, destination]
        options += _hide(self.hidden, binds)
        for folder in shared:
            options += ["--bind", folder, folder]
        scratch_size = str(self.limits.scratch_bytes)
        options += ["--perms", "0777", "--size", scratch_size, "--tmpfs", str(scratch)]
        options += ["--chdir", str(control or scratch)]
        processes = self.limits.processes
        if uid is None:  # RLIMIT_NPROC counts every process of this user
            processes += _tasks_of(os.getuid())
        limits = json.dumps({**asdict(self.limits), "processes": processes, "uid": uid})
        launcher = [sys.executable, "-I", str(Path(__file__).resolve()), limits]
        return [*cgroups.join_command(self.limits), self.bwrap, *options, *launcher, "--", *argv]


def _read_only_binds() -> list[tuple[str, str]]:
    """(host path, path inside) for the Python installation, the environment, the course
    package and its messages' catalogs: the kernel sees them at the paths the grader uses."""
    pairs: list[tuple[str, str]] = []
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
    python = (sys.base_prefix, sys.base_exec_prefix, sys.prefix, os.path.realpath(sys.executable))
    # site folders another environment lends this one (a .pth file pointing there)
    lent = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    # the messages' catalogs too: a check's feedback in the notebook's language
    catalogs = [str(folder) for folder in catalog_folders()]
    for path in (*python, user_site, *lent, str(_PACKAGE_DIR), *catalogs):
        real = os.path.realpath(path)
        if path and os.path.exists(real) and not real.startswith(("/usr/", "/etc/")):
            seen_as = dict.fromkeys([(real, real), (real, os.path.abspath(path))])
            pairs += [pair for pair in seen_as if pair not in pairs]
    # A bind that another one already shows (a folder inside it) is left out; the
    # others are mounted outermost first.
    kept = [
        (source, dest)
        for source, dest in pairs
        if not any(
            (source, dest) != (outer_source, outer_dest)
            and _inside(source, outer_source)
            and dest == outer_dest + source[len(outer_source) :]
            for outer_source, outer_dest in pairs
        )
    ]
    return sorted(kept, key=lambda pair: pair[1].count("/"))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _parent_dirs(paths: list[str]) -> list[str]:
    """``--dir`` for every missing parent, world-traversable (bwrap makes them 0700)."""
    options: list[str] = []
    made: set[str] = {"/", "/usr", "/etc", "/tmp"}
    for path in paths:
        for parent in map(str, reversed(Path(path).parents)):
            if parent not in made:
                made.add(parent)
                options += ["--perms", "0755", "--dir", parent]
    return options


def _hide(hidden: tuple[str, ...], binds: list[tuple[str, str]]) -> list[str]:
    """Cover hidden paths that lie under a bound folder: an empty folder, /dev/null."""
    options: list[str] = []
    for path in hidden:
        real = os.path.realpath(path)
        if not os.path.exists(real):  # nothing there to see (yet)
            continue
        for source, destination in binds:
            if _inside(real, source):
                cover = ["--tmpfs"] if os.path.isdir(real) else ["--ro-bind", "/dev/null"]
                options += [*cover, destination + real[len(source) :]]
    return options


def _tasks_of(uid: int) -> int:
    """Processes and threads of a user now (what RLIMIT_NPROC counts)."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            lines = status.read_text().splitlines()
            fields = dict(line.split(":", 1) for line in lines if ":" in line)
            if int(fields.get("Uid", "-1 ").split()[0]) == uid:
                count += int(fields.get("Threads", "1").strip() or 1)
    return count


@lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why bubblewrap cannot sandbox here, or None when it can."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    probe = [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--dev", "/dev"]
    if os.geteuid() != 0:
        probe.append("--unshare-user")
    try:
        done = subprocess.run([*probe, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap does not run: {error}"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"bwrap cannot create a sandbox here: {lines[-1] if lines else done.returncode}"
    return None


def find(mode: str, hidden: tuple[str, ...] = (), limits: Limits = Limits()) -> Sandbox | None:
    """The sandbox for ``mode`` (``auto``, ``bwrap`` or ``none``), or None: ``bwrap`` raises
    ``RuntimeError`` when bubblewrap cannot run, ``auto`` falls back to no sandbox."""
    if mode == "none":
        return None
    reason = unavailable_reason()
    if reason is None:
        return Sandbox(str(shutil.which("bwrap")), limits, hidden)
    if mode == "bwrap":
        raise RuntimeError(f"--sandbox bwrap: {reason} (Debian/Ubuntu: apt-get install bubblewrap)")
    return None


def unsandboxed_warning() -> str:
    """The one line that says submissions run without a sandbox, and why."""
    reason = unavailable_reason() or "--sandbox none was asked for"
    return (
        f"warning: submissions run UNSANDBOXED, as you, with your files and network "
        f"({reason}; install the 'bubblewrap' package to sandbox them)"
    )


def _launch(argv: list[str]) -> None:
    """Inside the sandbox: set the limits, drop to the kernel's user id, exec the kernel."""
    import resource  # lazy: platform-only (Unix); the CLI imports this module everywhere

    settings = json.loads(argv[0])
    command = argv[argv.index("--") + 1 :]
    settings["core"] = 0
    for name in (
        "DATA memory_bytes",
        "NPROC processes",
        "FSIZE file_bytes",
        "CORE core",
        "CPU cpu_seconds",
    ):
        limit, key = name.split()
        value = int(settings[key])
        resource.setrlimit(getattr(resource, f"RLIMIT_{limit}"), (value, value))
    # Inside a PID namespace the kernel's parent is PID 1: ipykernel would take that
    # for "my parent exited" and stop. bubblewrap's --die-with-parent does that job.
    os.environ.pop("JPY_PARENT_PID", None)
    uid = settings.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    os.execv(command[0], command)


if __name__ == "__main__":
    _launch(sys.argv[1:])
