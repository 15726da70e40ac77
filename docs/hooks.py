"""MkDocs hooks: the reference pages that are made from the code, so they cannot drift.

A page asks for a generated part with a marker on a line of its own:

    <!-- torchchaos:cli -->             every command and option, from the real parser
    <!-- torchchaos:faults -->          every built-in fault kind and its parameters
    <!-- torchchaos:triggers -->        the target and trigger keys every spec takes
    <!-- torchchaos:checks -->          the table of built-in checks (name, when it runs)
    <!-- torchchaos:toml-keys -->       the keys of [tool.torchchaos]
    <!-- torchchaos:pytest-options -->  the plugin's pytest options and markers
    <!-- torchchaos:marker-keywords -->  the keyword arguments of @pytest.mark.chaos
    <!-- torchchaos:scenario-keys -->   the keys of a scenario file
    <!-- torchchaos:api -->             the public API (torchchaos.__all__), by mkdocstrings
    <!-- torchchaos:include PATH -->    a file of the repository, as it is (bench/README.md)

The checks page is written by hand, one `## name` section per check; the build
checks its sections against the check registry (a check added, renamed or removed
without its section is a warning, and `mkdocs build --strict` fails on it). The same
goes for a fault parameter that its kind's module docstring does not describe.
"""

from __future__ import annotations

import argparse
import html
import importlib
import inspect
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

log = logging.getLogger("mkdocs.plugins.torchchaos")

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- torchchaos:([\w-]+)(?: ([^>]*?))? -->$", re.MULTILINE)
# The repository's folders and the import names a wheel gives them (pyproject.toml).
LAYOUT = {"torchchaos": "chaos", "torchchaos/faults": "faults",
          "torchchaos/suites": "suites", "torchchaos/targets": "targets"}

_source_tree: tempfile.TemporaryDirectory | None = None


# -- hooks ---------------------------------------------------------------------------------

@event_priority(100)  # before mkdocstrings reads its handlers' options
def on_config(config: Any) -> Any:
    """Point mkdocstrings at the package as a wheel lays it out: the repository keeps
    chaos/ and faults/ side by side, which a static reader cannot see as one package."""
    global _source_tree
    _cleanup()
    _source_tree = tempfile.TemporaryDirectory(prefix="torchchaos-docs-")
    root = Path(_source_tree.name)
    for package, folder in LAYOUT.items():
        target = root / package
        target.mkdir(parents=True, exist_ok=True)
        for entry in (REPO / folder).iterdir():
            if entry.name != "__pycache__" and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    handlers = config.plugins["mkdocstrings"].config["handlers"]
    handlers.setdefault("python", {})["paths"] = [str(root)]
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def expand(match: re.Match[str]) -> str:
        name, arg = match.group(1), (match.group(2) or "").strip()
        maker = MAKERS.get(name)
        if maker is None:
            log.warning("%s: unknown marker torchchaos:%s", page.file.src_path, name)
            return ""
        return maker(arg, page.file.src_path) if name == "include" else maker()

    markdown = MARKER.sub(expand, markdown)
    if page.file.src_path == "reference/checks.md":
        _check_sections(markdown)
    return markdown


def on_post_build(config: Any) -> None:
    _cleanup()


def on_build_error(error: Exception) -> None:
    _cleanup()


def _cleanup() -> None:
    global _source_tree
    if _source_tree is not None:
        _source_tree.cleanup()
        _source_tree = None


# -- helpers -------------------------------------------------------------------------------

