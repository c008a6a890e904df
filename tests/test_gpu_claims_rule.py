"""The GPU-claim rule (docs/gpu-claims.md) in every notebook: a speed or memory
comparison measured on a GPU goes through ``course_utils.claims.gpu_claim``, never a bare
``assert``, so that a GPU nobody here has run cannot stop a learner's Run All.

Every ``assert`` that orders two figures (``<``, ``>``, ``<=``, ``>=``) and may run on a
GPU is a claim: one inside an ``if`` on the GPU (``device.type == "cuda"``, ``HAS_GPU``,
``ON_GPU``, a compute capability, ...), and one outside any such ``if`` (it runs on a GPU
too), unless its line says ``# correctness`` (the code decides it on every GPU: two ways
to compute the same number, an OOM that must be raised, the course's own arithmetic) or
``# CPU-safe`` (the figures it orders are not measured on the GPU: bytes counted on the
CPU, a simulated budget). Only the body of an ``if`` on the CPU (``device.type ==
"cpu"``, ``not ON_GPU``, ...) and the ``else`` of an ``if`` on the GPU are skipped.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ON_GPU = re.compile(
    r"'cuda'|HAS_GPU|\bON_GPU\b|cuda\.is_available|capability|tensor_cores|(?<![.\w])busy\b"
)
# ast.unparse writes strings in single quotes
ON_CPU = re.compile(r"== 'cpu'|!= 'cuda'|not HAS_GPU|not ON_GPU")
MARKS = ("# correctness", "# CPU-safe")
ORDERINGS = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)


def _orders(test: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Compare) and any(isinstance(op, ORDERINGS) for op in node.ops)
        for node in ast.walk(test)
    )


def bare_gpu_claims(source: str) -> list[str]:
    """The lines of ``source`` that assert an ordering of figures where a GPU may run them."""
    lines = source.splitlines()
    found: list[str] = []

    def visit(nodes: list[ast.stmt], cpu_only: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                cpu = bool(ON_CPU.search(test))
                gpu = bool(ON_GPU.search(test)) and not cpu
                visit(node.body, cpu_only or cpu)
                visit(node.orelse, cpu_only or gpu)
            elif isinstance(node, ast.Assert):
                text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if not cpu_only and _orders(node.test) and not any(m in text for m in MARKS):
                    found.append(lines[node.lineno - 1].strip())
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, None) or []:
                        visit(
                            child.body if isinstance(child, ast.excepthandler) else [child],
                            cpu_only,
                        )

    visit(ast.parse(source).body, False)
    return found


def code_cells(notebook: dict) -> list[tuple[str, str]]:
    cells = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            text = "".join(cell["source"])
            kept = [line for line in text.splitlines() if not line.lstrip().startswith(("!", "%"))]
            cells.append((cell.get("id", "?"), "\n".join(kept)))
    return cells


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_bare_speed_or_memory_assert_runs_on_a_gpu(name):
    notebook = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))
    bare = {
        cid: lines for cid, source in code_cells(notebook) if (lines := bare_gpu_claims(source))
    }
    assert not bare, f"{name}: use course_utils.claims.gpu_claim on a GPU: {bare}"


def test_the_rule_finds_bare_claims_and_leaves_correctness_checks():
    source = """
if device.type == "cuda":
    assert speedup > 1.3, "faster"
    assert error["tf32"] > error["ieee"]  # correctness: TF32 keeps fewer digits
    assert out.dtype == torch.float16
    with capped():
        assert overlap < 0.85
if device.type == "cpu":
    assert late <= early
if device.type != "cuda":
    assert exact < budget
elif workload() == "full":
    assert top < 1.5
assert spread < 3
assert saved < limit  # CPU-safe: bytes counted on the CPU
if result.busy:
    print("busy")
else:
    assert result.overhead_ratio >= 0.9
if ON_GPU:
    assert regained >= half
else:
    assert simulated <= budget
if not ON_GPU:
    assert measured_here < 2
def check():
    assert (
        ratio < 2
    )  # correctness
