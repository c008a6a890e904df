"""The GPU-claim rule (docs/gpu-claims.md) in every notebook: a speed or memory
comparison on a GPU goes through ``course_utils.claims.gpu_claim``, never a bare
``assert``, so that a GPU nobody here has run cannot stop a learner's Run All.

A cell's statements are walked with the branch they run on: the body of an ``if`` whose
test names the GPU (``device.type == "cuda"``, ``HAS_GPU``, a compute capability, ...) and
the ``else`` of one that names the CPU run on a GPU. There an ``assert`` that orders two
figures (``<``, ``>``, ``<=``, ``>=``) is a claim, unless its line says ``# correctness``
(two ways to compute the same number must agree): correctness checks stay plain asserts.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ON_GPU = re.compile(r"'cuda'|HAS_GPU|cuda\.is_available|capability|tensor_cores|(?<![.\w])busy\b")
ON_CPU = re.compile(r"== 'cpu'|!= 'cuda'|not HAS_GPU")  # ast.unparse writes strings in single quotes
ORDERINGS = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)


def _orders(test: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Compare) and any(isinstance(op, ORDERINGS) for op in node.ops)
        for node in ast.walk(test)
    )


def bare_gpu_claims(source: str) -> list[str]:
    """The lines of ``source`` that assert an ordering of figures on a GPU branch."""
    lines = source.splitlines()
    found: list[str] = []

    def visit(nodes: list[ast.stmt], on_gpu: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                cpu = bool(ON_CPU.search(test))
                visit(node.body, on_gpu or (bool(ON_GPU.search(test)) and not cpu))
                visit(node.orelse, on_gpu or cpu)
            elif isinstance(node, ast.Assert):
                line = lines[node.lineno - 1]
                if on_gpu and _orders(node.test) and "# correctness" not in line:
                    found.append(line.strip())
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, None) or []:
                        visit(
                            child.body if isinstance(child, ast.excepthandler) else [child], on_gpu
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
if spread >= 3 and share.busy:
    assert spread < 9
"""
    found = bare_gpu_claims(source)
    assert found == ['assert speedup > 1.3, "faster"', "assert overlap < 0.85", "assert top < 1.5"]
