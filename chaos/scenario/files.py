"""Scenarios as files: one YAML (or JSON) format for replays and incident postmortems.

Every run writes `replay.yaml` into its output directory; `torchchaos replay`
and `pytest --chaos-replay` read it back into the same `Scenario` that the
CLI and the pytest plugin build. An incident postmortem is the same file with
a story around the faults (summary, source, a note per fault) and an expected
outcome. A file looks like this:

    torchchaos: 1
    name: torn checkpoint after a kill during save
    summary: the node died while rank 0 wrote its second checkpoint ...
    job:
      script: ../../targets/ddp_lm.py    # relative to this file's folder
      args: [--steps, 20, --ckpt-every, 5]
      nproc: 2
    seed: 0
    faults:
      - kill:rank=1,step=12              # a spec, as on the command line
      - fault: kill:rank=0,phase=checkpoint_save,save=2,event=2
        note: the kill lands between the write and the rename
      - {kind: kill, rank: 0, step: 17}  # the same, spelled out
    bounds: {max_lost_steps: 5}
    expect: {verdict: pass, checks: {atomic_recovery: true}}
    resolved: [...]                      # written by the harness; checked on replay

Only safe YAML is read (`yaml.safe_load`). Anything malformed is a
`UsageError` whose one line names the file and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from torchchaos.errors import UsageError
from torchchaos.report.report_file import Report
from torchchaos.scenario import schedule
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import parse_fault_spec

FORMAT_VERSION = 1
REPLAY_FILE = "replay.yaml"

# The Scenario fields a file sets, by section. Anything else in a file is a typo.
JOB_KEYS = ("script", "args", "nproc", "nodes", "network", "min_nodes", "env", "start_from",
            "links")
BOUND_KEYS = ("max_lost_steps", "max_lost_seconds", "max_detect_steps", "hang_timeout",
              "timeout", "max_restarts", "max_relaunches", "reference_runs", "stop_after",
              "mtbf_hours")
TOP_KEYS = ("torchchaos", "name", "summary", "source", "job", "seed", "faults", "checks",
            "bounds", "expect", "resolved", "incident")
VERDICTS = ("pass", "fail")


@dataclass
class Expectation:
    """What a run of the file should come to: a verdict, and optionally some checks."""

    verdict: str = "pass"  # "pass" | "fail"
    checks: dict[str, bool | None] = field(default_factory=dict)

    def mismatches(self, report: Report) -> list[str]:
        """Every way the report differs from the expectation ([] when it matches)."""
        found = []
        if report.verdict != self.verdict:
            why = f" ({report.reason})" if report.reason else ""
            found.append(f"verdict {report.verdict!r}, expected {self.verdict!r}{why}")
        for name, ok in self.checks.items():
            got = report.checks.get(name, {}).get("ok", "missing")
            if got != ok:
                found.append(f"{name}: ok={got}, expected ok={ok}")
        return found

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, **({"checks": dict(self.checks)} if self.checks else {})}


@dataclass
class ScenarioFile:
    """A scenario plus what a file says around it."""

    scenario: Scenario
    name: str = ""
    summary: str = ""
    source: str = ""
    notes: list[str] = field(default_factory=list)  # one per fault, "" for none
    expect: Expectation | None = None
    resolved: list[dict[str, Any]] | None = None
    path: Path | None = None
    # what `torchchaos incident import` read from a failed job: its signature (what a
    # replay must show to reproduce it), timeline and rules (torchchaos.incident)
    incident: dict[str, Any] | None = None

    def to_dict(self, base_dir: Path | None = None) -> dict[str, Any]:
        """The file's content; the script path is relative to base_dir where it can be."""
        s = self.scenario
        job: dict[str, Any] = {"script": _relative(s.script, base_dir), "args": list(s.args),
                               "nproc": s.nproc, "nodes": s.nodes}
        defaults = Scenario(script=s.script)
        for key in ("network", "min_nodes", "env"):
            if getattr(s, key) != getattr(defaults, key):
                job[key] = getattr(s, key)
        if s.start_from is not None:  # a crash point's starting checkpoints
            job["start_from"] = _relative(s.start_from, base_dir)
        if s.links:
            # not resolved: a link shows under the name it was given (a symlinked data/)
            job["links"] = [link if base_dir is None else os.path.relpath(link, base_dir.absolute())
                            for link in s.links]
        bounds = {k: getattr(s, k) for k in BOUND_KEYS if getattr(s, k) != getattr(defaults, k)}
        doc: dict[str, Any] = {"torchchaos": FORMAT_VERSION}
        doc.update({k: v for k, v in (("name", self.name), ("summary", self.summary),
                                      ("source", self.source)) if v})
        doc.update(job=job, seed=s.seed, faults=[_fault_entry(f.text, note) for f, note
                                                  in zip(s.faults, self._notes())])
        if s.checks is not None:
            doc["checks"] = list(s.checks)
        if bounds:
            doc["bounds"] = bounds
        if self.expect is not None:
            doc["expect"] = self.expect.to_dict()
        if self.resolved is not None:
            doc["resolved"] = self.resolved
        if self.incident is not None:
            doc["incident"] = self.incident
        return doc

    def _notes(self) -> list[str]:
        return self.notes + [""] * (len(self.scenario.faults) - len(self.notes))

    def dumps(self, base_dir: Path | None = None, fmt: str = "yaml") -> str:
        doc = self.to_dict(base_dir)
        if fmt == "json":
            return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)

    def save(self, path: Path) -> Path:
        """Write as YAML (or JSON for a .json name), script relative to the file."""
        fmt = "json" if path.suffix == ".json" else "yaml"
        path.write_text(self.dumps(path.resolve().parent, fmt))
        return path


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with text of several lines (a summary, a timeline) as a `|` block."""


def _text_block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text.rstrip("\n") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text_block)


def _relative(script: str, base_dir: Path | None) -> str:
    if base_dir is None:
        return script
    return os.path.relpath(Path(script).resolve(), base_dir.resolve())


def _fault_entry(spec: str, note: str) -> str | dict[str, str]:
    return {"fault": spec, "note": note} if note else spec


# -- reading -----------------------------------------------------------------------------

def load(path: Path, script: str | None = None, args: list[str] | None = None) -> ScenarioFile:
    """Read a scenario file; `script`/`args` point it at another training script.

    Raises UsageError with a one-line reason naming the file for anything malformed.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read scenario file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None
    return loads(text, path, script, args)


