"""GPU claims: said and recorded in a learner's run, strict in tests and the GPU lane."""

from __future__ import annotations

import nbformat
import pytest

from course_utils import claims
from course_utils.claims import ClaimNotHeld, claims_in_notebook, gpu_claim

LABEL = "measured on this machine (GPU: Tesla T4)"


def test_a_claim_that_holds_returns_true_in_both_modes(monkeypatch, capsys):
    for mode in ("report", "strict"):
        monkeypatch.setenv(claims.MODE_VAR, mode)
        assert gpu_claim("AMP", 2.0, at_least=1.5, unit="x", why="tensor cores", label=LABEL)
    assert "Claim held: AMP" in capsys.readouterr().out


def test_a_claim_that_fails_is_said_and_run_all_goes_on_for_a_learner(monkeypatch, capsys):
    monkeypatch.setenv(claims.MODE_VAR, "report")
    held = gpu_claim(
        "AMP / fp32", 1.1, at_least=1.5, unit="x", why="NVIDIA measured 3.3x", label=LABEL
    )
    said = capsys.readouterr().out
    assert held is False
    for words in (
        "did not hold",
        "measured: 1.1 x",
        "expected: >= 1.5 x",
        "NVIDIA measured 3.3x",
        "Tesla T4",
        "worth reporting",
        "goes on",
    ):
        assert words in said


def test_a_claim_that_fails_stops_a_strict_run(monkeypatch):
    monkeypatch.setenv(claims.MODE_VAR, "strict")
    with pytest.raises(ClaimNotHeld, match=r"expected: <= 0\.5"):
        gpu_claim("share", 0.7, at_most=0.5, why="a bound", label=LABEL)


def test_bounds_are_inclusive_and_both_can_be_given(monkeypatch):
    monkeypatch.setenv(claims.MODE_VAR, "report")
    assert gpu_claim("x", 1.5, at_least=1.5, why="w", label=LABEL)
    assert gpu_claim("x", 2.0, at_least=1.0, at_most=2.0, why="w", label=LABEL)
    assert not gpu_claim("x", 2.01, at_least=1.0, at_most=2.0, why="w", label=LABEL)


def test_bad_arguments_and_modes_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="at_least"):
        gpu_claim("x", 1.0, why="w", label=LABEL)
    with pytest.raises(ValueError, match="not finite"):
        gpu_claim("x", float("nan"), at_least=1.0, why="w", label=LABEL)
    monkeypatch.setenv(claims.MODE_VAR, "lenient")
    with pytest.raises(ValueError, match="COURSE_CLAIMS"):
        gpu_claim("x", 0.0, at_least=1.0, why="w", label=LABEL)


def test_verdicts_are_collected_from_an_executed_notebook():
    verdict = claims.ClaimVerdict("AMP", False, 1.1, ">= 1.5", "x", "why", LABEL)
    output = nbformat.v4.new_output(
        "display_data", data={"text/plain": verdict.sentence(), claims.CLAIM_MIME: verdict.__dict__}
    )
    broken = nbformat.v4.new_output("display_data", data={claims.CLAIM_MIME: {"name": 1}})
    cell = nbformat.v4.new_code_cell("x", outputs=[output, broken])
    assert claims_in_notebook(nbformat.v4.new_notebook(cells=[cell])) == [verdict]