"""
    found = bare_gpu_claims(source)
    assert found == [
        'assert speedup > 1.3, "faster"',
        "assert overlap < 0.85",
        "assert top < 1.5",
        "assert spread < 3",
        "assert result.overhead_ratio >= 0.9",
        "assert regained >= half",
    ]


# --- docs/gpu-claims.md and notebooks 05-09 agree (08-E1, 09-E1, GPU review G9) ---------------

DOC = ROOT / "docs" / "gpu-claims.md"
TABLE_TITLE = "## Which check is which in notebooks 05–09"
LATER = ("05", "06", "07", "08", "09")
EARLY_TITLE = "## The claims of notebooks 01–04"
EARLY = ("01", "02", "03", "04")


def class_table(text: str) -> list[tuple[str, str, str]]:
    """(cell id, check text, "claim" or "assert") for each row of the doc's table."""
    section = text.split(TABLE_TITLE, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("nb"):
            rows.append((cells[0], cells[1].strip("`"), cells[2]))
    return rows


def checks_in_cell(source: str) -> tuple[list[str], list[str]]:
    """The names of a cell's ``gpu_claim`` calls (a name held in a variable: its value)
    and the source of its ``assert`` statements (``assert_close`` calls included)."""
    tree = ast.parse(source)
    values = {
        target.id: ast.unparse(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    claims, asserts = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "gpu_claim":
            name = node.args[0]
            claims.append(
                values.get(name.id, name.id) if isinstance(name, ast.Name) else ast.unparse(name)
            )
        elif isinstance(node, ast.Assert) or (
            isinstance(node, ast.Call) and ast.unparse(node.func).endswith("assert_close")
        ):
            asserts.append(ast.get_source_segment(source, node) or "")
    return claims, asserts


def claim_rows(text: str) -> list[tuple[str, str, str]]:
    """(cell id, claim name, "claim") for each row of the doc's tables of 01-04: the name is
    the row's text in code font (``\\|`` is a ``|`` inside a cell)."""
    section = text.split(EARLY_TITLE, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())]
        cells = [cell for cell in cells if cell]
        found = re.search(r"`([^`]+)`", cells[1]) if len(cells) >= 3 else None
        if cells and cells[0].startswith("nb") and found:
            rows.append((cells[0], found.group(1), "claim"))
    return rows


def later_cells(first: tuple[str, ...] = LATER) -> dict[str, str]:
    cells = {}
    for name in NOTEBOOKS:
        if name.startswith(first):
            notebook = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text("utf-8"))
            cells.update(code_cells(notebook))
    return cells


def disagreements(table: list[tuple[str, str, str]], cells: dict[str, str]) -> list[str]:
    """Where the doc's table and the notebooks' cells disagree, in words."""
    found = []
    named: set[tuple[str, str]] = set()
    for cell, check, kind in table:
        if cell not in cells:
            found.append(f"{cell}: no such cell in these notebooks")
            continue
        claims, asserts = checks_in_cell(cells[cell])
        as_claim = [name for name in claims if check in name]
        as_assert = [text for text in asserts if check in text]
        named.update((cell, name) for name in as_claim)
        if kind == "claim" and not as_claim:
            found.append(f"{cell}: the doc's claim {check!r} is not a gpu_claim there")
        elif kind == "assert" and (as_claim or not as_assert):
            found.append(f"{cell}: the doc's assert {check!r} is not an assert there")
        elif kind not in ("claim", "assert"):
            found.append(f"{cell}: class {kind!r} is neither claim nor assert")
    for cell, source in cells.items():
        claims, _ = checks_in_cell(source)
        found += [
            f"{cell}: gpu_claim {name} is not in the doc's table"
            for name in claims
            if (cell, name) not in named
        ]
    return found


def test_the_doc_and_notebooks_05_to_09_class_each_check_alike():
    table = class_table(DOC.read_text(encoding="utf-8"))
    assert len(table) >= 30
    assert not disagreements(table, later_cells())


def test_the_doc_names_each_claim_of_notebooks_01_to_04_and_nothing_else():
    """Each gpu_claim of 01-04 has a row (cell id, its name in code font, bound, source) in
    the doc's tables, and each row a gpu_claim in that cell."""
    rows = claim_rows(DOC.read_text(encoding="utf-8"))
    assert len(rows) >= 40
    assert not disagreements(rows, later_cells(EARLY))


def test_a_claim_the_doc_calls_an_assert_is_a_disagreement():
    # 08-E1 as it was at 26d162d: the doc said assert, the cell said gpu_claim
    cells = {"nb08-sync": 'gpu_claim("synchronizing lines", sum(lines.values()), at_least=5)\n'}
    table = [("nb08-sync", "sum(lines.values())", "assert")]
    assert disagreements(table, cells) == [
        "nb08-sync: the doc's assert 'sum(lines.values())' is not an assert there",
        "nb08-sync: gpu_claim 'synchronizing lines' is not in the doc's table",
    ]
    cells = {"nb08-sync": "assert sum(lines.values()) >= 5  # correctness\n"}
    assert disagreements(table, cells) == []
