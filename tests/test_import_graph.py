"""No import cycle inside course_utils: module-level imports and imports inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "course_utils"


def imports_of(path: Path) -> set[str]:
    """The course_utils modules that ``path`` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "course_utils":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils."):
            found.add(str(node.module).split(".")[1])
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found |= {name.split(".")[1] for name in names if name.startswith("course_utils.")}
    return {name for name in found if (PACKAGE / f"{name}.py").exists()} - {path.stem}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_course_utils_has_no_import_cycle():
    graph = {path.stem: imports_of(path) for path in PACKAGE.glob("*.py")}
    assert graph["batch"] >= {"training", "oom"}, "the graph should see real imports"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
