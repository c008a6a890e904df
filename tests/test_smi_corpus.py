"""The shared corpus of real nvidia-smi outputs: every file parses, with the right values.

The expected values below were read off each file by hand. Line 1 of every file is a
``# source:`` line (dropped before parsing, as the corpus README says); ``noheader`` CSV
files name their queried fields in that line.
"""

from __future__ import annotations

import pytest
from conftest import SHARED

from course_utils.smi import parse

CORPUS = SHARED / "fixtures" / "nvidia-smi"
I18N_FIELDS = [
    "memory.total",
    "memory.free",
    "memory.used",
    "temperature.gpu",
    "fan.speed",
    "utilization.gpu",
    "utilization.memory",
]

# file prefix -> expected values. "gpus": count; "gpu0"/"gpuN": GPU fields checked;
# "processes": [(gpu_index, pid, type, name, MiB)] or a count; "codes": diagnostic codes.
EXPECTED: dict[str, dict] = {
    "01": {
        "format": "table",
        "driver": "590.48.01",
        "cuda": "13.1",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA H100 80GB HBM3",
            "bus_id": "00000000:00:09.0",
            "fan_pct": None,
            "temperature_c": 41,
            "pstate": "P0",
            "power_draw_w": 69.0,
            "power_limit_w": 700.0,
            "memory_used_mib": 0,
            "memory_total_mib": 81559,
            "utilization_gpu_pct": 0,
            "mig_mode": "Disabled",
        },
        "processes": [],
        "codes": [],
    },
    "02": {
        "format": "table",
        "driver": "590.48.01",
        "cuda": "13.1",
        "gpus": 1,
        "gpu0": {
            "temperature_c": 59,
            "power_draw_w": 629.0,
            "memory_used_mib": 19818,
            "utilization_gpu_pct": 100,
        },
        "processes": [
            (0, 11327, "C", "/root/tools/memhog", 2566),
            (0, 11328, "C", "/root/tools/memhog", 1542),
            (0, 11345, "C", "./gpu_burn", 15690),
        ],
        "codes": [],
    },
    "03": {
        "format": "table",
        "driver": "590.48.01",
        "cuda": "13.1",
        "gpus": 1,
        "gpu0": {
            "memory_used_mib": 59,
            "utilization_gpu_pct": None,
            "mig_mode": "Enabled",
            "power_draw_w": 98.0,
        },
        "mig": [
            (2, 0, 0, 26, 40448),
            (3, 0, 1, 17, 20096),
            (9, 0, 2, 9, 9984),
            (10, 0, 3, 9, 9984),
        ],
        "processes": [],
        "codes": ["mig-no-utilization"],
    },
    "05": {
        "format": "list",
        "driver": None,
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        },
        "mig_profiles": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    },
    "07": {
        "format": "table",
        "driver": "590.48.01",
        "cuda": "13.1",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA H200",
            "bus_id": "00000000:83:00.0",
            "temperature_c": 52,
            "power_draw_w": 628.0,
            "memory_used_mib": 32362,
            "memory_total_mib": 143771,
            "utilization_gpu_pct": 100,
        },
        "processes": [
            (0, 10291, "C", "/root/tools/memhog", 2566),
            (0, 10293, "C", "/root/tools/memhog", 1542),
            (0, 10309, "C", "./gpu_burn", 28234),
        ],
        "codes": [],
    },
    "08": {
        "format": "table",
        "driver": "591.86",
        "cuda": "13.1",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA GeForce RTX 2080 ...",
            "driver_model": "WDDM",
            "fan_pct": 38,
            "temperature_c": 45,
            "pstate": "P2",
            "power_draw_w": 97.0,
            "power_limit_w": 250.0,
            "memory_used_mib": 1296,
            "memory_total_mib": 8192,
            "utilization_gpu_pct": 7,
            "mig_mode": None,
        },
        "processes": 12,
        "first_process": (0, 2056, "C+G", r"C:\Windows\System32\dwm.exe", None),
        "codes": ["wddm-no-process-memory"],
    },
    "09": {
        "format": "table",
        "driver": "610.57.04",
        "cuda": "13.3",
        "gpus": 1,
        "gpu0": {"memory_used_mib": 815, "utilization_gpu_pct": 8, "temperature_c": 38},
        "processes": [
            (0, 1720, "G", "/usr/bin/gnome-shell", 173),
            (0, 4556, "G", "/usr/bin/Xwayland", 3),
            (0, 28511, "C", "ffmpeg", 230),
            (0, 28512, "C", "ffmpeg", 370),
        ],
        "codes": [],
    },
    "11": {
        "format": "table",
        "driver": "595.80",
        "cuda": "13.2",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA L40S",
            "temperature_c": 64,
            "power_draw_w": 242.0,
            "power_limit_w": 350.0,
            "memory_used_mib": 0,
            "memory_total_mib": 46068,
            "utilization_gpu_pct": 100,
        },
        "processes": [],
        "codes": [],
    },
    "12": {
        "format": "csv",
        "driver": "590.48.01",
        "cuda": None,
        "gpus": 1,
        "gpu0": {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "bus_id": "00000000:00:09.0",
            "fan_pct": None,
            "temperature_c": 41,
            "pstate": "P0",
            "power_draw_w": 69.85,
            "power_limit_w": 700.0,
            "memory_used_mib": 0,
            "memory_total_mib": 81559,
            "memory_free_mib": 81081,
            "utilization_gpu_pct": 0,
            "sm_clock_mhz": 345,
            "mig_mode": "Disabled",
        },
        "processes": [],
        "codes": [],
    },
    "14": {
        "format": "csv",
        "driver": "591.86",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA GeForce RTX 2080 SUPER",
            "fan_pct": 38,
            "temperature_c": 45,
            "pstate": "P2",
            "power_draw_w": 97.43,
            "power_limit_w": 250.0,
            "memory_used_mib": 1296,
            "memory_total_mib": 8192,
            "utilization_gpu_pct": 7,
            "driver_model": "WDDM",
            "mig_mode": None,
        },
        "codes": [],
    },
    "15": {
        "format": "csv",
        "gpus": 0,
        "processes": [
            (None, 11327, "C", "/root/tools/memhog", 2566),
            (None, 11328, "C", "/root/tools/memhog", 1542),
            (None, 11345, "C", "./gpu_burn", 15690),
        ],
    },
    "16": {
        "format": "dmon",
        "gpus": 1,
        "gpu0": {
            "index": 0,
            "power_draw_w": 636.0,
            "temperature_c": 65,
            "utilization_gpu_pct": 100,
            "utilization_memory_pct": 9,
            "sm_clock_mhz": 1980,
        },
        "samples": 5,
    },
    "17": {"format": "version", "driver": "610.57.04", "cuda": "13.3", "gpus": 0},
    "18": {
        "format": "table",
        "driver": "515.65.01",
        "cuda": "11.7",
        "gpus": 1,
        "gpu0": {
            "name": "Tesla T4",
            "temperature_c": 60,
            "power_draw_w": 30.0,
            "power_limit_w": 70.0,
            "memory_used_mib": 2,
            "memory_total_mib": 15360,
            "utilization_gpu_pct": 5,
            "mig_mode": None,
        },
        "processes": [],
        "codes": [],
    },
    "19": {
        "format": "table",
        "driver": "525.105.17",
        "cuda": "12.0",
        "gpus": 1,
        "gpu0": {
            "name": "Tesla T4",
            "bus_id": "00000000:00:04.0",
            "memory_used_mib": 387,
            "power_draw_w": 25.0,
            "utilization_gpu_pct": 0,
        },
        "processes": [],
        "codes": ["memory-without-processes"],
    },
    "21": {
        "format": "table",
        "driver": "550.144.03",
        "cuda": "12.4",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA A100-SXM4-40GB",
            "bus_id": "00000000:81:00.0",
            "power_draw_w": 52.0,
            "power_limit_w": 400.0,
            "memory_used_mib": 1,
            "memory_total_mib": 40960,
        },
        "processes": [],
        "codes": [],
    },
    "23": {
        "format": "table",
        "driver": "580.126.09",
        "cuda": "13.0",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA L40S",
            "power_draw_w": 104.0,
            "power_limit_w": 325.0,
            "memory_used_mib": 803,
        },
        "processes": [(0, 5997, "C", "python", 794)],
        "codes": [],
    },
    "24": {
        "format": "csv",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA H100 NVL",
            "pstate": "P0",
            "memory_total_mib": 95830,
            "memory_used_mib": 90098,
            "utilization_gpu_pct": 99,
        },
        "samples": 104,
        "codes": ["truncated-line"],
    },
    "26": {
        "format": "table",
        "driver": "460.91.03",
        "cuda": "11.2",
        "gpus": 1,
        "gpu0": {
            "name": "Tesla V100-SXM2...",
            "temperature_c": 37,
            "power_draw_w": 39.0,
            "power_limit_w": 300.0,
            "memory_used_mib": 2631,
            "memory_total_mib": 16160,
        },
        "processes": [(0, 3721, "C", "...nvs/codeparrot/bin/python", 2629)],
        "codes": [],
    },
    "27": {
        "format": "table",
        "driver": None,
        "gpus": 1,
        "gpu0": {
            "index": 1,
            "name": "Tesla V100-PCIE...",
            "bus_id": "00008ED0:00:00.0",
            "temperature_c": 29,
            "power_draw_w": None,
            "power_limit_w": 250.0,
            "memory_used_mib": 593,
            "memory_total_mib": 16160,
            "utilization_gpu_pct": 0,
        },
        "codes": ["no-header", "power-read-error"],
    },
    "28": {
        "format": "csv",
        "fields": I18N_FIELDS,
        "gpus": 1,
        "gpu0": {
            "memory_total_mib": 2004,
            "memory_free_mib": 2004,
            "memory_used_mib": 0,
            "temperature_c": 44,
            "fan_pct": None,
            "utilization_gpu_pct": 0,
        },
    },
    "29": {
        "format": "csv",
        "fields": I18N_FIELDS,
        "gpus": 1,
        "gpu0": {"memory_total_mib": 2004, "temperature_c": 44, "fan_pct": None},
    },
    "31": {
        "format": "table",
        "driver": "550.90.07",
        "cuda": "12.4",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA L4",
            "pstate": "P8",
            "power_draw_w": 16.0,
            "power_limit_w": 72.0,
            "memory_used_mib": 1,
            "memory_total_mib": 23034,
        },
        "processes": [],
        "codes": [],
    },
    "32": {
        "format": "table",
        "driver": "565.57.01",
        "cuda": "12.7",
        "gpus": 8,
        "gpu0": {"bus_id": "00000000:18:00.0", "power_draw_w": 100.0},
        "gpu7": {
            "index": 7,
            "name": "NVIDIA H100 80GB HBM3",
            "bus_id": "00000000:DB:00.0",
            "temperature_c": 29,
            "power_draw_w": 75.0,
            "memory_used_mib": 1,
        },
        "processes": [],
        "codes": [],
    },
    "35": {
        "format": "xml",
        "schema": 11,
        "driver": "515.105.01",
        "cuda": "11.7",
        "gpus": 1,
        "gpu0": {
            "name": "Tesla T4",
            "uuid": "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
            "bus_id": "00000000:00:1E.0",
            "fan_pct": None,
            "temperature_c": 40,
            "pstate": "P0",
            "power_draw_w": 26.78,
            "power_limit_w": 70.0,
            "memory_used_mib": 1032,
            "memory_total_mib": 15360,
            "utilization_gpu_pct": 0,
            "sm_clock_mhz": 585,
        },
        "processes": [(0, 675, "G", "/usr/lib/xorg/Xorg", 22), (0, 5762, "C", "python", 1005)],
        "codes": [],
    },
    "36": {
        "format": "xml",
        "schema": 11,
        "driver": "515.105.01",
        "cuda": "11.7",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA A10G",
            "fan_pct": 0,
            "temperature_c": 17,
            "pstate": "P8",
            "power_draw_w": 25.58,
            "power_limit_w": 300.0,
            "memory_used_mib": 22,
            "memory_total_mib": 23028,
        },
        "processes": [(0, 725, "G", "/usr/lib/xorg/Xorg", 22)],
        "codes": [],
    },
    "38": {
        "format": "xml",
        "schema": 13,
        "driver": "595.58.03",
        "cuda": "13.2",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA GeForce RTX 3080",
            "pstate": "P2",
            "temperature_c": 27,
            "power_draw_w": 139.62,
            "power_limit_w": 320.0,
            "memory_used_mib": 9184,
            "memory_total_mib": 10240,
            "utilization_gpu_pct": 65,
        },
        "processes": [],
        "codes": ["memory-without-processes"],
    },
    "40": {
        "format": "csv",
        "driver": "610.57.04",
        "gpus": 1,
        "gpu0": {
            "name": "NVIDIA GeForce RTX 2080 SUPER",
            "pstate": "P8",
            "power_draw_w": 39.17,
            "memory_used_mib": 211,
            "memory_total_mib": 8192,
            "utilization_gpu_pct": 0,
        },
    },
}

