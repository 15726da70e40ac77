"""JUnit XML for a sweep (battery, crash points, campaign): one test case a run.

CI systems read JUnit XML to show which runs failed. A run whose verdict is
`fail` is a failure whose message names the failing checks and their
details; one that could not be judged is an error with the reason. Each case
carries the run's fault, verdict, folder and replay command as properties,
the names the pytest plugin uses (`chaos_verdict`, ...). Nothing in it
depends on the machine or the moment but each run's duration, so a merged
sweep's file equals the unsharded one's apart from those.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from torchchaos.report.report_file import MARK, Report

Row = tuple[str, str, str, "Report | None", str]  # folder, name, fault, report, error


def write(path: Path, suite: str, rows: Sequence[Row]) -> Path:
    cases = [_case(suite, *row) for row in rows]
    root = ET.Element("testsuite", {
        "name": suite, "tests": str(len(cases)),
        "failures": str(sum(1 for c in cases if c.find("failure") is not None)),
        "errors": str(sum(1 for c in cases if c.find("error") is not None)),
        "time": f"{sum(float(c.get('time', '0')) for c in cases):.3f}"})
    root.extend(cases)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    return path


def _case(suite: str, folder: str, name: str, fault: str, report: Report | None,
          error: str) -> ET.Element:
    seconds = report.wall_seconds if report else 0.0
    case = ET.Element("testcase", {"classname": suite.replace(" ", "."), "name": name,
                                   "time": f"{seconds:.3f}"})
    properties = ET.SubElement(case, "properties")
    shown = [("chaos_fault", fault), ("chaos_folder", folder),
             ("chaos_verdict", report.verdict if report else "error")]
    if report:
        shown += [(f"chaos_check_{n}", MARK[c["ok"]]) for n, c in report.checks.items()]
        shown += [("chaos_replay", f"torchchaos replay {report.replay}")]
    for key, value in shown:
        ET.SubElement(properties, "property", {"name": key, "value": value})
    if report is None or report.verdict == "error":
        reason = (report.reason if report else error) or "no reason recorded"
        ET.SubElement(case, "error", {"message": f"could not judge: {reason}"[:500]})
    elif report.verdict == "fail":
        failing = {n: report.checks[n] for n in report.failing()}  # the cause first
        failure = ET.SubElement(case, "failure", {"message": ", ".join(failing)})
        failure.text = "\n".join(f"{n}: {c['detail']}" for n, c in failing.items())
    return case