def loads(text: str, path: Path, script: str | None = None,
          args: list[str] | None = None) -> ScenarioFile:
    """Parse a file's text (JSON for a .json name, else YAML); relative script paths are
    taken from path's folder."""
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}):"
                         f" {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UsageError(f"{path}: not valid YAML{where}: {problem}") from None
    try:
        return _from_doc(doc, path, script, args)
    except UsageError as exc:  # the same kind of error (Unavailable stays a skip in pytest)
        raise type(exc)(f"{path}: {exc}") from None


def _from_doc(doc: Any, path: Path, script: str | None,
              args: list[str] | None) -> ScenarioFile:
    _mapping(doc, "the file", TOP_KEYS)
    version = doc.get("torchchaos", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise UsageError(f"torchchaos: {version!r} is not a format this version reads"
                         f" (it reads {FORMAT_VERSION})")
    job = _mapping(doc.get("job"), "job", JOB_KEYS, required=("script",))
    bounds = _mapping(doc.get("bounds", {}), "bounds", BOUND_KEYS)
    faults = _list(doc.get("faults", []), "faults")
    specs, notes = zip(*[_fault(item, f"faults[{i}]") for i, item in enumerate(faults)]) \
        if faults else ((), ())
    kwargs: dict[str, Any] = {k: v for k, v in job.items()
                              if k not in ("script", "args", "start_from", "links")}
    kwargs.update(bounds)
    _check_types(kwargs)
    if "start_from" in job:
        kwargs["start_from"] = _path(job["start_from"], "job.start_from", path)
    kwargs["links"] = [os.path.normpath(path.absolute().parent / _text(link, f"job.links[{i}]"))
                       for i, link in enumerate(_list(job.get("links", []), "job.links"))]
    if script is None:
        script = _path(job["script"], "job.script", path)
        args = _args(job.get("args", []), "job.args") if args is None else args
    checks = doc.get("checks")
    if checks is not None:
        checks = [_text(c, f"checks[{i}]") for i, c in enumerate(_list(checks, "checks"))]
    scenario = Scenario.build(script, faults=list(specs), args=list(args or []),
                              seed=_int(doc.get("seed", 0), "seed"), checks=checks, **kwargs)
    resolved = _resolved(doc.get("resolved"), scenario)
    return ScenarioFile(scenario, name=_text(doc.get("name", ""), "name"),
                        summary=_text(doc.get("summary", ""), "summary"),
                        source=_text(doc.get("source", ""), "source"), notes=list(notes),
                        expect=_expectation(doc.get("expect")), resolved=resolved, path=path,
                        incident=_incident(doc.get("incident")))


def _mapping(value: Any, where: str, known: tuple[str, ...],
             required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a mapping (key: value lines),"
                         f" got {_kind_of(value)}")
    for key in value:
        if key not in known:
            raise UsageError(f"unknown key {key!r} in {where} (known: {', '.join(known)})")
    for key in required:
        if key not in value:
            raise UsageError(f"{where} needs {key}:")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise UsageError(f"{where} must be a list, got {_kind_of(value)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{where} must be text, got {_kind_of(value)}")
    return value


def _path(value: Any, where: str, file: Path) -> str:
    """A path from the file: relative ones are taken from the file's folder."""
    text = _text(value, where)
    return text if os.path.isabs(text) else str((file.resolve().parent / text).resolve())


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{where} must be an integer >= 0, got {value!r}")
    return value


def _kind_of(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:60]


def _args(value: Any, where: str) -> list[str]:
    """Script arguments; YAML numbers become their text (`[--steps, 20]`)."""
    items = _list(value, where)
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise UsageError(f"{where}[{i}] must be text or a number, got {_kind_of(item)}")
    return [str(item) for item in items]


_TYPES: dict[str, tuple[type, ...]] = {"nproc": (int,), "nodes": (int,), "min_nodes": (int,),
                                       "network": (str,), "env": (dict,),
                                       "max_lost_steps": (int,), "max_detect_steps": (int,),
                                       "max_restarts": (int,), "max_relaunches": (int,),
                                       "reference_runs": (int,), "stop_after": (int,),
                                       "max_lost_seconds": (int, float), "timeout": (int, float),
                                       "hang_timeout": (int, float),
                                       "mtbf_hours": (int, float)}


def _check_types(values: dict[str, Any]) -> None:
    for key, value in values.items():
        if value is None and key in ("min_nodes", "max_lost_steps", "max_detect_steps",
                                     "max_lost_seconds", "hang_timeout", "stop_after"):
            continue
        if isinstance(value, bool) or not isinstance(value, _TYPES[key]):
            wanted = " or ".join(t.__name__ for t in _TYPES[key])
            raise UsageError(f"{key} must be {wanted}, got {_kind_of(value)}")
    for key, value in values.get("env", {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise UsageError(f"env entries must be text: text, got {key!r}: {value!r}")


def _fault(item: Any, where: str) -> tuple[str, str]:
    """(spec text, note) from a spec string, {fault: SPEC, note:} or {kind: K, key: value}."""
    if isinstance(item, str):
        spec, note = item, ""
    elif isinstance(item, dict) and "fault" in item:
        _mapping(item, where, ("fault", "note"))
        spec, note = _text(item["fault"], f"{where}.fault"), item.get("note", "")
    elif isinstance(item, dict) and "kind" in item:
        pairs = {k: v for k, v in item.items() if k not in ("kind", "note")}
        for key, value in pairs.items():
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise UsageError(f"{where}.{key} must be text or a number")
        body = ",".join(f"{k}={v}" for k, v in pairs.items())
        spec, note = f"{_text(item['kind'], f'{where}.kind')}:{body}", item.get("note", "")
    else:
        raise UsageError(f"{where} must be a fault spec (kill:rank=1,step=12), or a mapping"
                         f" with fault: or kind:, got {_kind_of(item)}")
    try:
        parse_fault_spec(spec)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return spec, _text(note, f"{where}.note")


def _incident(value: Any) -> dict[str, Any] | None:
    """The imported incident: a mapping whose signature: is a mapping (the rest is read
    by people, and by the postmortem page)."""
    if value is None:
        return None
    _mapping(value, "incident", ("signature", "finding", "ranks", "restarts", "recovery",
                                 "restart_failure", "resumed", "checkpoints", "unknowns",
                                 "artefacts", "passed_over", "world_size", "script",
                                 "steps_kept"))
    _mapping(value.get("signature", {}), "incident.signature",
             ("kind", "role", "phase", "how", "collective", "recovery", "fits", "rank", "step"))
    return value


def _expectation(value: Any) -> Expectation | None:
    if value is None:
        return None
    _mapping(value, "expect", ("verdict", "checks"))
    verdict = value.get("verdict", "pass")
    if verdict not in VERDICTS:
        raise UsageError(f"expect.verdict must be one of {', '.join(VERDICTS)},"
                         f" got {verdict!r}")
    checks = _mapping(value.get("checks", {}), "expect.checks", tuple(_check_names()))
    for name, ok in checks.items():
        if ok not in (True, False, None):
            raise UsageError(f"expect.checks.{name} must be true, false or null, got {ok!r}")
    return Expectation(verdict, dict(checks))


def _check_names() -> list[str]:
    from torchchaos.judge.checks_by_name import check_paths

    return list(check_paths())


def _resolved(value: Any, scenario: Scenario) -> list[dict[str, Any]] | None:
    """The schedule the file says was run; it must be what the file's faults and seed
    resolve to (resolution is a pure function of them), or the file was edited."""
    if value is None:
        return None
    ours = [f.to_dict() for f in resolve(scenario)]
    if _list(value, "resolved") != ours:
        raise UsageError("resolved: differs from what faults: and seed: resolve to (edited?);"
                         " delete resolved: to run the faults as written")
    return ours


def resolve(scenario: Scenario) -> list[schedule.ResolvedFault]:
    return schedule.resolve(scenario.faults, scenario.seed, scenario.nproc, scenario.nodes)


def for_run(scenario: Scenario, faults: list[schedule.ResolvedFault],
            report: Report | None = None) -> ScenarioFile:
    """The replay file of a run: its scenario, resolved schedule and (where it was judged)
    the verdict it came to, so that a replay says whether it reproduced."""
    expect = None
    if report is not None and report.verdict in VERDICTS:
        failing = {n: False for n, c in report.checks.items() if c["ok"] is False}
        expect = Expectation(report.verdict, failing)
    return ScenarioFile(scenario, expect=expect, resolved=[f.to_dict() for f in faults])
