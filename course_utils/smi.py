"""``nvidia-smi``: run it safely, parse what it prints, and explain it in plain words.

:func:`parse` reads the default table (drivers 384 to 610, Linux and Windows/WDDM, MIG,
processes), ``--query-gpu``/``--query-compute-apps`` CSV with or without header and units,
``-q -x`` XML (DTD 11 to 13), ``-L``, ``dmon`` and ``--version`` into one JSON-ready dict.
Not-available values (``[N/A]``, ``ERR!``...) become ``None``; other input raises
:class:`SmiParseError` with one line. Imports no torch (``python -m course_utils smi``).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from importlib import resources
from typing import Any

_MISSING = ("N/A", "Not Supported", "Unknown Error", "ERR!", "Insufficient Permissions",
            "Requested functionality has been deprecated")  # fmt: skip
NOT_AVAILABLE = frozenset({"", "-", *_MISSING, *(f"[{text}]" for text in _MISSING)})
GPU_KEYS = ("index", "name", "uuid", "bus_id", "fan_pct", "temperature_c", "pstate",
            "power_draw_w", "power_limit_w", "memory_used_mib", "memory_total_mib",
            "utilization_gpu_pct")  # fmt: skip
PROCESS_KEYS = ("gpu_index", "pid", "type", "name", "used_memory_mib")
_INT_KEYS = frozenset({"index", "pid", "gpu_index", "gi_id", "ci_id", "mig_device"})


class SmiParseError(ValueError):
    """The text is not nvidia-smi output (or a noheader CSV came without its fields)."""


def is_not_available(text: str | None) -> bool:
    """True for the texts nvidia-smi prints instead of a value (:data:`NOT_AVAILABLE`)."""
    return text is None or text.strip() in NOT_AVAILABLE


def to_float(text: str | None) -> float | None:
    """The leading number of ``"97.43 W"``, ``"38%"``, ``"81559MiB"``; ``None`` if absent."""
    match = None if is_not_available(text) else re.match(r"\s*([-+]?\d+(?:\.\d+)?)", text or "")
    return float(match[1]) if match else None


def to_int(text: str | None) -> int | None:
    """:func:`to_float`, rounded: ``to_int("81559 MiB") == 81559``, ``to_int("[N/A]") is None``."""
    value = to_float(text)
    return None if value is None else round(value)


def _text(value: str | None) -> str | None:
    return None if is_not_available(value) else (value or "").strip()


def _value(key: str, raw: str | None) -> Any:
    """``raw`` converted for an entry's ``key``: watts are floats, counts and ids
    (``*_pct``, ``*_mib``, ``*_c``, ``*_mhz``, indices, PIDs) integers, the rest text."""
    if key.endswith("_w"):
        return to_float(raw)
    if key in _INT_KEYS or key.endswith(("_pct", "_mib", "_c", "_mhz")):
        return to_int(raw)
    return _text(raw)


def _result(form: str, **values: Any) -> dict[str, Any]:
    empty: dict[str, Any] = dict.fromkeys(("driver_version", "cuda_version"))
    return {"format": form, **empty, "gpus": [], "processes": [], "diagnostics": [], **values}


def strip_provenance(text: str) -> tuple[str | None, str]:
    """Split a leading ``# source: ...`` or ``# provenance: ...`` line (the course's
    samples and the shared corpus have one; real output never does) from the output."""
    first, _, rest = text.partition("\n")
    if re.match(r"#\s*(source|provenance)\s*:", first, re.IGNORECASE):
        return first.lstrip("#").strip(), rest
    return None, text


def detect_format(text: str) -> str:
    """Which form of nvidia-smi output ``text`` is; :class:`SmiParseError` if none."""
    stripped = text.strip()
    if not stripped:
        raise SmiParseError("empty input: expected nvidia-smi output")
    if stripped.startswith("<?xml") or "<nvidia_smi_log" in stripped[:2000]:
        return "xml"
    if re.search(r"^\s*NVIDIA-SMI version\s*:", stripped, re.MULTILINE):
        return "version"
    if re.match(r"#\s*gpu\s", stripped):
        return "dmon"
    if re.search(r"^GPU \d+: .*\(UUID: ", stripped, re.MULTILINE):
        return "list"
    if re.search(r"^\|.*\d+MiB\s*/\s*\d+MiB", stripped, re.MULTILINE) or (
        "NVIDIA-SMI" in stripped and "|" in stripped
    ):
        return "table"
    if "," in stripped.splitlines()[0]:
        return "csv"
    raise SmiParseError(
        "this is not nvidia-smi output (expected the default table, --query CSV, "
        "-q -x XML, -L, dmon or --version output)"
    )


def parse(text: str, fields: list[str] | None = None, query: str | None = None) -> dict[str, Any]:
    """Parse any nvidia-smi output (a leading provenance line is ignored) into ``format``,
    ``driver_version``, ``cuda_version``, ``gpus`` (dicts with :data:`GPU_KEYS` and more),
    ``processes`` (:data:`PROCESS_KEYS`...) and ``diagnostics`` (:func:`diagnose`).
    ``fields``: the queried fields, for ``csv,noheader``; ``query``: see :func:`parse_csv`.

    >>> parse("GPU 0: Tesla T4 (UUID: GPU-1234)")["gpus"][0]["name"]
    'Tesla T4'
    """
    _, body = strip_provenance(text)
    form = detect_format(body)
    parsers = {"table": parse_table, "xml": parse_xml, "list": parse_list}
    parsers |= {"dmon": parse_dmon, "version": parse_version}
    result = parse_csv(body, fields, query) if form == "csv" else parsers[form](body)
    result["diagnostics"] = result["diagnostics"] + diagnose(result)
    return result


# ----------------------------------------------------------------------------- table

_HEADER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+(?:Driver|KMD) Version:\s*(?P<driver>\S+)"
    r"(?:\s+CUDA(?: UMD)? Version:\s*(?P<cuda>\S+))?"
)
_GPU_LINE1 = re.compile(r"^\s*(\d+)\s+(.*?)\s+(On|Off|WDDM|TCC|MCDM|N/A)\s*$")
_GPU_LINE2 = re.compile(r"^\s*(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*/\s*(\S+)\s*$")
_BUS = re.compile(r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s+(\S+)")
_PROCESS = re.compile(
    r"^\s*(\d+|N/A)\s+(?:(\S+)\s+(\S+)\s+)?(\d+)\s+(C\+G|M\+C|C|G|M)\s+(.*?)\s+(\d+MiB|N/A)\s*$"
)
_MIG_ROW = re.compile(r"^\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+|N/A)\s*$")


def _memory_pair(cell: str) -> tuple[int | None, int | None]:
    match = re.search(r"(\S+?)\s*/\s*(\S+)", cell)
    return (to_int(match[1]), to_int(match[2])) if match else (None, None)


def parse_table(text: str) -> dict[str, Any]:
    """Parse the default ``nvidia-smi`` table (see :func:`parse`)."""
    result = _result("table", process_section=False)
    header = _HEADER.search(text)
    if header:
        result.update(driver_version=header["driver"], cuda_version=header["cuda"])
        result["smi_version"] = header["smi"]
        if "KMD Version" in header[0]:
            result["header_style"] = "kmd"  # driver 610+: KMD / CUDA UMD versions
    else:
        message = "no NVIDIA-SMI header line: a fragment of a table"
        result["diagnostics"].append({"code": "no-header", "message": message})
    section, gpu_line, mig = "gpus", 0, None
    gpu: dict[str, Any] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if "MIG devices:" in stripped:
            section, gpu = "mig", None
        elif stripped.startswith("| Processes:") or stripped == "|Processes:":
            section, gpu, result["process_section"] = "processes", None, True
        elif stripped.startswith(("+", "|=", "|-")):
            gpu, mig = None, None
        elif not stripped.startswith("|"):
            continue
        elif section == "processes":
            body = stripped.strip("|")
            if "No running processes found" in body:
                result["no_running_processes_line"] = True
            elif match := _PROCESS.match(body):
                keys = ("gpu_index", "gi_id", "ci_id", "pid", "type", "name", "used_memory_mib")
                process = {
                    key: _value(key, raw) for key, raw in zip(keys, match.groups(), strict=True)
                }
                result["processes"].append(process | {"name": match[6].strip()})
        elif len(cells := stripped.strip("|").split("|")) < 2:
            continue
        elif section == "mig":
            if row := _MIG_ROW.match(cells[0]):
                ids = ("gpu_index", "gi_id", "ci_id", "mig_device")
                mig = {key: to_int(raw) for key, raw in zip(ids, row.groups(), strict=True)}
                mig["memory_used_mib"], mig["memory_total_mib"] = _memory_pair(cells[1])
                sm = re.match(r"\s*(\d+)", cells[2]) if len(cells) > 2 else None
                mig["sm_count"] = int(sm[1]) if sm else None
                result.setdefault("mig_devices", []).append(mig)
            elif mig is not None and cells[0].strip() == "":
                mig["bar1_used_mib"], mig["bar1_total_mib"] = _memory_pair(cells[1])
        elif len(cells) < 3:
            continue
        elif gpu is None:
            if first := _GPU_LINE1.match(cells[0]):
                bus = _BUS.search(cells[1])
                gpu = dict.fromkeys(GPU_KEYS) | {
                    "index": int(first[1]),
                    "name": first[2].strip(),
                    "persistence_or_driver_model": first[3],
                    "bus_id": bus[1] if bus else None,
                    "display_active": bus[2] if bus else None,
                    "ecc_uncorrected": _text(cells[2]),
                    "mig_mode": None,
                    "compute_mode": None,
                    "raw_not_available": [],
                }
                if first[3] in ("WDDM", "TCC", "MCDM"):
                    gpu["driver_model"] = first[3]
                result["gpus"].append(gpu)
                gpu_line = 1
        elif (gpu_line := gpu_line + 1) == 2:  # fan, temperature, perf, power; memory; util
            second = _GPU_LINE2.match(cells[0])
            line2 = ("fan_pct", "temperature_c", "pstate", "power_draw_w", "power_limit_w")
            for key, raw in zip(line2, second.groups() if second else (), strict=False):
                gpu[key] = _value(key, raw)
                if raw.strip() == "ERR!":
                    gpu["raw_not_available"].append(f"{key}=ERR!")
            gpu["memory_used_mib"], gpu["memory_total_mib"] = _memory_pair(cells[1])
            if util := re.match(r"\s*(\S+)\s+(.*?)\s*$", cells[2]):
                gpu["utilization_gpu_pct"] = to_int(util[1])
                gpu["compute_mode"] = _text(util[2])
        elif gpu_line == 3:
            gpu["mig_mode"] = _text(cells[2])
    if not result["gpus"] and not result["processes"]:
        raise SmiParseError("no GPU rows found: this is not an nvidia-smi table")
    return result


# ----------------------------------------------------------------------------- CSV

# Names that mean the same field, as ``nvidia-smi --help-query-gpu`` lists them; a CSV
# header shows the first. Driver 530 renamed clocks_throttle_reasons.* clocks_event_reasons.*.
_REASONS = ("supported", "active", "gpu_idle", "applications_clocks_setting", "sw_power_cap",
            "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
            "sw_thermal_slowdown", "sync_boost")  # fmt: skip
GPU_FIELD_ALIASES: tuple[tuple[str, ...], ...] = (
    ("name", "gpu_name"), ("serial", "gpu_serial"), ("uuid", "gpu_uuid"),
    ("pci.bus_id", "gpu_bus_id"), ("inforom.img", "inforom.image"),
    ("inforom.pwr", "inforom.power"), ("gom.current", "gpu_operation_mode.current"),
    ("gom.pending", "gpu_operation_mode.pending"),
    *((f"clocks_event_reasons.{r}", f"clocks_throttle_reasons.{r}") for r in _REASONS),
    ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    ("retired_pages.double_bit.count", "retired_pages.dbe"),
    *((f"clocks.current.{long}", f"clocks.{short}")
      for long, short in (("graphics", "gr"), ("sm", "sm"), ("memory", "mem"), ("video", "video"))),
    *((f"clocks.{kind}.{long}", f"clocks.{kind}.{short}")
      for kind in ("applications", "default_applications", "max")
      for long, short in (("graphics", "gr"), ("memory", "mem"))),
)  # fmt: skip
# The same for ``--help-query-compute-apps``: there the gpu_* fields describe the GPU the
# process runs on, and "name" is the process's name.
PROCESS_FIELD_ALIASES = (("process_name", "name"), ("used_gpu_memory", "used_memory"))
# Fields only --query-compute-apps has: they tell the two queries apart.
PROCESS_ONLY_FIELDS = frozenset({"pid", "process_name", "used_gpu_memory", "used_memory"})


def _with_aliases(table: dict[str, str], groups: tuple[tuple[str, ...], ...]) -> dict[str, str]:
    """``table`` with every alias of a field it knows mapped like that field."""
    out = dict(table)
    for group in groups:
        known = next((table[name] for name in group if name in table), None)
        if known is not None:
            out.update({name: out.get(name, known) for name in group})
    return out


# --query-gpu field (any alias) -> key of a GPU entry; --query-compute-apps field -> key of
# a process entry. Several fields may feed one key: the first that has a value wins.
CSV_FIELDS = _with_aliases({
    "index": "index", "name": "name", "uuid": "uuid", "pci.bus_id": "bus_id",
    "fan.speed": "fan_pct", "temperature.gpu": "temperature_c", "pstate": "pstate",
    "power.draw": "power_draw_w", "power.draw.average": "power_draw_w",
    "power.draw.instant": "power_draw_w", "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w", "memory.used": "memory_used_mib",
    "memory.total": "memory_total_mib", "memory.free": "memory_free_mib",
    "utilization.gpu": "utilization_gpu_pct", "utilization.memory": "utilization_memory_pct",
    "clocks.current.sm": "sm_clock_mhz", "mig.mode.current": "mig_mode",
    "driver_model.current": "driver_model", "compute_mode": "compute_mode",
    "timestamp": "timestamp",
}, GPU_FIELD_ALIASES)  # fmt: skip
PROCESS_FIELDS = _with_aliases({
    "pid": "pid", "process_name": "name", "used_gpu_memory": "used_memory_mib",
    "gpu_uuid": "gpu_uuid", "gpu_bus_id": "gpu_bus_id", "gpu_name": "gpu_name",
}, PROCESS_FIELD_ALIASES)  # fmt: skip
_FIELD = re.compile(r"^[A-Za-z_][\w.]*(?: \[[^\]]+\])?$")


def _looks_like_header(cells: list[str]) -> bool:
    names = [cell.split(" [")[0] for cell in cells]
    return all(_FIELD.match(cell) for cell in cells) and any(
        "." in name or name in CSV_FIELDS or name in PROCESS_FIELDS for name in names
    )


def parse_csv(
    text: str, fields: list[str] | None = None, query: str | None = None
) -> dict[str, Any]:
    """Parse ``--query-gpu`` or ``--query-compute-apps`` CSV (see :func:`parse`).

    ``query`` (``"gpu"`` or ``"compute-apps"``) says which query made the CSV; by default
    a field only ``--query-compute-apps`` has (``pid``, ``used_memory``...) means compute
    apps. It decides what an ambiguous field means: ``gpu_uuid`` is the GPU's UUID in a
    GPU query and the UUID of the process's GPU in a compute-apps query; ``name`` is the
    GPU's or the process's.
    """
    if query not in (None, "gpu", "compute-apps"):
        raise ValueError(f"query={query!r}: use 'gpu' or 'compute-apps'")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    rows = [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]
    cut = [line.rstrip().endswith(",") for line in lines]  # a capture cut off mid-line
    if not rows:
        raise SmiParseError("empty CSV")
    result = _result("csv")
    if _looks_like_header(rows[0]):
        header, _ = rows.pop(0), cut.pop(0)
        names = [cell.split(" [")[0] for cell in header]
        result["units"] = {
            cell.split(" [")[0]: cell.split(" [")[1].rstrip("]") for cell in header if " [" in cell
        }
    elif fields:
        names = [field.strip() for field in fields]
    else:
        raise SmiParseError(
            "not nvidia-smi output, or CSV without a header: pass the queried fields "
            "(--fields, as in --query-gpu=...)"
        )
    result["fields"] = names
    complete = []
    for number, (row, is_cut) in enumerate(zip(rows, cut, strict=True), start=1):
        if len(row) == len(names) and not is_cut:
            complete.append(dict(zip(names, row, strict=True)))
            continue
        message = (
            f"CSV line {number} has {len(row)} values for {len(names)} fields "
            "(a cut-off capture?): skipped"
        )
        result["diagnostics"].append({"code": "truncated-line", "message": message})
    if not complete:
        raise SmiParseError(f"no CSV line has the {len(names)} fields {', '.join(names)}")
    aliases = {name for group in GPU_FIELD_ALIASES + PROCESS_FIELD_ALIASES for name in group}
    if not set(names) & (set(CSV_FIELDS) | set(PROCESS_FIELDS) | aliases | {"driver_version"}):
        raise SmiParseError("none of the CSV fields is an nvidia-smi query field")
    if query == "compute-apps" or (query is None and PROCESS_ONLY_FIELDS & set(names)):
        result["query"] = "compute-apps"
        result["processes"] = [_csv_entry(row, PROCESS_FIELDS, PROCESS_KEYS) for row in complete]
        for process in result["processes"]:
            process["type"] = process["type"] or "C"  # compute apps are compute processes
        return result
    result["query"] = "gpu"
    entries = [_csv_entry(row, CSV_FIELDS, GPU_KEYS) for row in complete]
    drivers = [row["driver_version"] for row in complete if "driver_version" in row]
    if drivers:
        result["driver_version"] = _text(drivers[0])
    mapped = {CSV_FIELDS.get(name) for name in names}
    identity = [key for key in ("index", "uuid", "bus_id") if key in mapped]
    if identity:  # one entry per GPU (the last reading of a looping query)
        by_gpu = {tuple(entry[key] for key in identity): entry for entry in entries}
        result["gpus"] = list(by_gpu.values())
    elif len(entries) > 1 and len({row.get("timestamp") for row in complete}) > 1:
        result["gpus"] = [entries[-1]]  # a time series of one GPU (-l / -lms loop)
    else:
        result["gpus"] = entries
    if len(entries) > len(result["gpus"]):
        result["samples"] = entries
    return result


def _csv_entry(row: dict[str, str], table: dict[str, str], keys: tuple[str, ...]) -> dict[str, Any]:
    entry: dict[str, Any] = dict.fromkeys(keys)
    filled: set[str] = set()
    for field, raw in row.items():
        key = table.get(field)
        if key is not None and (key not in filled or entry.get(key) is None):
            entry[key] = _value(key, raw)
            filled.add(key)
    return entry


# ----------------------------------------------------------------------------- XML

# GPU entry key -> paths under <gpu>, the first available wins. Power: DTD v11
# power_readings/*, v12+ gpu_power_readings/* (v13: average_ and instant_power_draw).
_XML_GPU = {
    "name": ("product_name",), "uuid": ("uuid",), "bus_id": ("pci/pci_bus_id",),
    "fan_pct": ("fan_speed",), "temperature_c": ("temperature/gpu_temp",),
    "pstate": ("performance_state",),
    "power_draw_w": ("power_readings/power_draw", "gpu_power_readings/power_draw",
                     "gpu_power_readings/average_power_draw",
                     "gpu_power_readings/instant_power_draw"),
    "power_limit_w": ("power_readings/enforced_power_limit", "power_readings/power_limit",
                      "gpu_power_readings/current_power_limit",
                      "gpu_power_readings/enforced_power_limit"),
    "memory_used_mib": ("fb_memory_usage/used",), "memory_total_mib": ("fb_memory_usage/total",),
    "memory_free_mib": ("fb_memory_usage/free",),
    "utilization_gpu_pct": ("utilization/gpu_util",),
    "utilization_memory_pct": ("utilization/memory_util",),
    "sm_clock_mhz": ("clocks/sm_clock",), "mig_mode": ("mig_mode/current_mig",),
}  # fmt: skip
_XML_PROCESS = {
    "gi_id": "gpu_instance_id", "ci_id": "compute_instance_id", "pid": "pid", "type": "type",
    "name": "process_name", "used_memory_mib": "used_memory",
}  # fmt: skip


def _find(element: ElementTree.Element, *paths: str) -> str | None:
    """The text of the first of ``paths`` that exists and is available."""
    for path in paths:
        found = element.find(path)
        if found is not None and found.text is not None and not is_not_available(found.text):
            return found.text.strip()
    return None


def parse_xml(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi -q -x`` (DTD versions 11 to 13; see :func:`parse`)."""
    try:
        root = ElementTree.fromstring(text.strip())
    except ElementTree.ParseError as error:
        raise SmiParseError(f"broken XML: {error}") from None
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"XML root is <{root.tag}>, not <nvidia_smi_log>")
    schema = re.search(r"nvsmi_device_v(\d+)\.dtd", text[:500])
    result = _result(
        "xml",
        driver_version=_find(root, "driver_version"),
        cuda_version=_find(root, "cuda_version"),
        schema_version=int(schema[1]) if schema else None,
    )
    for index, element in enumerate(root.findall("gpu")):
        gpu = dict.fromkeys(GPU_KEYS) | {"index": index}
        gpu |= {key: _value(key, _find(element, *paths)) for key, paths in _XML_GPU.items()}
        gpu["bus_id"] = gpu["bus_id"] or element.get("id")
        result["gpus"].append(gpu)
        processes = element.find("processes")
        if processes is not None:
            result["process_section"] = True
            for info in processes.findall("process_info"):
                found = {key: _value(key, _find(info, path)) for key, path in _XML_PROCESS.items()}
                result["processes"].append({"gpu_index": index, **found})
    return result


