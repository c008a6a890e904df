"""nvidia-smi: parsing every form of output (own fixtures), diagnostics, running it, CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import smi
from course_utils.smi import SmiParseError, diagnose, explain, parse

FIXTURES = Path(__file__).parent / "fixtures" / "smi"
NOHEADER_FIELDS = [
    "index",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "power.draw",
    "clocks.sm",
]


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def codes(parsed: dict) -> list[str]:
    return [d["code"] for d in parsed["diagnostics"]]


def test_driver_384_table_without_cuda_version_and_old_process_columns():
    parsed = parse(load("table_driver384_two_gpus.txt"))
    assert parsed["format"] == "table"
    assert (parsed["driver_version"], parsed["cuda_version"]) == ("384.111", None)
    gpu0, gpu1 = parsed["gpus"]
    assert gpu0["name"] == "GeForce GTX 108..."  # truncated names stay as printed
    assert (gpu0["fan_pct"], gpu0["temperature_c"], gpu0["pstate"]) == (23, 38, "P8")
    assert (gpu0["power_draw_w"], gpu0["power_limit_w"]) == (17.0, 250.0)
    assert (gpu0["memory_used_mib"], gpu0["memory_total_mib"]) == (552, 11171)
    assert gpu0["utilization_gpu_pct"] == 2
    assert gpu1["power_draw_w"] is None and gpu1["power_limit_w"] is None  # N/A / N/A
    assert gpu1["compute_mode"] == "E. Process"
    # the "Not Supported" process row is skipped, the others keep their full names
    assert [
        (p["gpu_index"], p["pid"], p["type"], p["name"], p["used_memory_mib"])
        for p in parsed["processes"]
    ] == [(0, 1234, "G", "/usr/lib/xorg/Xorg", 330), (0, 2345, "C", "python train.py", 210)]


def test_driver_470_mig_table_devices_processes_and_na_utilization():
    parsed = parse(load("table_driver470_mig.txt"))
    gpu = parsed["gpus"][0]
    assert gpu["mig_mode"] == "Enabled" and gpu["utilization_gpu_pct"] is None
    assert gpu["ecc_uncorrected"] == "On"
    migs = parsed["mig_devices"]
    assert [(m["gi_id"], m["ci_id"], m["mig_device"]) for m in migs] == [(1, 0, 0), (2, 0, 1)]
    assert (migs[0]["memory_used_mib"], migs[0]["memory_total_mib"]) == (1030, 20096)
    assert (migs[0]["bar1_used_mib"], migs[0]["sm_count"]) == (2, 42)
    process = parsed["processes"][0]
    assert (process["gi_id"], process["ci_id"], process["pid"]) == (1, 0, 31337)
    assert "mig-no-utilization" in codes(parsed)


def test_nearly_full_memory_and_busy_but_low_power_are_diagnosed():
    parsed = parse(load("table_driver535_nearly_full_busy_low_power.txt"))
    assert codes(parsed) == ["busy-but-low-power", "memory-nearly-full"]
    assert "memory-without-processes" not in codes(parsed)  # the process is listed


def test_csv_with_header_and_units_maps_fields_and_not_available_values():
    parsed = parse(load("csv_header_units.txt"))
    assert parsed["format"] == "csv" and parsed["query"] == "gpu"
    first, second = parsed["gpus"]
    assert first == {
        **first,
        "index": 0,
        "name": "Tesla T4",
        "bus_id": "00000000:00:04.0",
        "fan_pct": None,
        "temperature_c": 61,
        "pstate": "P0",
        "power_draw_w": 68.41,
        "power_limit_w": 70.0,
        "memory_used_mib": 3511,
        "memory_total_mib": 15360,
        "utilization_gpu_pct": 96,
    }
    assert second["fan_pct"] is None and second["power_draw_w"] is None
    assert second["utilization_gpu_pct"] is None
    assert parsed["units"]["power.draw"] == "W"


def test_csv_header_with_units_but_values_without_units():
    gpu = parse(load("csv_header_nounits.txt"))["gpus"][0]
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (1024, 81920)
    assert (gpu["utilization_gpu_pct"], gpu["power_draw_w"]) == (35, 123.45)


def test_noheader_csv_needs_the_fields_and_uses_them():
    text = load("csv_noheader_nounits.txt")
    with pytest.raises(SmiParseError, match="fields"):
        parse(text)
    gpu = parse(text, NOHEADER_FIELDS)["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["power_draw_w"] == 629.12
    assert gpu["sm_clock_mhz"] is None  # [Requested functionality has been deprecated]
    with pytest.raises(SmiParseError, match="no CSV line"):
        parse(text, ["index", "name"])  # wrong number of fields


def test_compute_apps_csv_gives_processes():
    parsed = parse(load("compute_apps.csv"))
    assert parsed["query"] == "compute-apps" and parsed["gpus"] == []
    assert [
        (p["pid"], p["name"], p["used_memory_mib"], p["type"]) for p in parsed["processes"]
    ] == [(4242, "/usr/bin/python3", 15094, "C"), (4343, "python", None, "C")]


def test_xml_schema_12_two_gpus_power_and_processes():
    parsed = parse(load("query_v12.xml"))
    assert (parsed["format"], parsed["schema_version"]) == ("xml", 12)
    assert (parsed["driver_version"], parsed["cuda_version"]) == ("535.104.05", "12.2")
    first, second = parsed["gpus"]
    assert (first["power_draw_w"], first["power_limit_w"]) == (68.41, 70.0)
    assert (first["memory_used_mib"], first["memory_free_mib"], first["sm_clock_mhz"]) == (
        3511,
        11599,
        1590,
    )
    assert second["index"] == 1 and second["fan_pct"] is None and second["power_draw_w"] is None
    assert [(p["gpu_index"], p["pid"], p["used_memory_mib"]) for p in parsed["processes"]] == [
        (0, 4242, 3506)
    ]


def test_list_form_with_a_mig_device():
    parsed = parse(load("list_two_gpus.txt"))
    assert parsed["format"] == "list"
    assert [(g["index"], g["name"]) for g in parsed["gpus"]] == [
        (0, "Tesla T4"),
        (1, "NVIDIA A100-SXM4-40GB"),
    ]
    assert parsed["mig_devices"][0]["gpu_index"] == 1
    assert parsed["mig_devices"][0]["profile"] == "3g.20gb"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("garbage_*")))
def test_garbage_is_refused_with_one_line(name):
    with pytest.raises(SmiParseError) as caught:
        parse(load(name))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["", "   \n", "nvidia", "0, 1, 2", "a.b, c.d\n"])
def test_more_garbage_is_refused(text):
    with pytest.raises(SmiParseError):
        parse(text)


@pytest.mark.parametrize("value", sorted(smi.NOT_AVAILABLE))
def test_every_not_available_spelling_becomes_none(value):
    assert smi.to_int(value) is None and smi.to_float(value) is None
    row = f"index, memory.used [MiB], power.draw [W], temperature.gpu\n0, {value}, {value}, 40\n"
    gpu = parse(row)["gpus"][0]
    assert gpu["memory_used_mib"] is None and gpu["power_draw_w"] is None


def test_extra_contexts_on_gpu0_needs_processes_on_other_gpus_too():
    ranks = [{"gpu_index": r, "pid": 100 + r, "used_memory_mib": 9000} for r in range(4)]
    extra = [{"gpu_index": 0, "pid": 100 + r, "used_memory_mib": 500} for r in range(1, 4)]
    assert "extra-contexts-on-gpu0" in [d["code"] for d in diagnose({"processes": ranks + extra})]
    assert diagnose({"processes": ranks}) == []  # one process per GPU: healthy DDP
    # a single process on two GPUs (a model split by hand) is not the DDP mistake
    assert diagnose({"processes": [*ranks, extra[0]]}) == []


def test_shipped_samples_load_with_provenance_and_parse():
    names = smi.list_samples()
    assert {"t4_table_idle", "ddp_4gpu_forgot_set_device", "t4_query_gpu_csv"} <= set(names)
    for name in names:
        provenance, text = smi.sample_output(name)
        assert provenance.startswith("provenance:"), name
        assert parse(text)["gpus"], name
    _, ddp = smi.sample_output("ddp_4gpu_forgot_set_device")
    assert "extra-contexts-on-gpu0" in codes(parse(ddp))
    with pytest.raises(ValueError, match="available"):
        smi.sample_output("no-such-sample")


def test_explain_names_fields_and_diagnostics():
    _, text = smi.sample_output("t4_table_tiny_kernels")
    words = explain(text)
    assert "GPU 0: Tesla T4" in words and "GPU-Util: 100%" in words
    assert "[busy-but-low-power]" in words and "at least one kernel" in words


# ----------------------------------------------------------------------------- running


def fake_binary(folder: Path, script: str) -> Path:
    path = folder / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_run_smi_reports_a_missing_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(smi, "COLAB_PATH", str(tmp_path / "opt-bin-nvidia-smi"))
    run = smi.run_smi(["-L"])
    assert not run.ok and "not found" in run.message


def test_run_smi_uses_colab_path_when_not_on_path(monkeypatch, tmp_path):
    binary = fake_binary(tmp_path, 'echo "GPU 0: Tesla T4 (UUID: GPU-1)"')
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(smi, "COLAB_PATH", str(binary))
    run = smi.run_smi(["-L"])
    assert run.ok and parse(run.output)["gpus"][0]["name"] == "Tesla T4"


def test_run_smi_times_out_and_reports_failures(monkeypatch, tmp_path):
    fake_binary(tmp_path, 'if [ "$1" = "-L" ]; then sleep 5; fi; echo "NVML failed" >&2; exit 9')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    slow = smi.run_smi(["-L"], timeout_s=0.3)
    assert not slow.ok and "did not answer" in slow.message
    failed = smi.run_smi(["-q"])
    assert not failed.ok and "failed (9)" in failed.message and "NVML failed" in failed.message


def test_query_gpus_passes_the_fields_and_parses_noheader_output(monkeypatch, tmp_path):
    fake_binary(tmp_path, f'echo "$1" > {tmp_path}/args; echo "0, 45, 1200"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpus = smi.query_gpus(["index", "utilization.gpu", "memory.used"])
    assert (tmp_path / "args").read_text().strip() == (
        "--query-gpu=index,utilization.gpu,memory.used"
    )
    assert (gpus[0]["utilization_gpu_pct"], gpus[0]["memory_used_mib"]) == (45, 1200)


# ----------------------------------------------------------------------------- CLI


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "course_utils", "smi", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )


def test_cli_parse_json_has_the_documented_shape():
    done = run_cli("parse", str(FIXTURES / "table_driver384_two_gpus.txt"), "--json")
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert set(parsed) >= {
        "format",
        "driver_version",
        "cuda_version",
        "gpus",
        "processes",
        "diagnostics",
    }
    assert set(parsed["gpus"][0]) >= set(smi.GPU_KEYS)
    assert set(parsed["processes"][0]) >= set(smi.PROCESS_KEYS)


@pytest.mark.slow
def test_cli_reads_stdin_with_fields_and_explains():
    done = run_cli(
        "parse",
        "-",
        "--fields",
        ",".join(NOHEADER_FIELDS),
        "--json",
        stdin=load("csv_noheader_nounits.txt"),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpus"][0]["memory_used_mib"] == 19818
    explained = run_cli("explain", str(FIXTURES / "table_driver470_mig.txt"))
    assert explained.returncode == 0 and "[mig-no-utilization]" in explained.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["garbage_prose.csv", "garbage_truncated.xml", "missing.txt"])
def test_cli_refuses_garbage_with_one_line_and_exit_2(name):
    done = run_cli("parse", str(FIXTURES / name), "--json")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_cli_refuses_binary_input(tmp_path):
    path = tmp_path / "binary"
    path.write_bytes(bytes(range(256)) * 4)
    done = run_cli("parse", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_cli_smi_imports_no_torch():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['course_utils', 'smi', 'parse', sys.argv[1]]\n"
        "try:\n    runpy.run_module('course_utils', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(FIXTURES / "list_two_gpus.txt")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert "Tesla T4" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr


def test_the_recorded_h200_samples_parse_to_what_they_show():
    """Real outputs recorded on the course's H200 lane (2026-11-29), shipped for notebook 02."""
    from course_utils.smi import sample_output

    provenance, text = sample_output("h200_table_matmul_load")
    assert "recorded" in provenance and "not a recording" not in provenance
    table = parse(text)
    assert (table["driver_version"], table["cuda_version"]) == ("580.159.04", "13.0")
    gpu = table["gpus"][0]
    assert (gpu["name"], gpu["utilization_gpu_pct"], gpu["pstate"]) == ("NVIDIA H200", 99, "P0")
    assert (gpu["power_draw_w"], gpu["power_limit_w"]) == (694.0, 700.0)
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (1011, 143771)
    assert [(p["pid"], p["type"], p["used_memory_mib"]) for p in table["processes"]] == [
        (468, "C", 1002)
    ]
    idle = parse(sample_output("h200_table_idle")[1])["gpus"][0]
    assert (idle["utilization_gpu_pct"], idle["memory_used_mib"]) == (0, 0)
    csv_gpu = parse(sample_output("h200_query_gpu_csv_load")[1])["gpus"][0]
    assert (csv_gpu["utilization_gpu_pct"], csv_gpu["power_draw_w"]) == (99, 692.82)
    xml = parse(sample_output("h200_q_x_load")[1])
    assert xml["format"] == "xml" and xml["gpus"][0]["memory_total_mib"] == 143771


