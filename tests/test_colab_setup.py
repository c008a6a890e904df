"""colab_setup.sh, run for real against the local checkout in fresh virtual environments.

The main fresh venv plays Colab: it already has torch (and the rest of the project's
packages) but not the course package. It sees the project venv's packages through a
``.pth`` file that names a *filtered view* of the project's site-packages: a directory of
symlinks to every entry except the course package itself (``course_utils``, its
dist-info, editable-install finders) and the ``.pth`` files. So neither the editable
install (a ``.pth`` that adds the repository root) nor a regular install of course_utils
leaks into the child, and pip does not see a course-utils installed elsewhere. (A path
line in a ``.pth`` file only appends that directory to ``sys.path``; ``.pth`` files
inside it are not processed. The view does not rely on that: it leaves them out.) Every
child runs with its working directory in ``tmp_path``, never the repository root.
The venvs are made ``--without-pip``: pip comes from the view, as it comes from the
system on Colab, which keeps venv creation well under a second.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from course_utils.tooling.colab import retarget_course

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "colab_setup.sh"
PROJECT_SITE = Path(sysconfig.get_paths()["purelib"])
ERROR_PREFIX = "colab_setup.sh: error:"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


# --- helpers -------------------------------------------------------------------------------


def _base_python() -> str:
    """The interpreter the running venv was made from (same version, so the project's
    compiled packages, torch included, load in a venv made from it)."""
    base = getattr(sys, "_base_executable", None)
    if base and Path(base).exists():
        return base
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for name in (f"python{version}", "python3"):
        candidate = Path(sys.base_prefix) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return sys.executable


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment for children: nothing that would point them at the project venv."""
    keep_pip = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k in keep_pip
        or not k.startswith(("PYTHON", "COURSE_", "PIP_", "VIRTUAL_ENV", "CONDA_PREFIX"))
    }
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


def _make_venv(path: Path, view: Path | None) -> tuple[Path, Path]:
    """A venv at ``path`` whose site-packages sees ``view`` (if given). Returns
    (python, site-packages). Skips the test when venvs cannot be made here."""
    made = subprocess.run(
        [_base_python(), "-m", "venv", "--without-pip", str(path)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"python -m venv is unavailable here: {made.stderr.strip()[-300:]}")
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    ).stdout.strip()
    site_dir = Path(site)
    if view is not None:
        (site_dir / "zz_course_test_view.pth").write_text(f"{view}\n")
    return python, site_dir


def _make_view(target: Path, source: Path, keep=lambda name: True) -> Path:
    """A directory of symlinks to ``source``'s entries, without the course package and
    without ``.pth`` files (so no editable install and no startup hooks come along)."""
    target.mkdir()
    for entry in source.iterdir():
        name = entry.name.lower()
        if "course_utils" in name or "course-utils" in name or name.endswith(".pth"):
            continue
        if keep(name):
            (target / entry.name).symlink_to(entry)
    return target


def _py(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=cwd, env=_clean_env()
    )


def _dist_version(python: Path, name: str, cwd: Path) -> str:
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError: print('')"
    )
    done = subprocess.run(
        [str(python), "-c", code, name],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_clean_env(),
        check=True,
    )
    return done.stdout.strip()


def _run_script(python: Path, cwd: Path, cache: Path, script: Path = SCRIPT, **env: str):
    """Run the script; returns (CompletedProcess, seconds)."""
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_clean_env(PYTHON=str(python), XDG_CACHE_HOME=str(cache), **env),
        timeout=300,
    )
    return done, time.perf_counter() - start


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]


def _offline_build_env() -> dict[str, str]:
    """Build the course wheel with the project's hatchling and no index when it is there
    (fast, offline); otherwise let pip fetch hatchling (build isolation, needs PyPI)."""
    if importlib.util.find_spec("hatchling") is not None:
        # pip's inverted spelling: PIP_NO_BUILD_ISOLATION=0 turns build isolation off.
        return {"PIP_NO_BUILD_ISOLATION": "0", "PIP_NO_INDEX": "1"}
    return {}