def _cell(text: str) -> str:
    """Text for a table cell: no line breaks, no markup it did not mean."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return text.replace("|", "\\|").replace("*", "\\*")


def _docstring_markdown(doc: str) -> str:
    """A docstring written as plain text, as Markdown: lists need a blank line around
    them, which docstrings do not leave."""
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    in_list = False
    for line in lines:
        item = line.startswith("- ")
        if item and not in_list and out and out[-1].strip():
            out.append("")
        if in_list and line and not item and not line.startswith(" "):
            out.append("")
        if item:
            in_list = True
        elif not line.strip() or not line.startswith(" "):
            in_list = False
        out.append(line)
    return "\n".join(out)


# -- the command line ----------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    for module in ("torchchaos.cli.parser", "torchchaos.cli.main"):
        try:
            found = getattr(importlib.import_module(module), "build_parser", None)
        except ImportError:
            continue
        if found is not None:
            return found()
    raise RuntimeError("no build_parser in torchchaos.cli")


def _option_row(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if action.option_strings:
        names = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.nargs != 0:
            value = formatter._format_args(action, action.dest.upper())
            names += f" `{value}`"
    else:
        names = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    help_text = formatter._expand_help(action) if action.help else ""
    return f"| {names} | {_cell(help_text)} |"


def _command_section(name: str, parser: argparse.ArgumentParser, summary: str) -> str:
    formatter = parser._get_formatter()
    parts = [f"## `torchchaos {name}`" if name else "## `torchchaos`", ""]
    if summary:
        parts += [_cell(summary[0].upper() + summary[1:]) + ".", ""]
    if parser.description:
        parts += [_cell(parser.description), ""]
    parts += ["```", parser.format_usage().strip(), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help != argparse.SUPPRESS
                   and not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        title = group.title or "options"
        parts += [f"**{_cell(title)}**" + (f": {_cell(group.description)}"
                                          if group.description else ""), ""]
        parts += ["| option | what it does |", "| --- | --- |"]
        parts += [_option_row(a, formatter) for a in actions]
        parts.append("")
    epilog = parser.epilog() if callable(parser.epilog) else parser.epilog  # made lazily
    if epilog:
        parts += ["```text", epilog.strip(), "```", ""]
    return "\n".join(parts)


def make_cli() -> str:
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # usage lines wrapped the same on every machine
    try:
        parser = _parser()
        sections = [_command_section("", parser, "")]
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, subparser in sub.choices.items():
            sections.append(_command_section(name, subparser, helps.get(name, "")))
            nested = [a for a in subparser._actions
                      if isinstance(a, argparse._SubParsersAction)]
            for action in nested:  # `incident import`: a command's own commands
                inner = {a.dest: a.help or "" for a in action._choices_actions}
                for child, child_parser in action.choices.items():
                    sections.append(_command_section(f"{name} {child}", child_parser,
                                                     inner.get(child, "")))
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(sections)


# -- fault kinds ---------------------------------------------------------------------------

def _accepts(parse: Any) -> str:
    """What a parameter's parser takes, in words."""
    from torchchaos.faults import params

    cells = [c.cell_contents for c in (getattr(parse, "__closure__", None) or ())]
    options = next((c for c in cells if isinstance(c, tuple)), None)
    if options is not None:
        return "one of " + ", ".join(f"`{o}`" for o in options)
    known = {params.seconds: "seconds (>= 0)", params.positive_int: "an integer >= 1",
             params.non_negative_int: "an integer >= 0", params.fraction: "a fraction in [0, 1)",
             params.run_relative_dir: "a folder inside the run directory",
             str: "text (a name or a glob)", int: "an integer", float: "a number"}
    if parse in known:
        return known[parse]
    module = importlib.import_module(parse.__module__)
    special = {
        "_signal": lambda: "a signal: " + ", ".join(f"`{s}`" for s in module.SIGNALS),
        "_bit": lambda: "a bit index, or one of " + ", ".join(
            f"`{c}`" for c in params.BIT_CLASSES),
        "_sides": lambda: "sides of node numbers, e.g. `0+1/2`",
    }
    if parse.__name__ in special:
        return special[parse.__name__]()
    doc = inspect.getdoc(parse)
    if doc:
        return doc.splitlines()[0]
    log.warning("fault parameter parser %s.%s: no words for what it accepts (hooks.py)",
                parse.__module__, parse.__qualname__)
    return "see below"


def make_faults() -> str:
    from torchchaos.faults import registry

    parts = []
    for name in sorted(registry.BUILTIN):
        kind = registry.get_kind(name)
        module = importlib.import_module(type(kind).__module__)
        doc = inspect.getdoc(module) or ""
        side = ("from outside the job, by the harness" if kind.side == "harness"
                else "inside the targeted rank, by its agent")
        targets = " or ".join(f"`{t}=`" for t in kind.targets)
        parts += [f"## `{name}`", "", _cell(kind.summary[0].upper() + kind.summary[1:]) + ".",
                  "", f"Fires {side}; aims at {targets}.", ""]
        if kind.params:
            parts += ["| parameter | accepts |", "| --- | --- |"]
            parts += [f"| `{p}=` | {_accepts(parse)} |" for p, parse in kind.params.items()]
            parts.append("")
        for param in kind.params:
            if not re.search(rf"`{re.escape(param)}[=`]", doc):
                log.warning("fault kind %s: parameter %s= is not described in the docstring"
                            " of %s", name, param, module.__name__)
        body = doc.split("\n", 1)[1] if "\n" in doc else ""
        parts += [_docstring_markdown(body).strip(), ""]
    return "\n".join(parts)