# --------------------------------------------------------------- field names and aliases

ALIAS_CSV = "Tesla T4, GPU-1111-aaaa, 00000000:00:04.0, 1590, 585, 45\n"


@pytest.mark.parametrize(
    "fields",
    [
        "name,uuid,pci.bus_id,clocks.current.sm,clocks.current.memory,utilization.gpu",
        "gpu_name,gpu_uuid,gpu_bus_id,clocks.sm,clocks.mem,utilization.gpu",
    ],
)
def test_every_alias_of_a_gpu_field_reads_the_same(fields):
    (gpu,) = smi.parse(ALIAS_CSV, fields.split(","))["gpus"]
    assert (gpu["name"], gpu["uuid"], gpu["bus_id"]) == (
        "Tesla T4",
        "GPU-1111-aaaa",
        "00000000:00:04.0",
    )
    assert (gpu["sm_clock_mhz"], gpu["utilization_gpu_pct"]) == (1590, 45)


def test_the_alias_tables_map_both_names_of_every_known_field():
    for groups, table in [
        (smi.GPU_FIELD_ALIASES, smi.CSV_FIELDS),
        (smi.PROCESS_FIELD_ALIASES, smi.PROCESS_FIELDS),
    ]:
        for group in groups:
            assert len(group) >= 2
            mapped = {table.get(name) for name in group}
            assert len(mapped) == 1, group  # all unknown, or all the same key
    assert smi.CSV_FIELDS["gpu_uuid"] == smi.CSV_FIELDS["uuid"]
    # a field the parser does not map is still a query field: kept, not refused
    parsed = smi.parse("1323121035405, 0x2f00\n", ["gpu_serial", "pci.bus"])
    assert parsed["fields"] == ["gpu_serial", "pci.bus"] and len(parsed["gpus"]) == 1


