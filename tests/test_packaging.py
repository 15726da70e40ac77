"""The package as users install it: the wheel, in a fresh venv, next to a project of theirs.

The repository keeps chaos/, faults/, suites/ and targets/ at its top; pyproject.toml
installs them as one namespace, `torchchaos`. These tests build the real wheel and
check that it adds nothing else to an environment, and that a project with folders of
those very names imports its own and ours side by side, with the plugin running a real
chaos run from the wheel (the ranks load the agent from it too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCE_PACKAGES = {"chaos": "torchchaos", "faults": "torchchaos/faults",
                   "suites": "torchchaos/suites", "targets": "torchchaos/targets"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout's files (a `build/` folder left in the
    repository would otherwise lend the wheel modules that pyproject.toml leaves out)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(source)], check=True, capture_output=True,
                   timeout=300, cwd=out)
    (found,) = out.glob("torchchaos-*.whl")
    return found


def test_the_wheel_installs_one_top_level_package_and_every_source_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"torchchaos"}, tops
    # every module of the repository's package folders is in it, under its installed name
    # (a new subpackage left out of pyproject.toml's list would be missing here)
    wanted = {f"{installed}/{path.relative_to(REPO / folder).as_posix()}"
              for folder, installed in SOURCE_PACKAGES.items()
              for path in (REPO / folder).rglob("*")
              if path.suffix in {".py", ".pyi", ".yaml", ".json"}
              and "__pycache__" not in path.parts}
    assert sorted(wanted - set(names)) == []


def _venv(tmp_path: Path, wheel: Path) -> Path:
    """A fresh venv with the wheel, its dependencies taken from this interpreter's
    site-packages as a plain path (so no editable install of the repository comes along)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=300,
                   env=_users_environ(venv))
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True,
                          env=_users_environ(venv)).stdout
    Path(site.strip(), "deps-of-the-test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _users_environ(venv: Path) -> dict[str, str]:
    """A user's shell with the venv on PATH: none of the suite's own variables, and no
    PYTHONPATH (the suite's names the checkout, whose egg-info pip would find first)."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHCHAOS_", "PYTEST_", "PYTHONPATH"))}
    environ["PATH"] = f"{venv / 'bin'}{os.pathsep}{environ['PATH']}"
    return environ


def _users_project(root: Path) -> None:
    """A project with its own packages named as ours are in the repository."""
    for package in SOURCE_PACKAGES:
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"OWNER = 'the user ({package})'\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_theirs.py").write_text(textwrap.dedent("""\
        import chaos, faults, suites, targets
        import torchchaos
        from torchchaos.explore.battery import BUNDLED_TARGET


        def test_both_import():
            for package in (chaos, faults, suites, targets):
                assert package.OWNER.startswith("the user"), package.__file__
            assert "site-packages" in torchchaos.__file__, torchchaos.__file__


        def test_a_chaos_run_from_the_wheel(chaos_run):
            report = chaos_run(str(BUNDLED_TARGET), faults=["kill:rank=1,step=6"],
                               args=["--steps", "10"], expect="pass")
            assert report.restarts == 1
        """))


def test_a_users_project_with_folders_named_as_ours_runs_the_plugin(
        tmp_path: Path, wheel: Path) -> None:
    venv = _venv(tmp_path, wheel)
    environ = _users_environ(venv)
    files = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", "-f",
                            "torchchaos"], check=True, capture_output=True, text=True,
                           env=environ).stdout
    listed = [line.strip() for line in files.split("Files:", 1)[1].splitlines() if line.strip()]
    assert {f.split("/")[0] for f in listed if ".dist-info" not in f and not f.startswith("..")} \
        == {"torchchaos"}, listed
    project = tmp_path / "project"
    _users_project(project)
    result = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p",
                             "no:cacheprovider", "--chaos-cache-dir", str(tmp_path / "cache"),
                             "tests"], cwd=project, env=environ, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout
    version = subprocess.run([str(venv / "bin" / "torchchaos"), "--version"], env=environ,
                             capture_output=True, text=True, cwd=project)
    assert version.stdout.startswith("torchchaos "), version


def test_the_images_wheels_cover_every_extra_the_test_extra_names() -> None:
    """`.[test]` names `torchchaos[docs,megatron]`: the image's offline install needs the
    wheels of both (one extra read as "docs,megatron" found none, and the build failed)."""
    import tomllib

    from torchchaos.host.docker.images import requirements

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    wanted = set(requirements(REPO))
    for extra in ("docs", "megatron"):
        assert set(extras[extra]) <= wanted, extra
