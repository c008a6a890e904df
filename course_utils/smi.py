"""``nvidia-smi``: run it safely, parse what it prints, and explain it in plain words.

:func:`parse` reads every form of output the course meets and returns one structure
(a ``dict`` that :func:`json.dumps` can print):

* the default table (drivers 384 to 610, Linux and Windows/WDDM, MIG device tables,
  process tables, ``No running processes found`` or an empty process section);
* ``--query-gpu=... --format=csv`` with or without header and units (for ``noheader``
  pass the queried ``fields``), and ``--query-compute-apps=...`` CSV;
* ``-q -x`` XML (DTD schema versions 11, 12 and 13);
* ``-L``, and also ``dmon`` and ``--version``.

Not-available values (``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Unknown Error]``,
``[Requested functionality has been deprecated]``, ``ERR!``) become ``None``. Input that
is not nvidia-smi output raises :class:`SmiParseError` (a ``ValueError``) with one line.

:func:`explain` turns a parsed output into plain words, field by field, with diagnostics
(:func:`diagnose`). :func:`run_smi` runs the binary with an argument list and a timeout;
:func:`sample_output` loads the outputs the course ships for machines without a GPU.
The command line is ``python -m course_utils smi parse|explain FILE``. This module
imports no torch. Used by notebook 02 and by :mod:`course_utils.monitor`.
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

FORMATS = ("table", "csv", "xml", "list", "dmon", "version")
NOT_AVAILABLE = frozenset(
    {
        "",
        "N/A",
        "[N/A]",
        "Not Supported",
        "[Not Supported]",
        "Unknown Error",
        "[Unknown Error]",
        "Requested functionality has been deprecated",
        "[Requested functionality has been deprecated]",
        "ERR!",
        "[ERR!]",
        "-",
        "Insufficient Permissions",
        "[Insufficient Permissions]",
    }
)
GPU_KEYS = (
    "index",
    "name",
    "uuid",
    "bus_id",
    "fan_pct",
    "temperature_c",
    "pstate",
    "power_draw_w",
    "power_limit_w",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_gpu_pct",
)
PROCESS_KEYS = ("gpu_index", "pid", "type", "name", "used_memory_mib")


class SmiParseError(ValueError):
    """The text is not nvidia-smi output (or a noheader CSV came without its fields)."""


# ----------------------------------------------------------------------------- values


def is_not_available(text: str | None) -> bool:
    """True for the texts nvidia-smi prints instead of a value.

    >>> is_not_available("[Not Supported]"), is_not_available("ERR!"), is_not_available("0")
    (True, True, False)
    """
    return text is None or text.strip() in NOT_AVAILABLE


def _number(text: str | None) -> float | None:
    """The leading number of ``"97.43 W"``, ``"38%"``, ``"81559MiB"``; ``None`` if absent."""
    if is_not_available(text):
        return None
    assert text is not None
    match = re.match(r"\s*([-+]?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def to_int(text: str | None) -> int | None:
    """An integer from a value with or without units; ``None`` when not available.

    >>> to_int("81559 MiB"), to_int("38 %"), to_int("[N/A]"), to_int("41C")
    (81559, 38, None, 41)
    """
    value = _number(text)
    return None if value is None else round(value)


def to_float(text: str | None) -> float | None:
    """A float from a value with or without units; ``None`` when not available.

    >>> to_float("97.43 W"), to_float("ERR!")
    (97.43, None)
    """
    return _number(text)


def _text(value: str | None) -> str | None:
    return None if is_not_available(value) else (value or "").strip()


def _empty_gpu(**values: Any) -> dict[str, Any]:
    gpu: dict[str, Any] = dict.fromkeys(GPU_KEYS)
    gpu.update(values)
    return gpu


def _result(form: str, **values: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "format": form,
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "processes": [],
        "diagnostics": [],
    }
    result.update(values)
    return result


def strip_provenance(text: str) -> tuple[str | None, str]:
    """Split a leading ``# source: ...`` or ``# provenance: ...`` line from the output.

    The course's sample outputs and the shared corpus start with such a line; real
    nvidia-smi output never does (``dmon`` headers start with ``# gpu``).

    >>> strip_provenance("# source: a test\\nGPU 0: Tesla T4 (UUID: GPU-1)")
    ('source: a test', 'GPU 0: Tesla T4 (UUID: GPU-1)')
    """
    first, _, rest = text.partition("\n")
    if re.match(r"#\s*(source|provenance)\s*:", first, re.IGNORECASE):
        return first.lstrip("#").strip(), rest
    return None, text


# ----------------------------------------------------------------------------- detection


def detect_format(text: str) -> str:
    """Which form of nvidia-smi output ``text`` is (one of :data:`FORMATS`).

    Raises :class:`SmiParseError` when it is none of them.

    >>> detect_format("GPU 0: Tesla T4 (UUID: GPU-1234)")
    'list'
    """
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
    """Parse any nvidia-smi output into one structure (see the module documentation).

    ``fields`` is the queried field list, needed for ``--format=csv,noheader``; ``query``
    says which query made a CSV (``"gpu"`` or ``"compute-apps"``, see :func:`parse_csv`).
    A leading provenance line (``# source: ...``) is ignored. The result has the keys
    ``format``, ``driver_version``, ``cuda_version``, ``gpus`` (dicts with
    :data:`GPU_KEYS` and more), ``processes`` (dicts with :data:`PROCESS_KEYS`) and
    ``diagnostics`` (from :func:`diagnose`).

    >>> parse("GPU 0: Tesla T4 (UUID: GPU-1234)")["gpus"][0]["name"]
    'Tesla T4'
    """
    _, body = strip_provenance(text)
    form = detect_format(body)
    parser = {
        "table": parse_table,
        "xml": parse_xml,
        "list": parse_list,
        "dmon": parse_dmon,
        "version": parse_version,
    }.get(form)
    result = parse_csv(body, fields, query) if parser is None else parser(body)
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
_MEMORY = re.compile(r"(\S+?)\s*/\s*(\S+)")
_PROCESS = re.compile(
    r"^\s*(\d+|N/A)\s+(?:(\S+)\s+(\S+)\s+)?(\d+)\s+(C\+G|M\+C|C|G|M)\s+(.*?)\s+(\d+MiB|N/A)\s*$"
)
_MIG_ROW = re.compile(r"^\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+|N/A)\s*$")


def _cells(line: str) -> list[str]:
    return line.strip().strip("|").split("|")


def parse_table(text: str) -> dict[str, Any]:
    """Parse the default ``nvidia-smi`` table (see :func:`parse`)."""
    result = _result("table")
    header = _HEADER.search(text)
    if header:
        result["driver_version"] = header["driver"]
        result["cuda_version"] = header["cuda"]
        result["smi_version"] = header["smi"]
        if "KMD Version" in header.group(0):
            result["header_style"] = "kmd"  # driver 610+: KMD / CUDA UMD versions
    else:
        result["diagnostics"].append(
            {"code": "no-header", "message": "no NVIDIA-SMI header line: a fragment of a table"}
        )
    section = "gpus"
    processes_section = False
    gpu: dict[str, Any] | None = None
    gpu_line = 0
    mig: dict[str, Any] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if "MIG devices:" in stripped:
            section, gpu = "mig", None
            continue
        if stripped.startswith("| Processes:") or stripped == "|Processes:":
            section, gpu, processes_section = "processes", None, True
            continue
        if stripped.startswith("+") or stripped.startswith("|=") or stripped.startswith("|-"):
            gpu, mig = None, None
            continue
        if not stripped.startswith("|"):
            continue
        cells = _cells(stripped)
        if section == "gpus":
            if gpu is None and len(cells) >= 3:
                first = _GPU_LINE1.match(cells[0])
                if first:
                    bus = _BUS.search(cells[1])
                    gpu = _empty_gpu(
                        index=int(first[1]),
                        name=first[2].strip(),
                        persistence_or_driver_model=first[3],
                        bus_id=bus[1] if bus else None,
                        display_active=bus[2] if bus else None,
                        ecc_uncorrected=_text(cells[2]),
                        mig_mode=None,
                        compute_mode=None,
                        raw_not_available=[],
                    )
                    if first[3] in ("WDDM", "TCC", "MCDM"):
                        gpu["driver_model"] = first[3]
                    result["gpus"].append(gpu)
                    gpu_line = 1
                continue
            if gpu is not None and len(cells) >= 3:
                gpu_line += 1
                if gpu_line == 2:
                    _table_gpu_line2(gpu, cells)
                elif gpu_line == 3:
                    gpu["mig_mode"] = _text(cells[2])
        elif section == "mig" and len(cells) >= 2:
            row = _MIG_ROW.match(cells[0])
            if row:
                used, total = _memory_pair(cells[1])
                sm = re.match(r"\s*(\d+)", cells[2]) if len(cells) > 2 else None
                mig = {
                    "gpu_index": int(row[1]),
                    "gi_id": to_int(row[2]),
                    "ci_id": to_int(row[3]),
                    "mig_device": to_int(row[4]),
                    "memory_used_mib": used,
                    "memory_total_mib": total,
                    "sm_count": int(sm[1]) if sm else None,
                }
                result.setdefault("mig_devices", []).append(mig)
            elif mig is not None and cells[0].strip() == "":
                used, total = _memory_pair(cells[1])
                mig["bar1_used_mib"], mig["bar1_total_mib"] = used, total
        elif section == "processes":
            body = stripped.strip("|")
            if "No running processes found" in body:
                result["no_running_processes_line"] = True
                continue
            match = _PROCESS.match(body)
            if match:
                result["processes"].append(
                    {
                        "gpu_index": to_int(match[1]),
                        "gi_id": to_int(match[2]),
                        "ci_id": to_int(match[3]),
                        "pid": int(match[4]),
                        "type": match[5],
                        "name": match[6].strip(),
                        "used_memory_mib": to_int(match[7]),
                    }
                )
    if not result["gpus"] and not result["processes"]:
        raise SmiParseError("no GPU rows found: this is not an nvidia-smi table")
    result["process_section"] = processes_section
    return result


def _memory_pair(cell: str) -> tuple[int | None, int | None]:
    match = _MEMORY.search(cell)
    if not match:
        return None, None
    return to_int(match[1]), to_int(match[2])


def _table_gpu_line2(gpu: dict[str, Any], cells: list[str]) -> None:
    second = _GPU_LINE2.match(cells[0])
    if second:
        fan, temperature, perf, draw, cap = second.groups()
        gpu["fan_pct"] = to_int(fan)
        gpu["temperature_c"] = to_int(temperature)
        gpu["pstate"] = _text(perf)
        gpu["power_draw_w"] = to_float(draw)
        gpu["power_limit_w"] = to_float(cap)
        for key, raw in (("fan_pct", fan), ("power_draw_w", draw), ("power_limit_w", cap)):
            if raw.strip() == "ERR!":
                gpu["raw_not_available"].append(f"{key}=ERR!")
    gpu["memory_used_mib"], gpu["memory_total_mib"] = _memory_pair(cells[1])
    util = re.match(r"\s*(\S+)\s+(.*?)\s*$", cells[2])
    if util:
        gpu["utilization_gpu_pct"] = to_int(util[1])
        gpu["compute_mode"] = _text(util[2])


# ----------------------------------------------------------------------------- CSV

# --query-gpu field -> key of a GPU entry (several fields may feed one key: first wins)
_GPU_FIELDS: dict[str, tuple[str, str]] = {
    "index": ("index", "int"),
    "name": ("name", "str"),
    "uuid": ("uuid", "str"),
    "pci.bus_id": ("bus_id", "str"),
    "fan.speed": ("fan_pct", "int"),
    "temperature.gpu": ("temperature_c", "int"),
    "pstate": ("pstate", "str"),
    "power.draw": ("power_draw_w", "float"),
    "power.draw.average": ("power_draw_w", "float"),
    "power.draw.instant": ("power_draw_w", "float"),
    "power.limit": ("power_limit_w", "float"),
    "enforced.power.limit": ("power_limit_w", "float"),
    "memory.used": ("memory_used_mib", "int"),
    "memory.total": ("memory_total_mib", "int"),
    "memory.free": ("memory_free_mib", "int"),
    "utilization.gpu": ("utilization_gpu_pct", "int"),
    "utilization.memory": ("utilization_memory_pct", "int"),
    "clocks.sm": ("sm_clock_mhz", "int"),
    "clocks.current.sm": ("sm_clock_mhz", "int"),
    "mig.mode.current": ("mig_mode", "str"),
    "driver_model.current": ("driver_model", "str"),
    "compute_mode": ("compute_mode", "str"),
    "timestamp": ("timestamp", "str"),
}
_PROCESS_FIELDS: dict[str, tuple[str, str]] = {
    "pid": ("pid", "int"),
    "process_name": ("name", "str"),
    "name": ("name", "str"),
    "used_gpu_memory": ("used_memory_mib", "int"),
    "used_memory": ("used_memory_mib", "int"),
    "gpu_uuid": ("gpu_uuid", "str"),
    "gpu_bus_id": ("gpu_bus_id", "str"),
    "gpu_name": ("gpu_name", "str"),
}

# Names that mean the same field, as ``nvidia-smi --help-query-gpu`` lists them
# ("name" or "gpu_name", ...): nvidia-smi accepts either in --query-gpu, and a CSV header
# shows the first. Driver 530 renamed clocks_throttle_reasons.* to clocks_event_reasons.*.
_REASONS = (
    "supported", "active", "gpu_idle", "applications_clocks_setting", "sw_power_cap",
    "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown",
    "sync_boost",
)  # fmt: skip
GPU_FIELD_ALIASES: tuple[tuple[str, ...], ...] = (
    ("name", "gpu_name"),
    ("serial", "gpu_serial"),
    ("uuid", "gpu_uuid"),
    ("pci.bus_id", "gpu_bus_id"),
    ("inforom.img", "inforom.image"),
    ("inforom.pwr", "inforom.power"),
    ("gom.current", "gpu_operation_mode.current"),
    ("gom.pending", "gpu_operation_mode.pending"),
    *((f"clocks_event_reasons.{r}", f"clocks_throttle_reasons.{r}") for r in _REASONS),
    ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    ("retired_pages.double_bit.count", "retired_pages.dbe"),
    ("clocks.current.graphics", "clocks.gr"),
    ("clocks.current.sm", "clocks.sm"),
    ("clocks.current.memory", "clocks.mem"),
    ("clocks.current.video", "clocks.video"),
    ("clocks.applications.graphics", "clocks.applications.gr"),
    ("clocks.applications.memory", "clocks.applications.mem"),
    ("clocks.default_applications.graphics", "clocks.default_applications.gr"),
    ("clocks.default_applications.memory", "clocks.default_applications.mem"),
    ("clocks.max.graphics", "clocks.max.gr"),
    ("clocks.max.memory", "clocks.max.mem"),
)
# The same for ``nvidia-smi --help-query-compute-apps``. There the gpu_* fields describe
# the GPU the process runs on, and "name" is the process's name, not the GPU's.
PROCESS_FIELD_ALIASES: tuple[tuple[str, ...], ...] = (
    ("process_name", "name"),
    ("used_gpu_memory", "used_memory"),
)
# Fields only --query-compute-apps has: they tell the two queries apart.
PROCESS_ONLY_FIELDS = frozenset({"pid", "process_name", "used_gpu_memory", "used_memory"})


def canonical_field(name: str, query: str = "gpu") -> str:
    """The name nvidia-smi prints in a CSV header for a queried field (its first alias),
    in the context of ``query`` (``"gpu"`` or ``"compute-apps"``).

    >>> canonical_field("gpu_uuid"), canonical_field("clocks.sm")
    ('uuid', 'clocks.current.sm')
    >>> canonical_field("name", "compute-apps"), canonical_field("gpu_uuid", "compute-apps")
    ('process_name', 'gpu_uuid')
    """
    groups = PROCESS_FIELD_ALIASES if query == "compute-apps" else GPU_FIELD_ALIASES
    return next((group[0] for group in groups if name in group), name)


def _with_aliases(
    table: dict[str, tuple[str, str]], groups: tuple[tuple[str, ...], ...]
) -> dict[str, tuple[str, str]]:
    """``table`` with every alias of a field it knows mapped like that field."""
    out = dict(table)
    for group in groups:
        known = next((table[name] for name in group if name in table), None)
        if known is not None:
            for name in group:
                out.setdefault(name, known)
    return out


# --query-gpu field (any alias) -> key of a GPU entry; --query-compute-apps field -> key of
# a process entry. Several fields may feed one key: the first that has a value wins.
CSV_FIELDS = _with_aliases(_GPU_FIELDS, GPU_FIELD_ALIASES)
PROCESS_FIELDS = _with_aliases(_PROCESS_FIELDS, PROCESS_FIELD_ALIASES)
_FIELD = re.compile(r"^[A-Za-z_][\w.]*(?: \[[^\]]+\])?$")


def _convert(raw: str, kind: str) -> Any:
    if kind == "int":
        return to_int(raw)
    if kind == "float":
        return to_float(raw)
    return _text(raw)


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
    a field only ``--query-compute-apps`` has (``pid``, ``process_name``,
    ``used_memory``...) means compute apps, anything else a GPU query. It decides what an
    ambiguous field means: ``gpu_uuid`` is the GPU's UUID in a GPU query and the UUID of
    the process's GPU in a compute-apps query; ``name`` is the GPU's or the process's.
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
        header = rows.pop(0)
        cut.pop(0)
        units = {
            cell.split(" [")[0]: cell.split(" [")[1].rstrip("]") for cell in header if " [" in cell
        }
        names = [cell.split(" [")[0] for cell in header]
        result["units"] = units
    elif fields:
        names = [field.strip() for field in fields]
    else:
        raise SmiParseError(
            "not nvidia-smi output, or CSV without a header: pass the queried fields "
            "(--fields, as in --query-gpu=...)"
        )
    result["fields"] = names
    complete = []
    for number, row in enumerate(rows, start=1):
        if len(row) != len(names) or cut[number - 1]:
            result["diagnostics"].append(
                {
                    "code": "truncated-line",
                    "message": f"CSV line {number} has {len(row)} values for {len(names)} "
                    "fields (a cut-off capture?): skipped",
                }
            )
            continue
        complete.append(dict(zip(names, row, strict=True)))
    if not complete:
        raise SmiParseError(f"no CSV line has the {len(names)} fields {', '.join(names)}")
    aliases = {name for group in GPU_FIELD_ALIASES + PROCESS_FIELD_ALIASES for name in group}
    known = set(names) & (set(CSV_FIELDS) | set(PROCESS_FIELDS) | aliases | {"driver_version"})
    if not known:
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
    identity = [key for key in ("index", "uuid", "bus_id") if key in {k for k, _ in _mapped(names)}]
    if identity:  # one entry per GPU (the last reading of a looping query)
        by_gpu: dict[tuple[Any, ...], dict[str, Any]] = {}
        for entry in entries:
            by_gpu[tuple(entry[key] for key in identity)] = entry
        result["gpus"] = list(by_gpu.values())
    elif len(entries) > 1 and len({row.get("timestamp") for row in complete}) > 1:
        result["gpus"] = [entries[-1]]  # a time series of one GPU (-l / -lms loop)
    else:
        result["gpus"] = entries
    if len(entries) > len(result["gpus"]):
        result["samples"] = entries
    return result


def _mapped(names: list[str]) -> list[tuple[str, str]]:
    return [CSV_FIELDS[name] for name in names if name in CSV_FIELDS]


def _csv_entry(
    row: dict[str, str], table: dict[str, tuple[str, str]], keys: tuple[str, ...]
) -> dict[str, Any]:
    entry: dict[str, Any] = dict.fromkeys(keys)
    filled: set[str] = set()
    for field, raw in row.items():
        if field not in table:
            continue
        key, kind = table[field]
        value = _convert(raw, kind)
        if key not in filled or entry.get(key) is None:
            entry[key] = value
            filled.add(key)
    return entry


# ----------------------------------------------------------------------------- XML


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
        gpu = _empty_gpu(
            index=index,
            name=_find(element, "product_name"),
            uuid=_find(element, "uuid"),
            bus_id=_find(element, "pci/pci_bus_id") or element.get("id"),
            fan_pct=to_int(_find(element, "fan_speed")),
            temperature_c=to_int(_find(element, "temperature/gpu_temp")),
            pstate=_find(element, "performance_state"),
            # v11: power_readings/power_draw; v12+: gpu_power_readings (v13: average_*)
            power_draw_w=to_float(
                _find(
                    element,
                    "power_readings/power_draw",
                    "gpu_power_readings/power_draw",
                    "gpu_power_readings/average_power_draw",
                    "gpu_power_readings/instant_power_draw",
                )
            ),
            power_limit_w=to_float(
                _find(
                    element,
                    "power_readings/enforced_power_limit",
                    "power_readings/power_limit",
                    "gpu_power_readings/current_power_limit",
                    "gpu_power_readings/enforced_power_limit",
                )
            ),
            memory_used_mib=to_int(_find(element, "fb_memory_usage/used")),
            memory_total_mib=to_int(_find(element, "fb_memory_usage/total")),
            memory_free_mib=to_int(_find(element, "fb_memory_usage/free")),
            utilization_gpu_pct=to_int(_find(element, "utilization/gpu_util")),
            utilization_memory_pct=to_int(_find(element, "utilization/memory_util")),
            sm_clock_mhz=to_int(_find(element, "clocks/sm_clock")),
            mig_mode=_find(element, "mig_mode/current_mig"),
        )
        result["gpus"].append(gpu)
        processes = element.find("processes")
        if processes is not None:
            result["process_section"] = True
            for info in processes.findall("process_info"):
                result["processes"].append(
                    {
                        "gpu_index": index,
                        "gi_id": to_int(_find(info, "gpu_instance_id")),
                        "ci_id": to_int(_find(info, "compute_instance_id")),
                        "pid": to_int(_find(info, "pid")),
                        "type": _find(info, "type"),
                        "name": _find(info, "process_name"),
                        "used_memory_mib": to_int(_find(info, "used_memory")),
                    }
                )
    return result


# ----------------------------------------------------------------------------- -L, dmon, --version

_LIST_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)]+)\)")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")


def parse_list(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi -L`` (GPUs and their MIG devices)."""
    result = _result("list")
    for line in text.splitlines():
        gpu = _LIST_GPU.match(line)
        mig = _LIST_MIG.match(line)
        if gpu:
            result["gpus"].append(_empty_gpu(index=int(gpu[1]), name=gpu[2], uuid=gpu[3]))
        elif mig and result["gpus"]:
            result.setdefault("mig_devices", []).append(
                {
                    "gpu_index": result["gpus"][-1]["index"],
                    "profile": mig[1],
                    "mig_device": int(mig[2]),
                    "uuid": mig[3],
                }
            )
    return result


DMON_COLUMNS = {
    "gpu": "index",
    "pwr": "power_draw_w",
    "gtemp": "temperature_c",
    "sm": "utilization_gpu_pct",
    "mem": "utilization_memory_pct",
    "fb": "memory_used_mib",
    "pclk": "sm_clock_mhz",
    "mclk": "memory_clock_mhz",
}


def parse_dmon(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi dmon`` (one row per GPU per sample; the last row per GPU wins)."""
    result = _result("dmon")
    columns: list[str] = []
    samples = []
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if words and words[0] == "gpu":
                columns = words
            continue
        values = line.split()
        if not values or len(values) != len(columns):
            continue
        entry = _empty_gpu()
        for column, value in zip(columns, values, strict=True):
            key = DMON_COLUMNS.get(column, column)
            entry[key] = to_float(value) if key == "power_draw_w" else to_int(value)
        samples.append(entry)
    if not samples:
        raise SmiParseError("dmon header without rows")
    by_gpu = {entry["index"]: entry for entry in samples}
    result["gpus"] = list(by_gpu.values())
    result["samples"] = samples
    return result


def parse_version(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi --version`` (driver 610 reports KMD and CUDA UMD versions)."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip().lower()] = value.strip()

    def usable(*keys: str) -> str | None:
        for key in keys:
            value = values.get(key)
            if value and not value.startswith("Deprecated"):
                return value
        return None

    return _result(
        "version",
        smi_version=usable("nvidia-smi version"),
        driver_version=usable("kmd version", "driver version"),
        cuda_version=usable("cuda umd version", "cuda version"),
    )


# ----------------------------------------------------------------------------- diagnose / explain


def _diagnostic(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def diagnose(parsed: dict[str, Any]) -> list[dict[str, str]]:
    """What a learner should notice in a parsed output, as ``{"code", "message"}`` dicts.

    Codes: ``busy-but-low-power``, ``memory-without-processes``, ``mig-no-utilization``,
    ``memory-nearly-full``, ``extra-contexts-on-gpu0``, ``power-read-error``,
    ``wddm-no-process-memory``.

    >>> gpu = dict(index=0, utilization_gpu_pct=100, power_draw_w=60.0, power_limit_w=700.0)
    >>> [d["code"] for d in diagnose({"gpus": [gpu], "processes": []})]
    ['busy-but-low-power']
    """
    found = []
    processes = parsed.get("processes", [])
    for gpu in parsed.get("gpus", []):
        label = f"GPU {gpu.get('index')}"
        util, draw, cap = (
            gpu.get(k) for k in ("utilization_gpu_pct", "power_draw_w", "power_limit_w")
        )
        if util is not None and util >= 80 and draw is not None and cap and draw < 0.4 * cap:
            found.append(
                _diagnostic(
                    "busy-but-low-power",
                    f"{label}: GPU-Util {util}% but power {draw:.0f} W of {cap:.0f} W "
                    f"({draw / cap:.0%}): kernels were running, yet the GPU was mostly idle. "
                    "GPU-Util is the share of time ANY kernel ran, not how much of the GPU "
                    "worked (many tiny kernels, or one small one, give 100%).",
                )
            )
        used, total = gpu.get("memory_used_mib"), gpu.get("memory_total_mib")
        on_gpu = [p for p in processes if p.get("gpu_index") == gpu.get("index")]
        if parsed.get("process_section") and used is not None and used >= 100 and not on_gpu:
            found.append(
                _diagnostic(
                    "memory-without-processes",
                    f"{label}: {used} MiB used but no process listed. The process runs in another "
                    "container or PID namespace (Colab, Docker, Kubernetes), where nvidia-smi "
                    "cannot see its PID; torch.cuda.memory_reserved() in that process shows it.",
                )
            )
        mig = (gpu.get("mig_mode") or "").lower()
        if util is None and mig in ("enabled", "on"):
            found.append(
                _diagnostic(
                    "mig-no-utilization",
                    f"{label}: GPU-Util is N/A because MIG is enabled: the GPU is split into "
                    "instances and NVML reports no utilization for them (use DCGM metrics).",
                )
            )
        if used is not None and total and used / total >= 0.95:
            found.append(
                _diagnostic(
                    "memory-nearly-full",
                    f"{label}: memory {used} of {total} MiB ({used / total:.0%}) is in use: the "
                    "next allocation may fail with CUDA out of memory. PyTorch's caching "
                    "allocator keeps freed blocks reserved, so this can be cache, not tensors.",
                )
            )
        if any(item.startswith("power_draw_w=ERR!") for item in gpu.get("raw_not_available", [])):
            found.append(
                _diagnostic(
                    "power-read-error",
                    f"{label}: the power sensor reading failed (ERR!): a driver or board problem "
                    "worth reporting to the machine's administrators.",
                )
            )
    extra = _extra_contexts_on_gpu0(processes)
    if extra:
        found.append(
            _diagnostic(
                "extra-contexts-on-gpu0",
                f"{len(extra)} processes (PIDs {', '.join(map(str, extra))}) each hold memory on "
                "GPU 0 while also running on another GPU: each rank created a CUDA context on "
                "GPU 0. Call torch.cuda.set_device(local_rank) before any CUDA work in every "
                "rank (and map_location when loading checkpoints).",
            )
        )
    wddm = [p for p in processes if p.get("used_memory_mib") is None and p.get("type") == "C+G"]
    if wddm and any(gpu.get("driver_model") == "WDDM" for gpu in parsed.get("gpus", [])):
        found.append(
            _diagnostic(
                "wddm-no-process-memory",
                "Windows (WDDM) does not report memory per process: N/A is expected there.",
            )
        )
    return found


def _extra_contexts_on_gpu0(processes: list[dict[str, Any]]) -> list[int]:
    gpus_of: dict[int, set[int]] = {}
    for process in processes:
        if process.get("pid") is not None and process.get("gpu_index") is not None:
            gpus_of.setdefault(process["pid"], set()).add(process["gpu_index"])
    pids = sorted(pid for pid, gpus in gpus_of.items() if 0 in gpus and len(gpus) > 1)
    return pids if len(pids) >= 2 else []


FIELD_NOTES = {
    "fan_pct": "fan speed the driver asks for; N/A on passively cooled server GPUs",
    "temperature_c": "GPU die temperature; clocks drop near the slowdown limit",
    "pstate": "performance state: P0 is full speed, P8 and up are idle clocks",
    "power": "board power draw / enforced limit; far below the limit means little work",
    "memory": "memory held by all processes' CUDA contexts and allocations (PyTorch's "
    "caching allocator reserves more than your tensors use)",
    "utilization_gpu_pct": "GPU-Util: share of the last sample period (1/6 s to 1 s) in "
    "which at least one kernel ran; NOT how much of the GPU was busy",
}


def explain(output: str | dict[str, Any], fields: list[str] | None = None) -> str:
    """The output in plain words, field by field, then the diagnostics.

    ``output`` is nvidia-smi text or the result of :func:`parse`.

    >>> print(explain("GPU 0: Tesla T4 (UUID: GPU-1234)").splitlines()[1])
    GPU 0: Tesla T4
    """
    parsed = parse(output, fields) if isinstance(output, str) else output
    lines = [
        f"nvidia-smi output ({parsed['format']}): driver {parsed.get('driver_version') or '?'}"
        f", newest CUDA the driver supports {parsed.get('cuda_version') or '?'}"
    ]
    for number, gpu in enumerate(parsed["gpus"]):

        def note(key: str, first: bool = number == 0) -> str:
            return f"  ({FIELD_NOTES[key]})" if first else ""  # explain once, not per GPU

        lines.append(f"GPU {gpu.get('index', '?')}: {gpu.get('name') or '(name not shown)'}")
        if gpu.get("bus_id"):
            lines.append(f"  bus id {gpu['bus_id']} (PCI address)")
        if gpu.get("uuid"):
            lines.append(f"  UUID {gpu['uuid']} (usable in CUDA_VISIBLE_DEVICES)")
        if parsed["format"] in ("list", "version"):
            continue
        lines += [
            f"  fan: {_show(gpu.get('fan_pct'), '%')}{note('fan_pct')}",
            f"  temperature: {_show(gpu.get('temperature_c'), ' °C')}{note('temperature_c')}",
            f"  perf: {_show(gpu.get('pstate'))}{note('pstate')}",
            f"  power: {_show(gpu.get('power_draw_w'), ' W')} of "
            f"{_show(gpu.get('power_limit_w'), ' W')}{note('power')}",
            f"  memory: {_show(gpu.get('memory_used_mib'), ' MiB')} used of "
            f"{_show(gpu.get('memory_total_mib'), ' MiB')}{note('memory')}",
            f"  GPU-Util: {_show(gpu.get('utilization_gpu_pct'), '%')}"
            f"{note('utilization_gpu_pct')}",
        ]
        if gpu.get("mig_mode"):
            lines.append(f"  MIG mode: {gpu['mig_mode']} (Enabled: split into isolated instances)")
    if parsed["processes"]:
        lines.append("processes (type C = compute, G = graphics, C+G = both):")
        for p in parsed["processes"]:
            lines.append(
                f"  GPU {_show(p.get('gpu_index'))} PID {_show(p.get('pid'))} "
                f"{_show(p.get('type'))} {_show(p.get('name'))}: "
                f"{_show(p.get('used_memory_mib'), ' MiB')}"
            )
    elif parsed.get("process_section"):
        lines.append("processes: none listed")
    if parsed["diagnostics"]:
        lines.append("diagnostics:")
        lines += [f"  [{d['code']}] {d['message']}" for d in parsed["diagnostics"]]
    else:
        lines.append("diagnostics: nothing unusual")
    return "\n".join(lines)


def _show(value: Any, unit: str = "") -> str:
    if value is None:
        return "N/A"
    if isinstance(value, float):
        return f"{value:g}{unit}"
    return f"{value}{unit}"


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
    if found:
        return found
    return COLAB_PATH if os.access(COLAB_PATH, os.X_OK) else None


def run_smi(args: list[str] | tuple[str, ...] = (), timeout_s: float = 10.0) -> SmiRun:
    """Run ``nvidia-smi *args`` (no shell) with a timeout; never raises.

    A hung nvidia-smi (a GPU falling off the bus does that) must not hang a notebook.

    >>> run_smi(["-L"], timeout_s=5).ok in (True, False)
    True
    """
    binary = find_smi()
    if binary is None:
        return SmiRun(
            False,
            "",
            "nvidia-smi not found (no NVIDIA driver on this machine; "
            f"looked on PATH and at {COLAB_PATH})",
        )
    try:
        done = subprocess.run(
            [binary, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return SmiRun(False, "", f"nvidia-smi did not answer within {timeout_s:g} s")
    except OSError as error:
        return SmiRun(False, "", f"could not run {binary}: {error}")
    if done.returncode != 0:
        reason = " ".join((done.stdout + done.stderr).split())[:300]
        return SmiRun(False, done.stdout, f"nvidia-smi failed ({done.returncode}): {reason}")
    return SmiRun(True, done.stdout, "ok")


def query_gpus(fields: list[str], timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Run ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` and parse it.

    Returns the GPU entries (empty when nvidia-smi is missing or fails).
    """
    run = run_smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout_s)
    if not run.ok:
        return []
    try:
        return list(parse_csv(run.output, fields)["gpus"])
    except SmiParseError:
        return []


# ----------------------------------------------------------------------------- samples

SAMPLES_PACKAGE = "course_utils.samples"


def list_samples() -> list[str]:
    """Names of the nvidia-smi outputs shipped in ``course_utils/samples/nvidia-smi/``.

    >>> "t4_table_idle" in list_samples()
    True
    """
    folder = resources.files(SAMPLES_PACKAGE).joinpath("nvidia-smi")
    return sorted(
        entry.name.rsplit(".", 1)[0] for entry in folder.iterdir() if entry.name[0] not in "._"
    )


def sample_output(name: str) -> tuple[str, str]:
    """A shipped nvidia-smi output: ``(provenance, text)``.

    The first line of each file says where it comes from; the notebook prints it.

    >>> provenance, text = sample_output("t4_table_idle")
    >>> provenance.startswith("provenance:"), parse(text)["gpus"][0]["name"]
    (True, 'Tesla T4')
    """
    folder = resources.files(SAMPLES_PACKAGE).joinpath("nvidia-smi")
    for entry in folder.iterdir():
        if entry.name.rsplit(".", 1)[0] == name:
            provenance, text = strip_provenance(entry.read_text(encoding="utf-8"))
            return provenance or "provenance: not recorded", text
    raise ValueError(f"no sample named {name!r}; available: {', '.join(list_samples())}")


def summary_line(parsed: dict[str, Any]) -> str:
    """One line per GPU and process, for ``python -m course_utils smi parse FILE``.

    >>> summary_line(parse("GPU 0: Tesla T4 (UUID: GPU-1234)")).splitlines()[0]
    'format list, driver ?, CUDA ?, 1 GPU(s), 0 process(es)'
    """
    lines = [
        f"format {parsed['format']}, driver {parsed.get('driver_version') or '?'}, "
        f"CUDA {parsed.get('cuda_version') or '?'}, {len(parsed['gpus'])} GPU(s), "
        f"{len(parsed['processes'])} process(es)"
    ]
    for gpu in parsed["gpus"]:
        lines.append(
            f"GPU {_show(gpu.get('index'))} {_show(gpu.get('name'))}: "
            f"{_show(gpu.get('memory_used_mib'))}/{_show(gpu.get('memory_total_mib'), ' MiB')}, "
            f"util {_show(gpu.get('utilization_gpu_pct'), '%')}, "
            f"power {_show(gpu.get('power_draw_w'), ' W')}/{_show(gpu.get('power_limit_w'), ' W')}"
        )
    for p in parsed["processes"]:
        lines.append(
            f"PID {_show(p.get('pid'))} on GPU {_show(p.get('gpu_index'))} "
            f"({_show(p.get('type'))}) {_show(p.get('name'))}: "
            f"{_show(p.get('used_memory_mib'), ' MiB')}"
        )
    lines += [f"[{d['code']}] {d['message']}" for d in parsed["diagnostics"]]
    return "\n".join(lines)
