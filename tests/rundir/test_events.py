"""The history's schema (torchchaos.rundir.events) and the code agree on every event name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from torchchaos.rundir.events import EVENTS

REPO = Path(__file__).resolve().parents[2]
SOURCES = [p for package in ("chaos", "faults") for p in (REPO / package).rglob("*.py")]


def written() -> dict[str, set[str]]:
    """Event names the code writes: `record("name", ...)`, `record_name(...)` and
    `{"ev": "name", ...}`."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "record" and isinstance(node.args[0], ast.Constant):
                    name = node.args[0].value
                elif called.startswith("record_") and _on_a_history(func):
                    name = called.removeprefix("record_")  # a writer of one event: record_step
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "ev" and isinstance(
                            value, ast.Constant):
                        name = value.value
            if isinstance(name, str):
                found.setdefault(name, set()).add(path.name)
    return found


def _on_a_history(func: ast.expr) -> bool:
    """Is this `history.record_x` (a HistoryWriter's method), or `self.history.record_x`?"""
    owner = func.value if isinstance(func, ast.Attribute) else None
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return name == "history"


def read() -> set[str]:
    """Event names the code looks for: `.of("a", "b")` and `e["ev"] == "a"`."""
    names: set[str] = set()
    for path in SOURCES:
        text = path.read_text()
        for call in re.findall(r"\.of\(([^)]*)\)", text):
            names.update(re.findall(r'"(\w+)"', call))
        names.update(re.findall(r'\["ev"\]\s*[!=]=\s*"(\w+)"', text))
        for group in re.findall(r'\["ev"\]\s*(?:not )?in\s*[({]([^)}]*)[)}]', text):
            names.update(re.findall(r'"(\w+)"', group))
    return names


def test_every_event_the_code_writes_is_in_the_schema() -> None:
    missing = {name: sorted(files) for name, files in written().items() if name not in EVENTS}
    assert missing == {}


def test_every_event_the_code_reads_is_in_the_schema() -> None:
    assert sorted(read() - set(EVENTS)) == []


def test_every_event_in_the_schema_is_written_somewhere() -> None:
    assert sorted(set(EVENTS) - set(written())) == []


def test_the_scan_sees_what_it_must() -> None:
    """The scans are what the three tests above rest on: they find the agent's step,
    the harness's launch and the fault filesystem's events, and the checkers' reads."""
    names = written()
    assert {"step", "launch", "fs", "fs_crash", "weights_deviation"} <= set(names)
    assert {"step", "fault", "fs_crash"} <= read()
