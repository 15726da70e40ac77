"""The documentation cannot rot: the site builds with every warning an error (a page
left out of the nav, a link to a missing page or anchor, a reference page whose code
changed without its words, see docs/hooks.py), the README fits on a screen and each
of its relative links points to a file that exists. The command lines in the README
and the pages are parsed by tests/test_deploy_files.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def mkdocs_build(config: Path, site: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    # TMPDIR: the hooks' scratch tree goes under pytest's folder, never the machine's
    env = {**os.environ, "TMPDIR": str(tmp), "NO_MKDOCS_2_WARNING": "1"}
    # no --quiet: MkDocs 1.6 counts --strict's warnings only where it logs them
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    done = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site", tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output and "ERROR" not in output, output
    site = tmp_path / "site"
    # the generated reference pages are there, with what they are made from
    assert "torchchaos battery" in (site / "reference" / "cli" / "index.html").read_text()
    faults = (site / "reference" / "faults" / "index.html").read_text()
    assert all(f'id="{kind}"' in faults for kind in ("kill", "storage", "bitflip", "hang",
                                                       "partition", "link", "straggler", "toxic"))
    assert 'id="deterministic_resume"' in (site / "reference" / "checks" / "index.html"
                                           ).read_text()
    assert "run_scenario" in (site / "reference" / "api" / "index.html").read_text()
    assert (site / "timeline-skip-optim.png").is_file()
    assert not any(tmp_path.glob("torchchaos-docs-*")), "the hooks' scratch tree was left"


@pytest.mark.parametrize("page,problem", [
    ("[the missing page](missing.md)", "missing.md"),
    ("[a missing anchor](other.md#no-such-heading)", "no-such-heading"),
])
def test_a_broken_link_fails_the_build(tmp_path: Path, page: str, problem: str) -> None:
    """The site's own validation settings, on a two-page site with one bad link."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\nSee {page}.\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    small = {"site_name": "t", "docs_dir": str(docs), "validation": config["validation"],
             "markdown_extensions": ["toc"], "nav": ["index.md", "other.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert done.returncode != 0
    assert problem in done.stdout + done.stderr


def test_the_readme_fits_on_a_screen() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; move what does not fit into docs/")


def readme_links() -> list[str]:
    text = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z+.-]*:", target) and not target.startswith("#")]


def test_every_relative_link_in_the_readme_points_to_a_file() -> None:
    links = readme_links()
    assert any(link.startswith("docs/") for link in links)  # the finder finds them
    missing = [link for link in links if not (REPO / link.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