def make_triggers() -> str:
    from torchchaos.scenario import spec

    phases = ", ".join(f"`{p}`" for p in spec.PHASES)
    symbolic = ", ".join(f"`{s}`" for s in spec.SYMBOLIC_TARGETS)
    rows = [
        ("`rank=N`", f"the rank to hit: a global rank, or {symbolic} (a seeded pick)"),
        ("`node=N`", f"the simulated node (its torchrun agent and workers), or {symbolic}"),
        ("`step=N`", "trigger: after the target's N-th optimizer step (N >= 1)"),
        ("`phase=P`", f"trigger: inside a checkpoint phase, one of {phases}"),
        ("`event=N`", "with `phase=`: right after the N-th file event of that phase"
                      " (default 1)"),
        ("`save=K`", "with `phase=`: the K-th save (or load) of the process (default 1)"),
        ("`time=S`", "trigger: S seconds after the job started"),
        ("`p=P`", "trigger: with probability P at every step (seeded)"),
    ]
    return "\n".join(["| key | meaning |", "| --- | --- |",
                      *[f"| {k} | {v} |" for k, v in rows]])


# -- checks --------------------------------------------------------------------------------

def make_checks() -> str:
    from torchchaos.judge import checks_by_name as registry

    rows = ["| check | runs | what it judges |", "| --- | --- | --- |"]
    for name, path in registry.BUILTIN.items():
        runs = (f"only when named (`--check {name}`)" if name in registry.OPT_IN
                else "by default")
        rows.append(f"| [`{name}`](#{name}) | {runs} | `{path}` |")
    return "\n".join(rows)


def _check_sections(markdown: str) -> None:
    from torchchaos.judge import checks_by_name as registry

    found = re.findall(r"^## `?(\w+)`?\s*$", markdown, re.MULTILINE)
    wanted = list(registry.BUILTIN)
    if found != wanted:
        log.warning("reference/checks.md: its sections %s are not the built-in checks in"
                    " the registry's order %s (torchchaos.judge.checks_by_name.BUILTIN)",
                    found, wanted)


# -- configuration -------------------------------------------------------------------------

def _run_option(key: str) -> str:
    """The help of the `run` option a [tool.torchchaos] key stands for."""
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    wanted = {"script": "script", "args": "args", "links": "--link", "checks": "--check"}
    name = wanted.get(key, "--" + key.replace("_", "-"))
    for action in run._actions:
        if name in action.option_strings or (not action.option_strings
                                             and action.dest == name):
            shown = name if name.startswith("-") else name.upper()
            return f"as `{shown}`: {_cell(action.help or '')}"
    return ""


def make_toml_keys() -> str:
    from torchchaos.explore import suiteconfig

    rows = ["| key | value | meaning |", "| --- | --- | --- |"]
    for key, (_types, wanted) in suiteconfig.KEYS.items():
        meaning = _run_option(key)
        if key == "env":
            meaning = "environment variables set in every rank (names to values)"
        if not meaning:
            log.warning("[tool.torchchaos] key %s: no `run` option of that name to describe"
                        " it (hooks.py)", key)
        rows.append(f"| `{key}` | {_cell(wanted)} | {meaning} |")
    return "\n".join(rows)


class _OptionRecorder:
    """Stands in for pytest's parser: records what the plugin adds."""

    def __init__(self) -> None:
        self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def getgroup(self, *_args: Any, **_kwargs: Any) -> _OptionRecorder:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.options.append((names, kwargs))

    def addini(self, *_args: Any, **_kwargs: Any) -> None:
        pass


def make_pytest_options() -> str:
    from torchchaos import plugin

    recorder = _OptionRecorder()
    plugin.pytest_addoption(recorder)  # type: ignore[arg-type]
    rows = ["| option | what it does |", "| --- | --- |"]
    for names, kwargs in recorder.options:
        metavar = kwargs.get("metavar") or ("N" if kwargs.get("type") in (int, float) else "")
        shown = ", ".join(f"`{n}`" for n in names) + (f" `{metavar}`" if metavar else "")
        rows.append(f"| {shown} | {_cell(kwargs.get('help', ''))} |")
    rows += ["", "| marker | what it selects |", "| --- | --- |",
             "| `chaos(script, faults=[...], expect='pass', **scenario)` | a test that runs"
             " one scenario; the `chaos_report` fixture holds its report |"]
    rows += [f"| `{name}` | {_cell(what)} |" for name, what in plugin.SUITE_MARKERS.items()]
    rows.append("| `chaos_replay` | a scenario file collected as a test |")
    return "\n".join(rows)


