"""Issue 44's "Done when": a wrong answer to each exercise of 01 and 09, graded in a
Bengali, an Arabic and a Nepali notebook (built from the real catalogs), gets its feedback
in that language; the CPU branch's explanations of 01 print in the notebook's language."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

from course_utils.language import LANGUAGE_VAR, LANGUAGES
from course_utils.tooling import translate

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = {
    "01": ROOT / "notebooks" / "01_runtime_and_devices.ipynb",
    "09": ROOT / "notebooks" / "09_transformers_on_the_gpu.ipynb",
}
#: Each language's letters (Bengali, Arabic, Devanagari blocks).
SCRIPT = {"bn": r"[\u0980-\u09ff]", "ar": r"[\u0600-\u06ff]", "ne": r"[\u0900-\u097f]"}

#: A wrong answer to each exercise, as a learner would write it.
WRONG = {
    "01-my-to-device": "def my_to_device(batch, device):\n    return batch\n",
    "01-mixed-forward": "def mixed_forward(model, x, capability):\n    return model(x)\n",
    "01-time-it": (
        "import time\n\n\ndef time_it(fn, device, warmup=2, repeats=5):\n"
        "    for _ in range(warmup):\n        fn()\n    times = []\n"
        "    for _ in range(repeats):\n        start = time.perf_counter()\n        fn()\n"
        "        times.append(time.perf_counter() - start)\n"
        "    return sum(times) / len(times)  # the mean, not the median\n"
    ),
    "09-causal-attention": (
        "def causal_self_attention(x, w_qkv, w_out, heads):\n"
        "    batch, seq, dim = x.shape\n"
        "    q, k, v = (x @ w_qkv.T).split(dim, dim=-1)\n"
        "    weights = torch.softmax(q @ k.transpose(-2, -1) / dim**0.5, dim=-1)  # no mask\n"
        "    return (weights @ v) @ w_out.T\n"
    ),
    "09-pad-vocabulary": "def pad_vocabulary(model, multiple=64):\n    return model\n",
    "09-step-throughput": (
        "def step_throughput(model, x, y, seconds, gpu, dtype):\n"
        "    tokens = x.numel()\n    return 1.0, tokens / seconds, 0.5\n"
    ),
}


def _script_letters(text: str, language: str) -> int:
    return len(re.findall(SCRIPT[language], text))


def _wrong_submission(built: Path, out: Path) -> Path:
    notebook = nbformat.read(built, as_version=4)
    for cell in notebook.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in WRONG:
            cell.source = WRONG[gid]
    nbformat.write(notebook, out)
    return out


#: The one case graded in the grader's sandbox (bubblewrap), which shows the kernel and the
#: judge only what they need: the messages' catalogs must be among it (without them every
#: beside check would answer in English). One grading for both questions, not two.
SANDBOXED = ("01", "bn")


@pytest.mark.slow
@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("part", ["01", "09"])
def test_a_wrong_answer_gets_its_feedback_in_the_notebooks_language(tmp_path, part, language):
    import shutil

    from course_utils.instructor import sandbox
    from course_utils.instructor.grading import KernelSettings, grade_submission

    (built,) = translate.build(language, [NOTEBOOK[part]], tmp_path / language)
    (tmp_path / "class").mkdir()
    submission = _wrong_submission(built, tmp_path / "class" / "wrong.ipynb")
    settings = KernelSettings()
    if (part, language) == SANDBOXED:
        if shutil.which("bwrap") is None:
            pytest.fail("bubblewrap is missing: .ci/run installs it (apt-get install bubblewrap)")
        settings = KernelSettings(sandbox.find("bwrap", (str(tmp_path / "class"),)))
    before = os.environ.get(LANGUAGE_VAR)
    report, feedback = grade_submission(submission, built, settings=settings)
    assert os.environ.get(LANGUAGE_VAR) == before  # the grader's own environment untouched
    if (part, language) == SANDBOXED:
        assert report.sandbox == "bwrap"
        for check in report.checks:
            assert _script_letters(check.reason, language) >= 10, check.reason
    checks = [check for check in report.checks if check.grade_id.startswith(part)]
    assert len(checks) == 3, report.format()
    for check in checks:
        assert check.points < check.max_points, report.format()
        letters = _script_letters(check.reason, language)
        assert letters >= 10, f"{check.grade_id} in English: {check.reason}"
    if part == "01":  # the CPU branch's explanation of the GPU's properties (cell nb01-11)
        (cell,) = [c for c in feedback.cells if c.get("id") == "nb01-11"]
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        assert "cuda:0: Tesla T4" in text and _script_letters(text, language) >= 20, text
