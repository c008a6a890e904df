"""python -m course_utils: exit codes and one-line errors, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from course_utils.cli import main


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "course_utils", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_doctor_json_has_the_documented_keys():
    done = run_cli("doctor", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {"python", "torch", "cuda_available", "torch_cuda_build", "device", "gpus",
            "precision", "environment"} <= set(report)
    assert isinstance(report["cuda_available"], bool) and isinstance(report["gpus"], list)
    assert report["torch_cuda_build"] is None or isinstance(report["torch_cuda_build"], str)


def test_doctor_text_without_gpu_is_honest():
    done = run_cli("doctor")
    assert done.returncode == 0
    assert "CUDA available : False" in done.stdout and "device         : cpu" in done.stdout


@pytest.mark.parametrize("args", [["doctor", "--frobnicate"], ["no-such-command"], []])
def test_wrong_arguments_print_usage_and_exit_2(args):
    done = run_cli(*args)
    assert done.returncode == 2
    assert "usage:" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["badges", "--repo", "not a repo", "--ref", "v1"], {}, "error: --repo must look like"),
        (["badges", "--repo", "me/fork"], {}, "error: --repo needs --ref: a commit"),
        (["badges", "--no-repo", "--root", "/nonexistent"], {}, "error: no colab_setup.sh in"),
        (["run-notebooks", "/nonexistent/x.ipynb"], {}, "error: not a notebook"),
        (["doctor"], {"COURSE_DEVICE": "tpu"}, "error: unknown device 'tpu'"),
        (["doctor"], {"COURSE_DEVICE": "cuda:1"}, "error: asked for cuda:1"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args, env, message):
    done = run_cli(*args, env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(message)
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_main_returns_exit_codes_in_process(capsys):
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "cpu"


def test_run_notebooks_exits_1_when_a_notebook_fails_after_running_the_rest(tmp_path):
    import nbformat

    for name, source in [("01_bad.ipynb", "raise SystemError('broken on purpose')"),
                         ("02_good.ipynb", "print('fine')")]:
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(notebook, tmp_path / name)
    done = run_cli("run-notebooks", str(tmp_path), "--out", str(tmp_path / "build"),
                   "--workload", "small")
    assert done.returncode == 1
    assert "01_bad.ipynb: failed" in done.stdout and "02_good.ipynb: ok" in done.stdout
    assert (tmp_path / "build" / "notebooks" / "02_good.ipynb").exists()
    assert "Traceback" not in done.stderr
