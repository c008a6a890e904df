"""python -m course_utils: exit codes and one-line errors, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import NO_GPU_ENV

from course_utils.tooling import cli
from course_utils.tooling.cli import main


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "course_utils", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_doctor_json_has_the_documented_keys():
    done = run_cli("doctor", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {
        "python",
        "torch",
        "cuda_available",
        "torch_cuda_build",
        "device",
        "gpus",
        "precision",
        "environment",
    } <= set(report)
    assert isinstance(report["cuda_available"], bool) and isinstance(report["gpus"], list)
    assert report["torch_cuda_build"] is None or isinstance(report["torch_cuda_build"], str)


@pytest.mark.slow
def test_doctor_text_without_gpu_is_honest():
    done = run_cli("doctor", env=NO_GPU_ENV)  # no GPU visible, on any machine
    assert done.returncode == 0
    assert "CUDA available : False" in done.stdout and "device         : cpu" in done.stdout
    assert "CUDA_VISIBLE_DEVICES hides every GPU" in done.stdout


def assert_one_line(stderr: str, starts: str = "error: ") -> None:
    assert stderr.startswith(starts), stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "--frobnicate"],
        ["no-such-command"],
        [],
        ["smi", "summarize", "x"],
        ["ddp-check", "--nproc", "two"],
    ],
)
def test_wrong_arguments_are_one_line_and_exit_2(args):
    done = run_cli(*args)
    assert done.returncode == 2
    assert_one_line(done.stderr)
    assert "--help" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["badges", "--repo", "not a repo", "--ref", "v1"], {}, "error: --repo must look like"),
        (["badges", "--repo", "me/fork"], {}, "error: --repo needs --ref: a commit"),
        (["badges", "--no-repo", "--root", "/nonexistent"], {}, "error: no colab_setup.sh in"),
        (["run-notebooks", "/nonexistent/x.ipynb"], {}, "error: not a notebook"),
        (["doctor"], {"COURSE_DEVICE": "tpu"}, "error: unknown device 'tpu'"),
        (["doctor"], {**NO_GPU_ENV, "COURSE_DEVICE": "cuda:1"}, "error: asked for cuda:1"),
        (["smi", "parse", "/nonexistent/smi.txt"], {}, "error: cannot read /nonexistent"),
        (["ddp-check", "--nproc", "0"], {}, "error: --nproc, --steps and --batch-size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, env, message):
    done = run_cli(*args, env=env)
    assert done.returncode == 2
    assert_one_line(done.stderr, message)


def test_smi_output_that_cannot_be_parsed_is_bad_input(tmp_path):
    garbage = tmp_path / "smi.txt"
    garbage.write_text("this is not nvidia-smi output\n")
    done = run_cli("smi", "parse", str(garbage))
    assert done.returncode == 2
    assert_one_line(done.stderr)


HIDE_AND_RUN = """
import sys
sys.modules[sys.argv[1]] = None  # "import <module>" now fails, as when it is not installed
from course_utils.tooling.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "module", "extra"),
    [
        (["run-notebooks", "notebooks"], "nbformat", "notebooks"),
        (["run-notebooks", "notebooks"], "nbclient", "notebooks"),
        (["student", "notebooks"], "nbformat", "notebooks"),
        (["student", "notebooks"], "nbgrader", "classroom"),
    ],
)
def test_a_missing_optional_package_names_the_extra(command, module, extra, root, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", HIDE_AND_RUN, module, *command, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert done.returncode == 1
    assert_one_line(done.stderr)
    assert f"needs the {module} package: pip install 'course-utils[{extra}]'" in done.stderr


def test_an_unexpected_failure_is_one_line_and_exit_1(monkeypatch, capsys):
    def broken(args):
        raise KeyError("something the command did not expect")

    monkeypatch.setitem(cli.HANDLERS, "doctor", broken)
    assert main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert_one_line(err, "error: KeyError: 'something the command did not expect'")


def test_main_returns_exit_codes_in_process(capsys, no_driver):
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "cpu"


@pytest.mark.slow
def test_run_notebooks_reports_failing_and_malformed_notebooks_and_goes_on(tmp_path):
    import nbformat

    (tmp_path / "00_cut_short.ipynb").write_text('{"cells": [')
    for name, source in [
        ("01_bad.ipynb", "raise SystemError('broken on purpose')"),
        ("02_good.ipynb", "print('fine')"),
    ]:
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(notebook, tmp_path / name)
    (tmp_path / "03_not_a_notebook.ipynb").write_text('{"hello": 1}')
    done = run_cli(
        "run-notebooks", str(tmp_path), "--out", str(tmp_path / "build"), "--workload", "small"
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout
    assert "00_cut_short.ipynb: failed" in done.stdout and "not a valid notebook" in done.stdout
    assert "01_bad.ipynb: failed" in done.stdout and "02_good.ipynb: ok" in done.stdout
    assert "03_not_a_notebook.ipynb: failed" in done.stdout
    assert "(3 notebook(s) failed)" in done.stdout
    assert (tmp_path / "build" / "notebooks" / "02_good.ipynb").exists()
    assert (tmp_path / "build" / "notebooks" / "02_good.ipynb").exists()
    assert "Traceback" not in done.stderr