# The marker's own keywords (not a Scenario field), with what they do
MARKER_KEYWORDS = {
    "script": ("required", "the training script (or the marker's first positional argument)"),
    "faults": ("`[]`", "fault specs, `KIND:key=value,...` (the [fault reference](faults.md))"),
    "expect": ("`pass`", "`pass` or `fail`: the verdict the test wants"),
}


def make_marker_keywords() -> str:
    """`@pytest.mark.chaos(...)` and `chaos_run(...)` take the scenario's fields as
    keywords: each with its default and the comment beside it in the code."""
    from torchchaos.scenario.model import Scenario

    rows = ["| keyword | default | what it does |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {default} | {what} |"
             for name, (default, what) in MARKER_KEYWORDS.items()]
    for name, default, what in _fields_with_comments(Scenario):
        if name not in MARKER_KEYWORDS:
            if not what:  # strict builds fail: a keyword nobody can look up
                log.warning(f"Scenario.{name} has no comment to document it as a keyword")
            rows.append(f"| `{name}` | `{default}` | {_cell(what)} |")
    return "\n".join(rows)


def _fields_with_comments(cls: type) -> list[tuple[str, str, str]]:
    """(name, default, comment) of a dataclass's fields, as its source writes them: the
    comment on the lines above a field, else the one after it on its line."""
    found, above = [], []
    for line in inspect.getsource(cls).splitlines()[1:]:
        text = line.strip()
        if text.startswith("def ") or text.startswith("@"):
            break
        if text.startswith("#"):
            above.append(text.lstrip("# "))
            continue
        m = re.match(r"(\w+): [^=#]+?(?: = ([^#]+?))?\s*(?:# (.*))?$", text)
        if m:
            default = m.group(2) or "required"
            default = "[]" if "default_factory=list" in default else \
                "{}" if "default_factory=dict" in default else default
            found.append((m.group(1), default, " ".join(above) or (m.group(3) or "")))
        above = []
    return found


def make_scenario_keys() -> str:
    from torchchaos.scenario import files

    def keys(names: tuple[str, ...]) -> str:
        return ", ".join(f"`{k}`" for k in names)

    example = (inspect.getdoc(files) or "").split("A file looks like this:", 1)[-1]
    example = example.split("Only safe YAML", 1)[0]
    return "\n".join([
        "| section | keys |", "| --- | --- |",
        f"| top level | {keys(files.TOP_KEYS)} |",
        f"| `job:` | {keys(files.JOB_KEYS)} |",
        f"| `bounds:` | {keys(files.BOUND_KEYS)} |",
        f"| `expect:` | `verdict` ({' or '.join(f'`{v}`' for v in files.VERDICTS)}),"
        " `checks` (check name: true, false or null) |",
        "", "```yaml", inspect.cleandoc(example), "```"])


# -- the Python API ------------------------------------------------------------------------

def make_api() -> str:
    import torchchaos

    parts = []
    for name in torchchaos.__all__:
        module = torchchaos._PUBLIC[name]
        attribute = torchchaos._RENAMED.get(name, name)
        parts += [f"::: {module}.{attribute}",
                  "    options:",
                  f'      heading: "torchchaos.{name}"',
                  f"      toc_label: torchchaos.{name}",
                  "      show_root_heading: true",
                  "      heading_level: 2", ""]
    return "\n".join(parts)


# -- files of the repository ---------------------------------------------------------------

def make_include(argument: str, page: str) -> str:
    path = (REPO / argument).resolve()
    if not path.is_relative_to(REPO) or not path.is_file():
        log.warning("%s: torchchaos:include %s: no such file in the repository", page,
                    argument)
        return ""
    return path.read_text()


MAKERS = {
    "cli": make_cli,
    "faults": make_faults,
    "triggers": make_triggers,
    "checks": make_checks,
    "toml-keys": make_toml_keys,
    "pytest-options": make_pytest_options,
    "marker-keywords": make_marker_keywords,
    "scenario-keys": make_scenario_keys,
    "api": make_api,
    "include": make_include,
}
