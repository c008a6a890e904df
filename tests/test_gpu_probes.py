"""The GPU probes (``course_utils.tooling.gpu_probes``) and their step in ``gpu-record``,
with no GPU.

On this CPU machine every probe says ``skipped: no GPU`` at once. Probes that raise or
hang are recorded as ``error``/``timeout`` and the run goes on; a probes' process that is
killed or crashes keeps the entries it wrote; the record still validates. With a faked T4
(as in ``test_gpu_record.py``) the identity probe runs for real, and ``gpu-record`` puts
the probe step's entries in its record, after the doctor and before the tests and
notebooks. The comparison page shows a small table per probe.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_gpu_record import SAMPLES, FakeClock, fake_t4, stand_in  # noqa: F401

from course_utils.records import RecordError, load_records, validate_record
from course_utils.tooling import gpu_probes, gpu_record
from course_utils.tooling.gpu_probes import PROBES, Probe, run_probes
from course_utils.tooling.record_compare import comparison_page

SAMPLE = SAMPLES / "gpu-record-SAMPLE-tesla-t4-x1-20261204-090000.json"


def with_probes(entries: list[dict]) -> dict:
    """A sample record holding ``entries`` as its probes."""
    record = json.loads(SAMPLE.read_text())
    record["probes"] = entries
    return record


def fake(name: str, run) -> Probe:
    return Probe(name, run, "a test", limit_s=1.0)


HANG = threading.Event()  # never set: a probe that waits on it hangs


def fine(device):
    return {"device": device, "figures": (1.5, 2), "verdict": "held"}


def raises(device):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def hangs(device):
    HANG.wait(60)
    return {}


def test_without_a_gpu_every_probe_is_skipped_at_once(tmp_path, capsys):
    out = tmp_path / "probes.json"
    start = time.monotonic()
    assert gpu_probes.run_from_command_line(["--out", str(out)]) == 0
    took = time.monotonic() - start
    entries = json.loads(out.read_text())
    assert [e["name"] for e in entries] == list(gpu_probes.PROBE_NAMES)
    assert {(e["status"], e["error"]) for e in entries} == {("skipped", "skipped: no GPU")}
    assert took < 60  # nothing ran: no probe waited for its limit (60 s and more)
    validate_record(with_probes(entries))
    assert "sdpa_backends: skipped skipped: no GPU" in capsys.readouterr().out


def test_an_unknown_probe_is_bad_input_with_one_line(tmp_path, capsys):
    assert (
        gpu_probes.run_from_command_line(
            ["--out", str(tmp_path / "p.json"), "--only", "machine,nope"]
        )
        == 2
    )
    assert capsys.readouterr().out.startswith("error: unknown probe(s) nope: use ")


def test_a_probe_that_raises_or_hangs_is_recorded_and_the_run_goes_on():
    saved = []
    probes = [fake("raises", raises), fake("fine", fine), fake("hangs", hangs), fake("after", fine)]
    entries = run_probes(probes, "cuda:0", budget_s=60, save=lambda e: saved.append(len(e)))
    raised, ok, hung = entries  # after a hang this process stops: probe_step goes on in another
    assert raised["status"] == "error" and "illegal memory access" in raised["error"]
    assert hung["status"] == "timeout" and hung["seconds"] >= 1.0
    assert hung["error"] == "stopped after its limit of 1 s"
    assert ok["status"] == "ok" and ok["verdict"] == "held"  # the verdict is taken out
    assert ok["result"] == {"device": "cuda:0", "figures": [1.5, 2]}  # JSON-able
    assert saved == [1, 2, 3]  # written after every probe
    record = with_probes(entries)
    validate_record(record)
    assert gpu_record.failures(record)[:1] == [  # a timeout is informative (review G13)
        "probe raises error: RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    assert not any("hangs" in failure for failure in gpu_record.failures(record))


def test_probes_that_no_longer_fit_the_budget_are_not_run():
    clock = FakeClock()

    def slow(device):
        clock.now += 50
        return {"x": 1}

    probes = [Probe("slow", slow, "a test", 100), Probe("next", fine, "a test", 100)]
    first, second = run_probes(probes, "cuda:0", budget_s=52, clock=clock)
    assert first["status"] == "ok"
    assert (second["status"], second["error"]) == ("not run", "not run: 2 s left")
    assert run_probes(probes, None, 52)[0]["error"] == "skipped: no GPU"


def test_a_result_that_breaks_the_schema_is_refused():
    entries = run_probes([fake("fine", fine)], "cuda:0", 10)
    entries[0]["status"] = "crashed"
    with pytest.raises(RecordError, match="probes/0/status"):
        validate_record(with_probes(entries))


CHILD = """
import json, sys, time
out = sys.argv[1]
json.dump([{{"name": "{first}", "finding": "f", "status": "ok", "seconds": 0.1,
            "result": {{"x": 1}}, "verdict": "held", "error": None}}], open(out, "w"))
{then}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("then", "status", "error"),
    [
        ("time.sleep(60)", "timeout", "the probes' process was stopped at 4 s"),
        ("sys.exit('Segmentation fault')", "error", "failed (exit 1): Segmentation fault"),
    ],
)
def test_a_probes_process_killed_or_crashed_keeps_what_it_wrote(
    tmp_path, monkeypatch, then, status, error
):
    first = PROBES[0].name
    code = CHILD.format(first=first, then=then)
    monkeypatch.setattr(
        gpu_probes, "probe_command", lambda out, budget: [sys.executable, "-c", code, str(out)]
    )
    entries = gpu_probes.probe_step(tmp_path / "probes.json", limit_s=4)
    assert [e["name"] for e in entries] == [p.name for p in PROBES]
    assert entries[0]["status"] == "ok" and entries[1]["status"] == status
    assert error in entries[1]["error"]
    assert {e["status"] for e in entries[2:]} == {"not run"}
    validate_record(with_probes(entries))