def test_in_compute_apps_the_gpu_fields_describe_the_process_gpu():
    text = "GPU-2222-bbbb, 4242, python3, 812 MiB\nGPU-3333-cccc, 77, [N/A], 100 MiB\n"
    parsed = smi.parse(text, ["gpu_uuid", "pid", "name", "used_memory"])
    assert parsed["query"] == "compute-apps" and parsed["gpus"] == []
    first, second = parsed["processes"]
    assert (first["pid"], first["name"], first["used_memory_mib"]) == (4242, "python3", 812)
    assert first["gpu_uuid"] == "GPU-2222-bbbb" and second["gpu_uuid"] == "GPU-3333-cccc"
    assert second["name"] is None


def test_the_query_decides_what_an_ambiguous_field_means():
    text = "GPU-2222-bbbb, Tesla T4\n"
    as_gpu = smi.parse(text, ["gpu_uuid", "gpu_name"])
    assert as_gpu["query"] == "gpu" and as_gpu["gpus"][0]["uuid"] == "GPU-2222-bbbb"
    as_apps = smi.parse("GPU-2222-bbbb, python3\n", ["gpu_uuid", "name"], query="compute-apps")
    (process,) = as_apps["processes"]
    assert (process["gpu_uuid"], process["name"]) == ("GPU-2222-bbbb", "python3")
    with pytest.raises(ValueError, match="query="):
        smi.parse(text, ["gpu_uuid", "gpu_name"], query="apps")


def test_a_header_with_the_printed_names_is_read_in_its_query():
    # nvidia-smi --query-compute-apps=name,pid --format=csv prints the first alias
    parsed = smi.parse("process_name, pid\n/cuda-samples/sample, 1895238\n")
    assert parsed["processes"][0]["name"] == "/cuda-samples/sample"
