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
    assert found == ['assert speedup > 1.3, "faster"', "assert overlap < 0.85", "assert top < 1.5",
                     "assert spread < 3", "assert result.overhead_ratio >= 0.9",
                     "assert regained >= half"]
