"""The package's shape: no import cycle, a reason for every import inside a function, and
each public name defined in one module only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGE = ROOT / "course_utils"
#: Every module by its dotted name inside the package ("cli", "instructor.grading").
MODULES = {
    ".".join(path.relative_to(PACKAGE).with_suffix("").parts): path
    for path in sorted(PACKAGE.rglob("*.py"))
}


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _known(dotted: str, known: set[str]) -> set[str]:
    """The longest known module that ``dotted`` (inside course_utils) names or lies in."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return {".".join(parts[:end])}
    return set()


def _targets(node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The course_utils modules an import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names if alias.name.startswith("course_utils.")]
        return set().union(*(_known(name.removeprefix("course_utils."), known) for name in names))
    if node.level == 0 and not (node.module or "").startswith("course_utils"):
        return set()
    if node.level > 1:
        return set()
    module = (node.module or "").removeprefix("course_utils").lstrip(".")
    found: set[str] = set()
    for alias in node.names:  # `from course_utils.instructor import sandbox` loads a module
        name = f"{module}.{alias.name}" if module else alias.name
        found |= {name} if name in known else _known(module, known) if module else set()
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every edge, whether the import is at the top, inside a function or under TYPE_CHECKING."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, set(modules))
        graph[name] = (edges & set(modules)) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path that returns to its start, or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_find_cycle_sees_a_cycle_through_three_modules():
    graph = {"training": {"memory"}, "memory": {"batch"}, "batch": {"training"}, "cli": {"batch"}}
    assert find_cycle(graph) == ["batch", "training", "memory", "batch"]
    graph["batch"] = set()
    assert find_cycle(graph) == []


def test_import_graph_reads_every_kind_of_import(tmp_path):
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\n"
        "if TYPE_CHECKING:\n    from course_utils.c import X\n"
        "def f():\n    import course_utils.d\n    from .e import g\n"
    )
    for name in "bcde":
        (tmp_path / f"{name}.py").write_text("")
    modules = {path.stem: path for path in tmp_path.glob("*.py")}
    assert import_graph(modules)["a"] == {"b", "c", "d", "e"}
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "q.py").write_text("")
    modules["p.q"] = tmp_path / "p" / "q.py"
    (tmp_path / "f.py").write_text("from course_utils.p import q\nimport course_utils.p.q.r\n")
    modules["f"] = tmp_path / "f.py"
    assert import_graph(modules)["f"] == {"p.q"}


def test_course_utils_has_no_import_cycle():
    cycle = find_cycle(import_graph(MODULES))
    assert not cycle, "import cycle: " + " -> ".join(cycle)


LAZY = "# lazy:"


def _lazy_reason_missing(lines: list[str], function: ast.AST) -> list[int]:
    """Lines of imports inside `function` with no `# lazy:` comment on their own lines or in
    the comment lines directly above their run of consecutive imports."""
    imports = [
        node
        for node in ast.walk(function)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node is not function
    ]
    ends = {node.end_lineno: node for node in imports}
    missing = []
    for node in imports:
        end = node.end_lineno or node.lineno
        if any(LAZY in lines[i - 1] for i in range(node.lineno, end + 1)):
            continue
        line, found = node.lineno - 1, False
        while line >= 1 and not found:
            text = lines[line - 1].strip()
            if text.startswith("#"):
                found = LAZY in text
                line -= 1
            elif line in ends:
                above = ends[line]
                found = any(LAZY in lines[i - 1] for i in range(above.lineno, line + 1))
                line = above.lineno - 1
            else:
                break
        if not found:
            missing.append(node.lineno)
    return missing


def _functions(tree: ast.Module) -> list[ast.AST]:
    """The outermost functions (methods included); nested ones are walked through them."""
    found: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(child)
            else:
                visit(child)

    visit(tree)
    return found


def test_the_lazy_import_check_wants_a_reason():
    source = (
        "def f():\n    # lazy: keeps torch out of the CLI\n    import torch\n    import numpy\n"
        "def g():\n    import json\n    x = 1\n    # lazy: optional\n    import mkdocs\n"
        "def h():\n    import nbclient  # lazy: optional (classroom extra)\n"
    )
    lines = source.splitlines()
    tree = ast.parse(source)
    missing = {fn.name: _lazy_reason_missing(lines, fn) for fn in _functions(tree)}
    assert missing == {"f": [], "g": [6], "h": []}


def test_every_import_inside_a_function_says_why_it_is_lazy():
    missing = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        for function in _functions(_parse(path)):
            where = path.relative_to(ROOT)
            missing += [f"{where}:{line}" for line in _lazy_reason_missing(lines, function)]
    assert not missing, (
        "imports inside functions without a '# lazy:' reason (move them to the top, or say "
        "why they must wait): " + ", ".join(missing)
    )


def _public_definitions(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return {name for name in names if not name.startswith("_")}


def test_each_public_function_and_class_is_defined_in_one_module():
    where: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for defined in _public_definitions(_parse(path)):
            where.setdefault(defined, []).append(name)
    twice = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert not twice, f"defined in more than one module: {twice}"


#: The package's four parts, bottom to top: a part may import the parts below it, never one above.
PARTS = ["lessons", "checks", "instructor", "tooling"]


def part_of(module: str) -> str:
    """``lessons`` for a module at the top level (what notebooks import), else its sub-package."""
    first = module.split(".")[0]
    return first if first in PARTS[1:] else "lessons"


def test_part_of_names_each_part():
    assert part_of("device") == part_of("records") == "lessons"
    assert part_of("checks.evidence.nb01") == "checks"
    assert part_of("instructor.grading") == "instructor"
    assert part_of("tooling.cli") == "tooling"


def test_no_part_imports_a_part_above_it():
    graph = import_graph(MODULES)
    upward = [
        f"{name} -> {target}"
        for name, targets in sorted(graph.items())
        for target in sorted(targets)
        if name != "__main__" and PARTS.index(part_of(target)) > PARTS.index(part_of(name))
    ]
    assert upward == [], upward


def _notebook_imports(known: set[str]) -> set[str]:
    """The course_utils modules (of ``known``) the notebooks' code cells import."""
    import json  # lazy: only this test reads notebooks

    found: set[str] = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            try:
                tree = ast.parse(source)
            except SyntaxError:  # IPython magics: read the lines that are Python
                lines = [line for line in source.splitlines() if line.lstrip()[:1] not in "%!"]
                tree = ast.parse("\n".join(lines))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found |= _targets(node, known)
    return found


def test_the_top_level_holds_only_what_notebooks_import():
    """Every top-level module is imported by a notebook, or by one that is (transitively)."""
    modules = {name.removesuffix(".__init__"): path for name, path in MODULES.items()}
    graph = import_graph(modules)
    imported = _notebook_imports(set(modules))
    reached, todo = set(), [m for m in imported if part_of(m) == "lessons"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += [m for m in graph.get(module, ()) if part_of(m) == "lessons"]
    top_level = {m for m in modules if part_of(m) == "lessons"} - {"__init__", "__main__"}
    # a folder of data (samples/: nvidia-smi outputs that smi.sample_output reads) holds no code
    top_level -= {m for m in top_level if len(_parse(modules[m]).body) <= 1}
    assert top_level - reached == set(), "not imported by any notebook"