def faked_torch_t4(monkeypatch, uuid: str) -> None:
    import torch

    props = SimpleNamespace(name="Tesla T4", uuid=uuid, total_memory=15360 * 2**20,
                            major=7, minor=5, multi_processor_count=40)  # fmt: skip
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)


@pytest.mark.usefixtures("fake_t4")
@pytest.mark.parametrize(("uuid", "verdict"), [("GPU-t4t4-0000", "agree"), ("beef", "disagree")])
def test_with_a_faked_t4_the_identity_probe_compares_nvml_and_torch(monkeypatch, uuid, verdict):
    faked_torch_t4(monkeypatch, uuid)
    (probe,) = [p for p in PROBES if p.name == "nvml_vs_cuda_identity"]
    (found,) = run_probes([probe], "cuda:0", 30)
    assert found["status"] == "ok", found["error"]
    assert found["verdict"] == verdict
    row = found["result"]["rows"][0]
    assert (row["course_name"], row["course_total_mib"], row["torch_total_mib"]) == (
        "Tesla T4", 15360, 15360)  # fmt: skip
    assert found["result"]["course_count"] == found["result"]["torch_count"] == 1
    validate_record(with_probes([found]))


@pytest.mark.usefixtures("fake_t4")
def test_gpu_record_runs_the_probes_after_the_doctor_and_records_them(tmp_path, monkeypatch):
    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "09_a.ipynb", "pass")
    steps, limits = [], []

    def probe_step(out, limit_s):
        steps.append("probes")
        limits.append(limit_s)
        probes = [fake("raises", raises), fake("fine", fine)]
        return run_probes(probes, "cuda:0", limit_s)

    def run_tests(tests, out, limit_s):
        steps.append("tests")
        return {"status": "passed", "summary": "1 passed", "seconds": 1.0}

    def run_one(path, out, limit_s, kernel, progress):
        steps.append(path.name)
        return {"notebook": path.name, "status": "ok", "seconds": 1.0, "error": None,
                "measurements": [], "claims": []}  # fmt: skip

    monkeypatch.setattr(gpu_record, "probe_step", probe_step)
    monkeypatch.setattr(gpu_record, "run_tests", run_tests)
    monkeypatch.setattr(gpu_record, "run_one_notebook", run_one)
    settings = gpu_record.Settings(out=tmp_path / "out", notebooks=[notebooks],
                                   tests=tmp_path, budget_s=400)  # fmt: skip
    path, _ = gpu_record.gpu_record(settings, clock=FakeClock())
    assert steps == ["probes", "tests", "09_a.ipynb"]
    assert limits == [100]  # a quarter of the budget (under the probes' own 240 s)
    saved = json.loads(path.read_text())
    validate_record(saved)
    assert [(p["name"], p["status"]) for p in saved["probes"]] == [
        ("raises", "error"), ("fine", "ok")]  # fmt: skip
    assert saved["outcome"] == "failed" and saved["failures"][0].startswith("probe raises error")


@pytest.mark.usefixtures("fake_t4")
def test_gpu_record_without_probes_records_none(tmp_path, monkeypatch):
    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "09_a.ipynb", "pass")
    monkeypatch.setattr(gpu_record, "probe_step", lambda out, limit: pytest.fail("ran"))
    monkeypatch.setattr(gpu_record, "run_one_notebook", lambda path, *a: {
        "notebook": path.name, "status": "ok", "seconds": 1.0, "error": None,
        "measurements": [], "claims": []})  # fmt: skip
    settings = gpu_record.Settings(out=tmp_path, notebooks=[notebooks], tests=None,
                                   probes=False)  # fmt: skip
    _, record = gpu_record.gpu_record(settings)
    assert record["probes"] == [] and record["outcome"] == "passed"


def test_records_written_before_the_probes_still_validate():
    record = json.loads(SAMPLE.read_text())
    assert "probes" not in record
    validate_record(record)


def test_the_comparison_page_has_a_small_table_per_probe():
    found = load_records(SAMPLES)
    page = comparison_page(found)
    section = page[page.index("## GPU probes") : page.index("## GPU claims")]
    table = section[section.index("### memory_cap_finder_repeatability") :]
    table = table[: table.index("\n### ", 1)]
    assert "| verdict | repeatable |  |" in table  # the T4 sample ran no probes
    assert "| limit | 3071 |  |" in table
    assert '| repeat | [[3071, "fits"], [3072, "oom"]] |  |' in table
    assert "| dtypes.float16.default | ScaledDotProductFlashAttentionBackward0 |  |" in section
    assert "| status | timeout |  |" in section and "stopped after its limit of 180 s" in section
    none = [copy.deepcopy(r) for r in found]
    for record in none:
        record.pop("probes", None)
    assert "## GPU probes" not in comparison_page(none)


def test_every_probe_says_which_finding_it_checks():
    for probe in PROBES:
        doc = probe.run.__doc__ or ""
        assert any(word in doc for word in ("finding", "Notebook", "notebook")), probe.name
        assert probe.limit_s > 0 and probe.name == probe.run.__name__


def test_the_probe_command_runs_this_python(tmp_path):
    command = gpu_probes.probe_command(Path(tmp_path / "p.json"), 99.6)
    assert command[:3] == [sys.executable, "-m", "course_utils.tooling.gpu_probes"]
    assert command[-2:] == ["--budget-s", "100"]