def _wheel(
    directory: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()
) -> Path:
    """A minimal, valid pure-Python wheel."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    entries[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, text in entries.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in entries.items():
            zf.writestr(path, text)
    return wheel


# --- the script itself -------------------------------------------------------------------


def test_script_is_valid_bash_and_names_no_repository(tmp_path: Path) -> None:
    assert os.access(SCRIPT, os.X_OK), "colab_setup.sh must be executable"
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    # The repository and ref come from the setup cell only, so the file (and the SHA-256
    # the cell checks) is the same in every fork.
    assert "DEFAULT_REPO" not in text and "pytorch-gpu-course" not in text
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert sum("github.com/" in line for line in code) == 1, "one place builds the git URL"


def test_pointing_the_course_at_a_fork_leaves_the_script_alone(tmp_path: Path) -> None:
    """`course_utils badges --repo` changes the cells, not the script; the script installs
    from the repository and ref the cell passes, and without them refuses in one line
    before touching anything."""
    fork = tmp_path / "fork"
    (fork / "notebooks").mkdir(parents=True)
    shutil.copy2(ROOT / "notebooks" / "01_runtime_and_devices.ipynb", fork / "notebooks")
    shutil.copy2(SCRIPT, fork / "colab_setup.sh")
    changes = retarget_course(fork, "someone/their-fork", "spring-2027")
    assert "colab_setup.sh" not in changes.files
    assert (fork / "colab_setup.sh").read_bytes() == SCRIPT.read_bytes()
    assert changes.sha256 == hashlib.sha256(SCRIPT.read_bytes()).hexdigest()

    python, _ = _make_venv(tmp_path / "bare", view=None)
    done, _ = _run_script(python, tmp_path, tmp_path / "cache")
    assert done.returncode != 0 and done.stdout == ""
    assert _error_lines(done.stderr) == done.stderr.strip().splitlines()
    assert len(_error_lines(done.stderr)) == 1 and "COURSE_REPO" in done.stderr
    done2, _ = _run_script(
        python, tmp_path, tmp_path / "cache", COURSE_REPO="x/y", COURSE_REF="0a1b2c"
    )
    assert done2.returncode != 0  # no torch in this venv: refused after saying the source
    assert "git+https://github.com/x/y.git@0a1b2c" in done2.stdout


def test_without_torch_fails_with_one_line(tmp_path: Path) -> None:
    python, _ = _make_venv(tmp_path / "bare", view=None)
    done, _ = _run_script(python, tmp_path, tmp_path / "cache", COURSE_SOURCE=str(ROOT))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(ERROR_PREFIX) and "torch" in lines[0]
    assert not (tmp_path / "cache" / "course_utils").exists()


# --- a fresh venv that already has torch, like Colab ---------------------------------------


@pytest.fixture(scope="module")
def colab_like(tmp_path_factory: pytest.TempPathFactory):
    """(python, site-packages, workdir, torch version) of a fresh venv that sees the
    project's packages except the course package."""
    base = tmp_path_factory.mktemp("colab_like")
    view = _make_view(base / "view", PROJECT_SITE)
    python, site = _make_venv(base / "venv", view)
    work = base / "work"
    work.mkdir()
    probe = _py(
        python,
        "import torch, importlib.metadata as m; print(torch.__version__, m.version('torch'))",
        work,
    )
    assert probe.returncode == 0, f"torch must import in the fresh venv:\n{probe.stderr}"
    imported_version, torch_dist = probe.stdout.split()
    # The point of the whole setup: the course package is NOT importable yet.
    absent = _py(python, "import course_utils", work)
    assert absent.returncode != 0 and "No module named 'course_utils'" in absent.stderr
    assert _dist_version(python, "course-utils", work) == ""
    return python, site, work, torch_dist, imported_version