# ----------------------------------------------------------------------------- -L, dmon, --version

_LIST_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)]+)\)")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")


def parse_list(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi -L`` (GPUs and their MIG devices)."""
    result = _result("list")
    for line in text.splitlines():
        if gpu := _LIST_GPU.match(line):
            entry = {"index": int(gpu[1]), "name": gpu[2], "uuid": gpu[3]}
            result["gpus"].append(dict.fromkeys(GPU_KEYS) | entry)
        elif (mig := _LIST_MIG.match(line)) and result["gpus"]:
            owner, number = result["gpus"][-1]["index"], int(mig[2])
            device = {"gpu_index": owner, "profile": mig[1], "mig_device": number, "uuid": mig[3]}
            result.setdefault("mig_devices", []).append(device)
    return result


DMON_COLUMNS = {
    "gpu": "index", "pwr": "power_draw_w", "gtemp": "temperature_c", "sm": "utilization_gpu_pct",
    "mem": "utilization_memory_pct", "fb": "memory_used_mib", "pclk": "sm_clock_mhz",
    "mclk": "memory_clock_mhz",
}  # fmt: skip


def parse_dmon(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi dmon`` (one row per GPU per sample; the last row per GPU wins)."""
    result = _result("dmon")
    columns: list[str] = []
    samples = []
    for line in text.splitlines():
        values = line.split()
        if line.startswith("#"):
            words = line.lstrip("#").split()
            columns = words if words and words[0] == "gpu" else columns
        elif values and len(values) == len(columns):
            keys = (DMON_COLUMNS.get(column, column) for column in columns)
            pairs = zip(keys, values, strict=False)  # as long: checked above
            row = {k: to_float(v) if k == "power_draw_w" else to_int(v) for k, v in pairs}
            samples.append(dict.fromkeys(GPU_KEYS) | row)
    if not samples:
        raise SmiParseError("dmon header without rows")
    result["gpus"] = list({entry["index"]: entry for entry in samples}.values())
    result["samples"] = samples
    return result


def parse_version(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi --version`` (driver 610 reports KMD and CUDA UMD versions)."""
    lines = (line.partition(":") for line in text.splitlines())
    values = {key.strip().lower(): value.strip() for key, sep, value in lines if sep}

    def usable(*keys: str) -> str | None:
        found = (values.get(key) for key in keys)
        return next((v for v in found if v and not v.startswith("Deprecated")), None)

    return _result(
        "version",
        smi_version=usable("nvidia-smi version"),
        driver_version=usable("kmd version", "driver version"),
        cuda_version=usable("cuda umd version", "cuda version"),
    )


# diagnose's messages by code, formatted with the GPU's label and the values checked
_ADVICE = {
    "busy-but-low-power": "{label}: GPU-Util {util}% but power {draw:.0f} W of {cap:.0f} W "
    "({share:.0%}): kernels were running, yet the GPU was mostly idle. GPU-Util is the share of "
    "time ANY kernel ran, not how much of the GPU worked (many tiny kernels, or one small one, "
    "give 100%).",
    "memory-without-processes": "{label}: {used} MiB used but no process listed. The process "
    "runs in another container or PID namespace (Colab, Docker, Kubernetes), where nvidia-smi "
    "cannot see its PID; torch.cuda.memory_reserved() in that process shows it.",
    "mig-no-utilization": "{label}: GPU-Util is N/A because MIG is enabled: the GPU is split "
    "into instances and NVML reports no utilization for them (use DCGM metrics).",
    "memory-nearly-full": "{label}: memory {used} of {total} MiB ({share:.0%}) is in use: the "
    "next allocation may fail with CUDA out of memory. PyTorch's caching allocator keeps freed "
    "blocks reserved, so this can be cache, not tensors.",
    "power-read-error": "{label}: the power sensor reading failed (ERR!): a driver or board "
    "problem worth reporting to the machine's administrators.",
    "extra-contexts-on-gpu0": "{count} processes (PIDs {pids}) each hold memory on GPU 0 while "
    "also running on another GPU: each rank created a CUDA context on GPU 0. Call "
    "torch.cuda.set_device(local_rank) before any CUDA work in every rank (and map_location "
    "when loading checkpoints).",
    "wddm-no-process-memory": "Windows (WDDM) does not report memory per process: N/A is "
    "expected there.",
}


def diagnose(parsed: dict[str, Any]) -> list[dict[str, str]]:
    """What a learner should notice in a parsed output, as ``{"code", "message"}`` dicts
    (the codes are :data:`_ADVICE`'s keys).

    >>> gpu = dict(index=0, utilization_gpu_pct=100, power_draw_w=60.0, power_limit_w=700.0)
    >>> [d["code"] for d in diagnose({"gpus": [gpu], "processes": []})]
    ['busy-but-low-power']
    """
    found: list[dict[str, str]] = []

    def add(code: str, **values: Any) -> None:
        found.append({"code": code, "message": _ADVICE[code].format(**values)})

    processes, gpus = parsed.get("processes", []), parsed.get("gpus", [])
    for gpu in gpus:
        label = f"GPU {gpu.get('index')}"
        keys = ("utilization_gpu_pct", "power_draw_w", "power_limit_w")
        util, draw, cap, used, total = (
            gpu.get(k) for k in (*keys, "memory_used_mib", "memory_total_mib")
        )
        if util is not None and util >= 80 and draw is not None and cap and draw < 0.4 * cap:
            add("busy-but-low-power", label=label, util=util, draw=draw, cap=cap, share=draw / cap)
        on_gpu = any(p.get("gpu_index") == gpu.get("index") for p in processes)
        if parsed.get("process_section") and used is not None and used >= 100 and not on_gpu:
            add("memory-without-processes", label=label, used=used)
        if util is None and (gpu.get("mig_mode") or "").lower() in ("enabled", "on"):
            add("mig-no-utilization", label=label)
        if used is not None and total and used / total >= 0.95:
            add("memory-nearly-full", label=label, used=used, total=total, share=used / total)
        if "power_draw_w=ERR!" in gpu.get("raw_not_available", []):
            add("power-read-error", label=label)
    gpus_of: dict[int, set[int]] = {}
    for process in processes:
        if process.get("pid") is not None and process.get("gpu_index") is not None:
            gpus_of.setdefault(process["pid"], set()).add(process["gpu_index"])
    extra = sorted(pid for pid, on in gpus_of.items() if 0 in on and len(on) > 1)
    if len(extra) >= 2:
        add("extra-contexts-on-gpu0", count=len(extra), pids=", ".join(map(str, extra)))
    wddm = [p for p in processes if p.get("used_memory_mib") is None and p.get("type") == "C+G"]
    if wddm and any(gpu.get("driver_model") == "WDDM" for gpu in gpus):
        add("wddm-no-process-memory")
    return found


# explain's lines for a GPU: label, keys ("a of b"), unit, and what the value means
FIELD_NOTES = (
    ("fan", ("fan_pct",), "%", "fan speed the driver asks for; N/A on passively cooled GPUs"),
    ("temperature", ("temperature_c",), " °C", "GPU die temperature; clocks drop near the limit"),
    ("perf", ("pstate",), "", "performance state: P0 is full speed, P8 and up are idle clocks"),
    ("power", ("power_draw_w", "power_limit_w"), " W",
     "board power draw of the enforced limit; far below the limit means little work"),
    ("memory", ("memory_used_mib", "memory_total_mib"), " MiB",
     "used of total, by all processes' CUDA contexts and allocations; PyTorch's caching "
     "allocator reserves more than your tensors use"),
    ("GPU-Util", ("utilization_gpu_pct",), "%", "share of the last sample period, 1/6 s to "
     "1 s, in which at least one kernel ran; NOT how much of the GPU was busy"),
)  # fmt: skip


def _show(value: Any, unit: str = "") -> str:
    if value is None:
        return "N/A"
    return f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def explain(output: str | dict[str, Any], fields: list[str] | None = None) -> str:
    """The output (nvidia-smi text or :func:`parse`'s result) in plain words, field by
    field, then the diagnostics.

    >>> print(explain("GPU 0: Tesla T4 (UUID: GPU-1234)").splitlines()[1])
    GPU 0: Tesla T4
    """
    parsed = parse(output, fields) if isinstance(output, str) else output
    lines = [
        f"nvidia-smi output ({parsed['format']}): driver {parsed.get('driver_version') or '?'}"
        f", newest CUDA the driver supports {parsed.get('cuda_version') or '?'}"
    ]
    for number, gpu in enumerate(parsed["gpus"]):
        lines.append(f"GPU {gpu.get('index', '?')}: {gpu.get('name') or '(name not shown)'}")
        if gpu.get("bus_id"):
            lines.append(f"  bus id {gpu['bus_id']} (PCI address)")
        if gpu.get("uuid"):
            lines.append(f"  UUID {gpu['uuid']} (usable in CUDA_VISIBLE_DEVICES)")
        if parsed["format"] in ("list", "version"):
            continue
        for label, keys, unit, note in FIELD_NOTES:
            value = " of ".join(_show(gpu.get(key), unit) for key in keys)
            lines.append(f"  {label}: {value}" + ("" if number else f"  ({note})"))  # once
        if gpu.get("mig_mode"):
            lines.append(f"  MIG mode: {gpu['mig_mode']} (Enabled: split into isolated instances)")
    if parsed["processes"]:
        lines.append("processes (type C = compute, G = graphics, C+G = both):")
        lines += [
            f"  GPU {_show(p.get('gpu_index'))} PID {_show(p.get('pid'))} {_show(p.get('type'))} "
            f"{_show(p.get('name'))}: {_show(p.get('used_memory_mib'), ' MiB')}"
            for p in parsed["processes"]
        ]
    elif parsed.get("process_section"):
        lines.append("processes: none listed")
    lines.append("diagnostics:" if parsed["diagnostics"] else "diagnostics: nothing unusual")
    lines += [f"  [{d['code']}] {d['message']}" for d in parsed["diagnostics"]]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- running it

COLAB_PATH = "/opt/bin/nvidia-smi"


@dataclass(frozen=True)
class SmiRun:
    """What running nvidia-smi gave: ``output`` when ``ok``, otherwise a ``message``."""

    ok: bool
    output: str
    message: str


def find_smi() -> str | None:
    """The nvidia-smi binary on ``PATH``, or Colab's ``/opt/bin/nvidia-smi``; ``None``."""
    found = shutil.which("nvidia-smi")
    return found or (COLAB_PATH if os.access(COLAB_PATH, os.X_OK) else None)


def run_smi(args: list[str] | tuple[str, ...] = (), timeout_s: float = 10.0) -> SmiRun:
    """Run ``nvidia-smi *args`` (no shell) with a timeout (a GPU fallen off the bus hangs
    nvidia-smi, and must not hang a notebook); never raises."""
    if (binary := find_smi()) is None:
        where = f"no NVIDIA driver on this machine; looked on PATH and at {COLAB_PATH}"
        return SmiRun(False, "", f"nvidia-smi not found ({where})")
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return SmiRun(False, "", f"nvidia-smi did not answer within {timeout_s:g} s")
    except OSError as error:
        return SmiRun(False, "", f"could not run {binary}: {error}")
    if done.returncode != 0:
        reason = " ".join((done.stdout + done.stderr).split())[:300]
        return SmiRun(False, done.stdout, f"nvidia-smi failed ({done.returncode}): {reason}")
    return SmiRun(True, done.stdout, "ok")


def query_gpus(fields: list[str], timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The GPU entries of ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits``
    (``[]`` when nvidia-smi is missing or fails)."""
    run = run_smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout_s)
    try:
        return list(parse_csv(run.output, fields)["gpus"]) if run.ok else []
    except SmiParseError:
        return []


def _samples() -> dict[str, Any]:
    folder = resources.files("course_utils.samples").joinpath("nvidia-smi")
    entries = (entry for entry in folder.iterdir() if entry.name[0] not in "._")
    return {entry.name.rsplit(".", 1)[0]: entry for entry in entries}


def list_samples() -> list[str]:
    """Names of the nvidia-smi outputs shipped in ``course_utils/samples/nvidia-smi/``."""
    return sorted(_samples())


def sample_output(name: str) -> tuple[str, str]:
    """A shipped nvidia-smi output: ``(provenance, text)`` (the first line of each file
    says where it comes from; the notebook prints it).
    """
    if (entry := _samples().get(name)) is None:
        raise ValueError(f"no sample named {name!r}; available: {', '.join(list_samples())}")
    provenance, text = strip_provenance(entry.read_text(encoding="utf-8"))
    return provenance or "provenance: not recorded", text
