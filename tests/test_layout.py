"""The tree's shape: no import circles, and every import goes down the floors.

The floors, lowest first (ARCHITECTURE.md explains each). A module may import
its own package and anything on a lower floor, nothing else. Imports made only
for type checking (`if TYPE_CHECKING:`) do not count: they never run.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FLOORS: list[tuple[str, ...]] = [
    ("torchchaos.errors", "torchchaos.env", "torchchaos.api", "torchchaos.progress",
     "torchchaos.version", "torchchaos.log_lines"),
    ("torchchaos.entrypoints",),
    ("torchchaos.host",),
    ("torchchaos.rundir",),
    ("torchchaos.faults", "torchchaos.faults.contract", "torchchaos.faults.shape"),
    ("torchchaos.faults.registry",),
    ("torchchaos.judge",),
    ("torchchaos.report",),
    ("torchchaos.scenario",),
    ("torchchaos.faults.*", "torchchaos.rank"),
    ("torchchaos.harness",),
    ("torchchaos.engine",),
    ("torchchaos.explore", "torchchaos.sdc"),
    ("torchchaos.incident",),
    ("torchchaos.cli", "torchchaos.plugin", "torchchaos"),
]
# The repository's folders and the import names they are installed under (pyproject.toml).
PACKAGE_DIRS = {"chaos": "torchchaos", "faults": "torchchaos.faults"}


def repo_path(module: str) -> str:
    """`torchchaos.faults.kill` -> `faults/kill`, `torchchaos.host` -> `chaos/host`."""
    for folder, name in sorted(PACKAGE_DIRS.items(), key=lambda item: -len(item[1])):
        if module == name or module.startswith(name + "."):
            return folder + module.removeprefix(name).replace(".", "/")
    raise AssertionError(module)


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = (package, *path.relative_to(REPO / folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_imports(tree: ast.Module, typing_too: bool = False) -> list[str]:
    """Absolute imports outside `if TYPE_CHECKING:` blocks (with them: `typing_too`)."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING" \
                and not typing_too:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.extend([node.module] + [f"{node.module}.{a.name}" for a in node.names])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        names = _runtime_imports(ast.parse(path.read_text()), typing_too)
        targets = {resolve(t) for t in names}
        # a module importing its own package's __init__ (for a submodule) is not an edge
        graph[name] = {t for t in targets if t and t != name and not name.startswith(t + ".")}
    return graph


def floor_of(module: str) -> tuple[int, str]:
    """(floor, the FLOORS entry that holds it): the longest matching entry wins."""
    for number, entries in enumerate(FLOORS):
        if module in entries:
            return number, module
    best: tuple[int, str, int] | None = None
    for number, entries in enumerate(FLOORS):
        for entry in entries:
            if entry == "torchchaos":
                continue  # the public face is the package's __init__ only
            prefix = entry.removesuffix(".*")
            matches = module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) >= best[2]):
                best = (number, entry, len(prefix))
    assert best is not None, f"{module} is on no floor: add it to FLOORS and ARCHITECTURE.md"
    return best[0], best[1]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_no_import_circles_even_through_type_hints() -> None:
    """A type-only circle still says two layers need each other (the fault kinds once
    took `JobShape` from the explorers that load the kinds)."""
    graph = {m: {t for t in targets if t != "torchchaos"}
             for m, targets in import_graph(typing_too=True).items() if m != "torchchaos"}
    assert circles(graph) == []


def test_every_import_goes_down_the_floors() -> None:
    wrong = []
    for module, targets in sorted(import_graph().items()):
        if module == "torchchaos":
            continue  # the public face: lazy re-exports (PEP 562), imported on first use
        floor, entry = floor_of(module)
        for target in sorted(targets):
            their_floor, their_entry = floor_of(target)
            if their_floor > floor or (their_floor == floor and their_entry != entry):
                wrong.append(f"{module} (floor {floor}) imports {target} (floor {their_floor})")
    assert wrong == []


def test_fault_kinds_import_only_the_contract_and_the_layers_below_it() -> None:
    allowed = ("torchchaos.faults.", "torchchaos.errors", "torchchaos.env", "torchchaos.host",
               "torchchaos.rundir")
    wrong = [f"{m} imports {t}" for m, targets in import_graph().items()
             if m.startswith("torchchaos.faults.") and m != "torchchaos.faults.registry"
             for t in targets
             if not t.startswith(allowed) or t == "torchchaos.faults.registry"]
    assert wrong == []


def test_nothing_imports_the_command_line() -> None:
    users = [m for m, targets in import_graph().items() if not m.startswith("torchchaos.cli")
             and any(t.startswith("torchchaos.cli") for t in targets)]
    assert users == []


def test_at_most_twelve_modules_directly_in_chaos() -> None:
    direct = sorted(p.name for p in (REPO / "chaos").glob("*.py"))
    assert len(direct) <= 12, direct


def test_no_module_of_the_incident_import_is_over_600_lines() -> None:
    """One idea a module: the rules grew to 1,650 lines in one file once (issue 61)."""
    long = {str(p.relative_to(REPO)): n for p in (REPO / "chaos" / "incident").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_judging_imports_no_torch() -> None:
    """The checks are pure functions over histories: what they need from tensors (the
    SDC check's weight drift) the agent measured while the run was alive."""
    judge = sorted(m for m in modules() if m.startswith(("torchchaos.judge", "torchchaos.report")))
    code = "import sys\n" + "".join(f"import {m}\n" for m in judge) + (
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "[]"


def test_architecture_md_lists_the_floors_in_this_order() -> None:
    """ARCHITECTURE.md's table of packages is the FLOORS above, floor by floor."""
    rows = [line.split("|") for line in (REPO / "ARCHITECTURE.md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [int(row[1]) for row in rows] == list(range(len(FLOORS)))
    for row, entries in zip(rows, FLOORS):
        for entry in entries:
            as_path = repo_path(entry.removesuffix(".*"))
            if entry.endswith(".*"):
                as_path += "/<kind>.py"
            assert entry in row[2] or as_path in row[2] or f"{as_path}/" in row[2] \
                or f"{as_path}.py" in row[2], (entry, row[2])


def test_the_public_face_exports_each_name_and_loads_nothing_until_asked() -> None:
    """`import torchchaos` happens in every rank (the agent's package): it must stay free;
    each name in `torchchaos.__all__` must still resolve on first use."""
    code = ("import sys, torchchaos\n"
            "heavy = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', "
            "'torchchaos.'))]\n"
            "assert heavy == [], heavy\n"
            "missing = [n for n in torchchaos.__all__ if getattr(torchchaos, n, None) is None]\n"
            "assert missing == [], missing\n"
            "assert sorted(torchchaos.__all__) == sorted(torchchaos._PUBLIC)\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_the_bundled_targets_use_nothing_of_the_harness_but_its_opt_in_calls() -> None:
    """targets/ are training scripts like a user's (ARCHITECTURE.md): of torchchaos they
    may import `torchchaos.api` only, or a verdict on them would rest on the harness."""
    root = Path(__file__).resolve().parents[1] / "targets"
    found = {(path.name, name) for path in root.glob("*.py")
             for name in re.findall(r"^\s*(?:from|import) (torchchaos[\w.]*)",
                                    path.read_text(), re.MULTILINE)}
    assert found and {name for _, name in found} == {"torchchaos.api"}, found