@pytest.fixture(scope="module")
def first_run(colab_like):
    python, _site, work, _torch, _ = colab_like
    cache = work.parent / "cache"
    done, seconds = _run_script(
        python, work, cache, COURSE_SOURCE=str(ROOT), **_offline_build_env()
    )
    return done, seconds, cache


@pytest.mark.slow
def test_installs_course_package_and_keeps_torch(colab_like, first_run) -> None:
    python, site, work, torch_dist, imported_version = colab_like
    done, _seconds, cache = first_run
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert _error_lines(done.stderr) == []
    # The pin names exactly the installed torch (a local label like +cu128 included).
    assert f"torch=={torch_dist}" in done.stdout
    assert "installed: " in done.stdout and "course-utils" in done.stdout
    assert "restart the runtime" in done.stdout.splitlines()[-1]

    after = _py(
        python,
        "import torch, course_utils, importlib.metadata as m; "
        "print(torch.__version__); print(m.version('torch')); print(course_utils.__file__)",
        work,
    )
    assert after.returncode == 0, after.stderr
    imported_after, dist_after, course_file = after.stdout.split()
    assert (imported_after, dist_after) == (imported_version, torch_dist)
    course_path = Path(course_file).resolve()
    assert course_path.is_relative_to(site.resolve()), course_path
    assert not course_path.is_relative_to(ROOT)
    assert not course_path.is_relative_to(PROJECT_SITE.resolve())
    assert (cache / "course_utils" / "colab_setup.stamp").read_text().startswith(f"source={ROOT}\n")


@pytest.mark.slow
def test_second_run_is_quick_and_installs_nothing(colab_like, first_run) -> None:
    python, _site, work, torch_dist, _ = colab_like
    done1, first_seconds, cache = first_run
    assert done1.returncode == 0, done1.stderr
    done, seconds = _run_script(python, work, cache, COURSE_SOURCE=str(ROOT))
    assert done.returncode == 0, done.stderr
    assert "already set up" in done.stdout
    assert "installing" not in done.stdout
    assert seconds < 10, f"second run took {seconds:.1f} s"
    assert seconds < first_seconds, (seconds, first_seconds)
    assert _dist_version(python, "torch", work) == torch_dist


