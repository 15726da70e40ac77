"""Which job the ready-made suites test: `[tool.torchchaos]` in pyproject.toml, then options.

    [tool.torchchaos]
    script = "train.py"                       # relative to this pyproject.toml
    args = ["--ckpt-dir", "{run_dir}/ckpt"]   # or one string, split like a shell
    links = ["configurator.py", "data"]       # shown in every run directory (--link)
    nproc = 2
    max_lost_steps = 50

Command-line options override the file key by key (`--chaos-script`,
`--chaos-args "..."`, `--chaos-nproc`, ...). With no script anywhere, the
suites test the bundled reference target. A typo in the table would
otherwise silently test the defaults, so unknown keys and wrong types are
errors that name the key.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from torchchaos.errors import UsageError
from torchchaos.scenario.model import Scenario

TABLE = "[tool.torchchaos]"

# key -> (accepted types, what to call them in a message)
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "script": ((str,), "a path"),
    "args": ((list, str), "a list of strings or one string"),
    "nproc": ((int,), "an integer"),
    "nodes": ((int,), "an integer"),
    "network": ((str,), "one of auto, netns, host"),
    "min_nodes": ((int,), "an integer"),
    "checks": ((list,), "a list of check names"),
    "max_lost_steps": ((int,), "an integer"),
    "max_lost_seconds": ((int, float), "a number of seconds"),
    "max_detect_steps": ((int,), "an integer"),
    "hang_timeout": ((int, float), "a number of seconds"),
    "timeout": ((int, float), "a number of seconds"),
    "seed": ((int,), "an integer"),
    "max_restarts": ((int,), "an integer"),
    "max_relaunches": ((int,), "an integer"),
    "reference_runs": ((int,), "1 or 2"),
    "env": ((dict,), "a table of strings"),
    "links": ((list,), "a list of paths"),
}


def read_table(pyproject: Path) -> dict[str, Any]:
    """The `[tool.torchchaos]` table of a pyproject.toml ({} without one)."""
    if not pyproject.is_file():
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise UsageError(f"reading {TABLE} on Python 3.10 needs tomli:"
                             " pip install tomli") from None
    try:
        doc = tomllib.loads(pyproject.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{pyproject}: not valid TOML: {exc}") from None
    table = doc.get("tool", {}).get("torchchaos", {})
    if not isinstance(table, dict):
        raise UsageError(f"{pyproject}: tool.torchchaos must be a table")
    return table


def check_table(table: dict[str, Any], origin: str) -> dict[str, Any]:
    """The table's values, typed; a UsageError naming the key for anything else."""
    values = {}
    for key, value in table.items():
        if key not in KEYS:
            raise UsageError(f"{origin}: unknown key {key!r} (known: {', '.join(KEYS)})")
        types, wanted = KEYS[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise UsageError(f"{origin}: {key} must be {wanted}, got {value!r}")
        values[key] = _item_types(key, value, origin, wanted)
    return values


def _item_types(key: str, value: Any, origin: str, wanted: str) -> Any:
    if key == "args" and isinstance(value, str):
        return split_args(value, f"{origin}: args")
    items = value.items() if isinstance(value, dict) else enumerate(
        value if isinstance(value, list) else [])
    for _, item in items:
        if not isinstance(item, str):
            raise UsageError(f"{origin}: {key} must be {wanted}, got {value!r}")
    return value


def split_args(text: str, origin: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{origin}: cannot split {text!r}: {exc}") from None


def base_scenario(table: dict[str, Any], table_dir: Path, options: dict[str, Any],
                  origin: str) -> Scenario:
    """The suites' job (no faults yet): the table, then the options that were given.

    A script from the table is relative to the table's folder, one from an option
    to where pytest was started (both made absolute: every run has its own cwd).
    """
    from torchchaos.explore.battery import BUNDLED_ARGS, BUNDLED_TARGET

    values = check_table(table, origin)
    if "script" in values:
        values["script"] = str((table_dir / values["script"]).resolve())
    if "links" in values:  # not resolved: a link shows under the name it was given
        values["links"] = [os.path.normpath(table_dir.absolute() / link)
                           for link in values["links"]]
    values.update({k: v for k, v in options.items() if v is not None})
    values.setdefault("args", list(BUNDLED_ARGS) if "script" not in values else [])
    values["script"] = str(Path(values.get("script", BUNDLED_TARGET)).resolve())
    try:
        scenario = Scenario(**values)
        scenario.validate()
    except UsageError as exc:
        raise UsageError(f"the suites' job: {exc}") from None
    return scenario