FILES = sorted(CORPUS.glob("[0-9]*")) if CORPUS.is_dir() else []
pytestmark = pytest.mark.skipif(not FILES, reason=f"shared corpus not found at {CORPUS}")


def test_every_corpus_file_has_expected_values():
    assert {path.name[:2] for path in FILES} == set(EXPECTED), "a file without expectations"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_corpus_file_parses_with_the_values_it_shows(path):
    expected = EXPECTED[path.name[:2]]
    text = path.read_text(encoding="utf-8").split("\n", 1)[1]  # drop the source line
    parsed = parse(text, expected.get("fields"))
    assert parsed["format"] == expected["format"]
    if "driver" in expected:
        assert parsed["driver_version"] == expected["driver"]
    if "cuda" in expected:
        assert parsed["cuda_version"] == expected["cuda"]
    if "schema" in expected:
        assert parsed["schema_version"] == expected["schema"]
    assert len(parsed["gpus"]) == expected["gpus"]
    for key, values in expected.items():
        if key.startswith("gpu") and key[3:].isdigit():
            gpu = parsed["gpus"][int(key[3:])]
            assert {k: gpu.get(k) for k in values} == values
    processes = [
        (p["gpu_index"], p["pid"], p["type"], p["name"], p["used_memory_mib"])
        for p in parsed["processes"]
    ]
    if isinstance(expected.get("processes"), list):
        assert processes == expected["processes"]
    elif "processes" in expected:
        assert len(processes) == expected["processes"]
    if "first_process" in expected:
        assert processes[0] == expected["first_process"]
    if "mig" in expected:
        assert [
            (m["gi_id"], m["ci_id"], m["mig_device"], m["memory_used_mib"], m["memory_total_mib"])
            for m in parsed["mig_devices"]
        ] == expected["mig"]
    if "mig_profiles" in expected:
        assert [m["profile"] for m in parsed["mig_devices"]] == expected["mig_profiles"]
    if "samples" in expected:
        assert len(parsed["samples"]) == expected["samples"]
    if "codes" in expected:
        assert [d["code"] for d in parsed["diagnostics"]] == expected["codes"]