@pytest.mark.slow
def test_force_reinstalls(colab_like, first_run) -> None:
    python, site, work, torch_dist, _ = colab_like
    done1, _, cache = first_run
    assert done1.returncode == 0, done1.stderr
    (site / "course_utils" / "__init__.py").write_text(
        "raise ImportError('stale copy')\n"
    )  # a broken copy to be replaced
    done, _ = _run_script(
        python, work, cache, COURSE_SOURCE=str(ROOT), COURSE_FORCE="1", **_offline_build_env()
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "already set up" not in done.stdout
    assert "installing course-utils" in done.stdout
    assert _py(python, "import course_utils", work).returncode == 0
    assert _dist_version(python, "torch", work) == torch_dist


@pytest.mark.slow
def test_broken_install_is_not_taken_for_set_up(colab_like, first_run) -> None:
    """The stamp alone is not enough: course_utils must still import."""
    python, site, work, _torch, _ = colab_like
    done1, _, cache = first_run
    assert done1.returncode == 0, done1.stderr
    assert (cache / "course_utils" / "colab_setup.stamp").exists()
    init = site / "course_utils" / "__init__.py"
    good = init.read_text()
    init.write_text("raise ImportError('broken on purpose')\n")
    try:
        done, _ = _run_script(python, work, cache, COURSE_SOURCE=str(ROOT), **_offline_build_env())
        assert done.returncode == 0, done.stderr
        assert "already set up" not in done.stdout
        assert _py(python, "import course_utils", work).returncode == 0
    finally:
        if _py(python, "import course_utils", work).returncode != 0:
            init.write_text(good)


def test_missing_source_fails_clearly(colab_like, tmp_path: Path) -> None:
    python, _site, work, torch_dist, _ = colab_like
    missing = tmp_path / "no-such-checkout"
    done, _ = _run_script(python, work, tmp_path / "cache", COURSE_SOURCE=str(missing))
    assert done.returncode != 0
    lines = _error_lines(done.stderr)
    assert len(lines) == 1 and "COURSE_SOURCE" in lines[0] and str(missing) in lines[0]
    assert _dist_version(python, "torch", work) == torch_dist


def test_pip_failure_names_the_step(colab_like, tmp_path: Path) -> None:
    python, _site, work, torch_dist, _ = colab_like
    not_a_project = tmp_path / "empty"
    not_a_project.mkdir()
    done, _ = _run_script(
        python,
        work,
        tmp_path / "cache",
        COURSE_SOURCE=str(not_a_project),
        COURSE_FORCE="1",
        **_offline_build_env(),
    )
    assert done.returncode != 0
    lines = _error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == lines[0]
    assert "installing the course package" in lines[0]
    assert f"torch is unchanged ({torch_dist})" in lines[0]
    assert not (tmp_path / "cache" / "course_utils" / "colab_setup.stamp").exists()
    assert _dist_version(python, "torch", work) == torch_dist


# --- the constraint, with a fake torch that carries a local label ----------------------


@pytest.mark.slow
def test_constraint_refuses_to_replace_torch(tmp_path: Path) -> None:
    """A course package that needs a newer torch than the installed 2.4.0+cpu: with the
    constraint pip fails (Colab's torch survives); without it pip would replace torch
    (checked last, to show the test can fail)."""
    view = _make_view(
        tmp_path / "pip-only",
        PROJECT_SITE,
        keep=lambda name: name == "pip" or name.startswith("pip-"),
    )
    python, _site = _make_venv(tmp_path / "venv", view)
    work = tmp_path / "work"
    work.mkdir()
    index = tmp_path / "index"  # what "PyPI" offers: a newer torch
    _wheel(index, "torch", "2.10.0", {"torch/__init__.py": "__version__ = '2.10.0'\n"})
    preinstalled = [
        _wheel(
            tmp_path / "colab",
            "torch",
            "2.4.0+cpu",
            {"torch/__init__.py": "__version__ = '2.4.0+cpu'\n"},
        ),
        _wheel(tmp_path / "colab", "lightning", "2.4.0", {"lightning/__init__.py": ""}),
        _wheel(tmp_path / "colab", "nvidia-ml-py", "12.535.0", {"pynvml.py": ""}),
    ]
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONFIG_FILE": os.devnull}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", *map(str, preinstalled)],
        check=True,
        cwd=work,
        env=_clean_env(**offline),
    )
    course_init = {"course_utils/__init__.py": "__version__ = '0.1.0'\n"}
    fits = _wheel(tmp_path / "fits", "course-utils", "0.1.0", course_init, ("torch>=2.4",))
    needs_newer = _wheel(tmp_path / "newer", "course-utils", "0.1.0", course_init, ("torch>=2.10",))
    cache = tmp_path / "cache"

    ok, _ = _run_script(python, work, cache, COURSE_SOURCE=str(fits), **offline)
    assert ok.returncode == 0, f"stdout:\n{ok.stdout}\nstderr:\n{ok.stderr}"
    assert "torch==2.4.0+cpu" in ok.stdout
    assert _dist_version(python, "torch", work) == "2.4.0+cpu"

    refused, _ = _run_script(python, work, cache, COURSE_SOURCE=str(needs_newer), **offline)
    assert refused.returncode != 0, refused.stdout
    assert "already set up" not in refused.stdout  # another source: the stamp does not match
    assert _error_lines(refused.stderr)[-1].endswith(
        "torch is unchanged (2.4.0+cpu); messages above say why, rerun after fixing it"
    )
    assert _dist_version(python, "torch", work) == "2.4.0+cpu"

    # Control: the same install without the constraint does replace torch.
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "course-utils"],
        check=True,
        cwd=work,
        env=_clean_env(**offline),
    )
    assert _dist_version(python, "torch", work) == "2.10.0"
