"""The nightly runner (docker-compose.yml, Dockerfile.gpu), the CI workflows
(.github/workflows/) and the sharding recipes (deploy/kubernetes, deploy/slurm): the
structure that matters, every manifest against its schema (GitHub's workflow schema,
Kubernetes' API schemas, both vendored: no network), and every `torchchaos ...` and
`pytest ...` command line in them (comments included, since people copy those)
parsed by the project's real argument parser, or checked against pytest's real
options and markers. Neither Docker, GitHub, Kubernetes nor Slurm runs here: a typo
would otherwise surface at 2 a.m. on the GPU runner. The command lines of the README
and of the documentation pages (docs/) are checked the same way."""

from __future__ import annotations

import re
import shlex
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from torchchaos.cli import main as cli
from torchchaos.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
WORKFLOW = REPO / ".github" / "workflows" / "chaos.yml"
SHARDED = REPO / ".github" / "workflows" / "chaos-sharded.yml"
CRASH_STATES = REPO / ".github" / "workflows" / "crashstates-sharded.yml"
KUBERNETES = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
SLURM = sorted((REPO / "deploy" / "slurm").glob("*.sbatch")) + sorted(
    (REPO / "deploy" / "slurm").glob("*.sh"))
FILES = [COMPOSE, WORKFLOW, SHARDED, CRASH_STATES, *KUBERNETES, *SLURM]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# A script under these folders is the repository's and must exist; any other (train.py,
# a path on the machine a quote was taken on) is the reader's.
REPO_FOLDERS = ("targets", "tests", "examples", "suites", "bench")
KUBERNETES_VERSION = "1.30"  # backoffLimitPerIndex is beta from 1.29


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    if True in doc:  # YAML 1.1 reads a workflow's `on:` key as the boolean true
        doc["on"] = doc.pop(True)
    return doc


def documents(path: Path) -> list[Any]:
    """A YAML file's documents, or a shell script's text."""
    if path.suffix in (".yaml", ".yml"):
        return list(yaml.safe_load_all(path.read_text()))
    return [path.read_text()]


# -- finding command lines -----------------------------------------------------------------

def snippets(node: Any) -> Iterator[str]:
    """Every shell text in a parsed file: strings, and list-form commands (an
    `sh -c SCRIPT` list gives its script)."""
    if isinstance(node, dict):
        for value in node.values():
            yield from snippets(value)
    elif isinstance(node, list):
        if node and all(isinstance(item, str) for item in node):
            if node[0] in ("sh", "bash") and len(node) == 3 and node[1].endswith("c"):
                yield node[2]
            else:
                yield shlex.join(node)
        else:
            for item in node:
                yield from snippets(item)
    elif isinstance(node, str):
        yield node


def comment_text(path: Path) -> str:
    """The commands in the file's comments: comment lines indented by two spaces or more
    after the `#` (prose has one), as shell text."""
    lines = [line.strip()[1:] for line in path.read_text().splitlines()
             if line.strip().startswith("#")]
    return "\n".join(line for line in lines if line.startswith("  "))


def command_lines(text: str) -> Iterator[list[str]]:
    """Each simple command of a shell text, as tokens. Variables become a placeholder
    (or their `${VAR:-default}`), as a shell would hand the program a word there."""
    text = re.sub(r"\$\{\{[^}]*\}\}", "x", text)  # GitHub expressions
    text = text.replace("$$", "$")  # compose's escaped dollar
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    text = re.sub(r'"\$\{\w+\[@\]\}"', "", text)  # a bash array: its default is empty
    text = re.sub(r"\$\{?\w+\}?", "x", text)
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        for segment in re.split(r"&&|\|\||;|\|", line):
            try:
                tokens = shlex.split(segment, comments=True)
            except ValueError:  # a piece of a larger construct ($(...), quotes)
                continue
            if tokens:
                yield tokens


def tool_args(tokens: list[str], tool: str) -> list[str] | None:
    """The arguments of `tool` in a command (after sudo, env, python -m, docker compose
    run ...), or None when it does not run it. A `torchchaos` with nothing after it, or
    followed by another `torchchaos`, is compose's service of that name."""
    for i, token in enumerate(tokens):
        if token != tool:
            continue
        if tool == "torchchaos" and (tokens[i + 1:i + 2] in ([], [tool])
                                     or _compose_service(tokens, i)):
            continue
        return tokens[i + 1:]
    return None


def _compose_service(tokens: list[str], i: int) -> bool:
    """tokens[i] is the service of a `docker compose run` / `docker-compose run` (only
    options between `run` and it)."""
    if "run" not in tokens[:i]:
        return False
    at = len(tokens[:i]) - 1 - tokens[:i][::-1].index("run")
    composed = "docker-compose" in tokens[:at] or "compose" in tokens[:at]
    return composed and all(t.startswith("-") for t in tokens[at + 1:i])


def all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in FILES:
        texts = [*snippets(documents(path)), comment_text(path)]
        for text in texts:
            found += [(f"{path.name}: {shlex.join(t)}", t) for t in command_lines(text)]
    return found


def markdown_commands(path: Path) -> list[tuple[str, list[str]]]:
    """The command lines of a Markdown page's fenced code blocks: in a transcript, each
    `$ ` line (with its `\\` continuations; the rest is output); every line of a bash,
    sh or console block without prompts; the shell of a YAML block (a CI job)."""
    found = []
    blocks = re.findall(r"^ *```(\w*)[^\n]*\n(.*?)^ *```", path.read_text(),
                        re.MULTILINE | re.DOTALL)
    for language, body in blocks:
        lines = textwrap.dedent(body).splitlines()
        if any(line.startswith("$ ") for line in lines):
            shell, going_on = [], False
            for line in lines:
                if line.startswith("$ ") or going_on:
                    shell.append(line[2:] if line.startswith("$ ") else line)
                    going_on = line.endswith("\\")
            texts = ["\n".join(shell)]
        elif language in ("bash", "sh", "shell", "console"):
            texts = ["\n".join(lines)]
        elif language in ("yaml", "yml"):
            try:
                texts = list(snippets(list(yaml.safe_load_all("\n".join(lines)))))
            except yaml.YAMLError:
                texts = []
        else:
            continue
        for text in texts:
            for tokens in command_lines(text):
                tokens = tokens[:-1] if tokens[-1] == "&" else tokens  # a background job
                where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
                found.append((f"{where}: {shlex.join(tokens)}", tokens))
    return found


# -- checking them -------------------------------------------------------------------------

def marker_names(config: pytest.Config) -> set[str]:
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in config.getini("markers")}


def pytest_problems(args: list[str], config: pytest.Config) -> list[str]:
    """What pytest would refuse in these arguments: unknown options, unknown markers."""
    problems = []
    markers = marker_names(config)
    for i, arg in enumerate(args):
        if i and args[i - 1] == "--chaos-args":  # its value is the script's arguments
            continue
        if arg == "-m" and i + 1 < len(args):
            used = set(re.findall(r"[A-Za-z_]\w*", args[i + 1])) - {"and", "or", "not"}
            problems += [f"unknown marker {m!r}" for m in sorted(used - markers)]
        elif arg.startswith("-") and arg != "--":
            name = arg.split("=")[0] if arg.startswith("--") else arg[:2]
            try:
                config.getoption(name)
            except ValueError:
                problems.append(f"unknown option {name!r}")
    return problems


def torchchaos_problems(args: list[str], config: pytest.Config,
                        readers_scripts: bool = False) -> list[str]:
    """What `torchchaos ARGS` would refuse (its real parser); `suite` passes its
    arguments to pytest. With `readers_scripts`, only a script under one of the
    repository's folders must exist (the docs run the reader's train.py too)."""
    if args[0] == "suite":
        return pytest_problems(args[1:], config)
    try:
        ns = cli.build_parser().parse_args(args)
    except UsageError as exc:
        return [str(exc)]
    script = getattr(ns, "script", None)
    if readers_scripts and script is not None and Path(script).parts[0] not in REPO_FOLDERS:
        return []  # the reader's own script, or a path on the machine a quote came from
    if script is not None and not (REPO / script).is_file():
        return [f"no script {script} in the repository"]
    return []


def problems_of(tokens: list[str], config: pytest.Config,
                readers_scripts: bool = False) -> list[str]:
    args = tool_args(tokens, "torchchaos")
    if args is not None:
        return torchchaos_problems(args, config, readers_scripts)
    args = tool_args(tokens, "pytest")
    return pytest_problems(args, config) if args is not None else []


def test_every_command_line_parses(request: pytest.FixtureRequest) -> None:
    commands = all_commands()
    checked = [(where, t) for where, t in commands
               if tool_args(t, "torchchaos") is not None or tool_args(t, "pytest") is not None]
    subcommands = {tool_args(t, "torchchaos")[0] for _, t in checked  # type: ignore[index]
                   if tool_args(t, "torchchaos") is not None}
    # the lines this test is about are really found (a broken finder passes vacuously)
    assert {"battery", "campaign", "crashpoints", "suite", "report", "run",
            "merge"} <= subcommands
    assert any(tool_args(t, "pytest") is not None for _, t in checked)
    failures = [f"{where}\n    {p}" for where, t in checked
                for p in problems_of(t, request.config)]
    assert not failures, "\n".join(failures)


def test_every_command_line_in_the_readme_and_the_docs_parses(
        request: pytest.FixtureRequest) -> None:
    commands = [found for page in PAGES for found in markdown_commands(page)]
    checked = [(where, t) for where, t in commands
               if tool_args(t, "torchchaos") is not None or tool_args(t, "pytest") is not None]
    subcommands = {tool_args(t, "torchchaos")[0] for _, t in checked  # type: ignore[index]
                   if tool_args(t, "torchchaos") is not None}
    # the finder really finds them, in the README and in the pages
    assert {"battery", "campaign", "crashpoints", "doctor", "export", "gather", "merge",
            "node", "replay", "run", "search", "suite"} <= subcommands
    assert {where.split(":")[0] for where, _ in checked} >= {
        "README.md", "docs/tutorials/storage-faults.md", "docs/how-to/sharding.md"}
    assert any(tool_args(t, "pytest") is not None for _, t in checked)
    failures = [f"{where}\n    {p}" for where, t in checked
                for p in problems_of(t, request.config, readers_scripts=True)]
    assert not failures, "\n".join(failures)


def test_markdown_transcripts_give_their_commands_not_their_output(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        ```
        $ torchchaos run --fault kill:rank=1,step=7 \\
            -- targets/ddp_lm.py --steps 20 &
        check                 verdict  detail
        torchchaos: error: not a command
        ```

          ```bash
          torchchaos battery --rnus 3   # in a list item
          ```

        ```
        torchchaos output, not a command
        ```
        """))
    commands = [tokens for _, tokens in markdown_commands(page)]
    assert commands == [["torchchaos", "run", "--fault", "kill:rank=1,step=7", "--",
                         "targets/ddp_lm.py", "--steps", "20"],
                        ["torchchaos", "battery", "--rnus", "3"]]


@pytest.mark.parametrize("line,problem", [
    ("torchchaos campaign --quiet --runs 20 --out /runs/x/campaign", None),
    ("torchchaos campaign --quiet --rnus 20 --out /runs/x/campaign", "--rnus"),
    ("torchchaos battery --nproc two", "expected an integer, got 'two'"),
    ("sudo env PATH=x torchchaos batery --out r", "invalid choice: 'batery'"),
    ("torchchaos battery targets/ddp_lm2.py --steps 20", "no script targets/ddp_lm2.py"),
    ("docker compose run --rm trainer torchchaos crashpoints --cap 5 --moed kill", "--moed"),
    ("python -m pytest -ra -m gpu --junitxml out.xml", None),
    ("python -m pytest -ra -m gpus", "unknown marker 'gpus'"),
    ("torchchaos suite -m 'chaos_kills or chaos_storage' --chaos-nproc 2", None),
    ("torchchaos suite -m chaos_kill --chaos-dir d", "unknown marker 'chaos_kill'"),
    ("torchchaos suite --chaos-nprocs 2", "unknown option '--chaos-nprocs'"),
    ("pytest --pyargs torchchaos.suites --chaos-args '--ckpt-dir x' -m chaos_kills", None),
])
def test_the_check_catches_a_misspelt_line(request: pytest.FixtureRequest, line: str,
                                           problem: str | None) -> None:
    (tokens,) = command_lines(line)
    problems = problems_of(tokens, request.config)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_command_lines_survive_the_file_syntax() -> None:
    compose = "out=/runs/$${NIGHTLY_ID}\ntorchchaos campaign --runs $${RUNS:-20} --out $$out || s=1"
    assert list(command_lines(compose))[1] == ["torchchaos", "campaign", "--runs", "20",
                                               "--out", "x"]
    workflow = "docker compose run --rm trainer torchchaos battery --out /runs/${{ env.ID }}/b"
    (tokens,) = command_lines(workflow)
    assert tool_args(tokens, "torchchaos") == ["battery", "--out", "/runs/x/b"]


# -- docker-compose.yml --------------------------------------------------------------------

def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume name or host path."""
    pairs = [m.rsplit(":", 1) for m in service.get("volumes", [])]  # ${VAR:-x}:/path
    return {inside: outside for outside, inside in pairs}


def test_compose_keeps_toxiproxy_and_the_cpu_service() -> None:
    services = load(COMPOSE)["services"]
    assert services["toxiproxy"]["image"].startswith("ghcr.io/shopify/toxiproxy:")
    cpu = services["torchchaos"]
    assert cpu["build"]["context"] == "${TORCHCHAOS_CONTEXT:-.}"
    assert cpu["build"]["args"]["BASE"] == "${TORCHCHAOS_BASE:-python:3.11-slim-bookworm}"
    for service in (cpu, services["trainer"]):  # named, never privileged (refused here)
        assert "privileged" not in service
        assert set(service["cap_add"]) == {"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}
        assert service["devices"] == ["/dev/fuse:/dev/fuse"]
    assert cpu["environment"]["TORCHCHAOS_TOXIPROXY"] == "http://toxiproxy:8474"
    assert cpu["command"][-1] == "tests/faults/test_toxiproxy.py"


def test_compose_trainer_has_every_gpu_and_shares_runs_with_the_report() -> None:
    doc = load(COMPOSE)
    trainer, report = doc["services"]["trainer"], doc["services"]["report"]
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    assert "toxiproxy" in trainer["depends_on"]
    assert trainer["environment"]["TORCHCHAOS_TOXIPROXY"] == "http://toxiproxy:8474"
    assert trainer["environment"]["TORCHCHAOS_TOXIPROXY_UPSTREAM"] == "trainer"
    dockerfile = REPO / trainer["build"]["dockerfile"]
    assert "torch==2.13.0" in dockerfile.read_text()
    # the runs the trainer writes are the runs the report step reads
    assert mounts(trainer)["/runs"] == mounts(report)["/runs"] == "runs"
    assert "runs" in doc["volumes"] and "/reports" in mounts(report)
    script = trainer["command"][2]
    assert script.count("--out $$out/") >= 3 and "out=/runs/" in script
    assert "-m gpu" in script  # the GPU tests, which the default addopts leave out
    assert "cd /runs/" in report["command"][2] and "/reports/" in report["command"][2]


# -- .github/workflows/chaos.yml -----------------------------------------------------------

def steps_of(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job["steps"]


def uploads(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in steps_of(job) if str(s.get("uses", "")).startswith(
        "actions/upload-artifact@")]


def test_workflow_triggers_and_jobs() -> None:
    doc = load(WORKFLOW)
    assert "pull_request" in doc["on"] and doc["on"]["schedule"][0]["cron"]
    jobs = doc["jobs"]
    cpu, gpu = jobs["cpu-battery"], jobs["gpu-nightly"]
    assert cpu["runs-on"].startswith("ubuntu") and "schedule" in cpu["if"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"]) and "schedule" in gpu["if"]
    cpu_runs = "\n".join(s.get("run", "") for s in steps_of(cpu))
    assert "sudo apt-get install -y -qq fuse3 nftables iproute2" in cpu_runs
    assert ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
            in cpu_runs)
    assert "pip install -e '.[test]'" in cpu_runs
    assert "torchchaos battery" in cpu_runs and "targets/ddp_lm.py" in cpu_runs
    assert "docker compose run --rm trainer" in "\n".join(s.get("run", "")
                                                           for s in steps_of(gpu))


def test_workflow_uploads_even_when_the_checks_fail() -> None:
    jobs = load(WORKFLOW)["jobs"]
    for name, job in jobs.items():
        (upload,) = uploads(job)
        assert upload["if"] == "always()", name
    assert uploads(jobs["cpu-battery"])[0]["with"]["path"] == "torchchaos-runs/"
    # the nightly uploads the folder the report service writes to
    gpu = jobs["gpu-nightly"]
    assert gpu["env"]["TORCHCHAOS_REPORTS"].endswith("/torchchaos-reports")
    assert uploads(gpu)[0]["with"]["path"] == "torchchaos-reports/"
    collect = next(s for s in steps_of(gpu) if "run --rm report" in s.get("run", ""))
    assert collect["if"] == "always()"


def test_workflow_runs_only_services_compose_defines() -> None:
    services = set(load(COMPOSE)["services"])
    for step in steps_of(load(WORKFLOW)["jobs"]["gpu-nightly"]):
        for tokens in command_lines(step.get("run", "")):
            if tokens[:3] == ["docker", "compose", "run"]:
                named = [t for t in tokens[3:] if not t.startswith("-")][0]
                assert named in services, step
            if tokens[:3] == ["docker", "compose", "build"]:
                assert set(tokens[3:]) <= services, step


# -- the sharding recipes: GitHub matrix, Kubernetes Indexed Job, Slurm array --------------

def test_the_workflows_validate_against_github_s_schema(tmp_path: Path) -> None:
    def check(*paths: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["check-jsonschema", "--builtin-schema",
                               "vendor.github-workflows", *map(str, paths)],
                              capture_output=True, text=True, timeout=120)

    done = check(WORKFLOW, SHARDED, CRASH_STATES)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"  # the check is real: a misspelt key fails it
    broken.write_text(SHARDED.read_text().replace("runs-on:", "runs_on:", 1))
    assert check(broken).returncode == 1


def test_the_kubernetes_manifests_validate_against_the_api_schema() -> None:
    kinds = []
    for path in KUBERNETES:
        for doc in documents(path):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            kinds.append(doc["kind"])
    assert sorted(kinds) == ["Job", "Job", "PersistentVolumeClaim"]
    job = documents(KUBERNETES[1])[1]
    job["spec"]["completionz"] = 4  # the check is real: a misspelt field fails it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


def test_every_shard_of_the_indexed_job_and_the_matrix_is_run_and_merged() -> None:
    (job,) = [d for d in documents(REPO / "deploy/kubernetes/campaign-shards.yaml")
              if d["kind"] == "Job"]
    spec, (container,) = job["spec"], job["spec"]["template"]["spec"]["containers"]
    count = {e["name"]: e["value"] for e in container["env"]}["TORCHCHAOS_SHARD_COUNT"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(count)
    assert "--shard auto" in container["command"][2]
    assert "shard-$JOB_COMPLETION_INDEX" in container["command"][2]
    (merge,) = documents(REPO / "deploy/kubernetes/campaign-merge.yaml")
    claim = job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]
    assert merge["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == claim
    workflow = load(SHARDED)
    shards = workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, int(workflow["env"]["SHARDS"]) + 1))
    merge_job = workflow["jobs"]["merge"]
    assert merge_job["needs"] == "shard" and merge_job["if"] == "always()"
    assert any("torchchaos merge shards/shard-*" in s.get("run", "")
               for s in merge_job["steps"])


def test_the_crash_state_shards_judge_the_one_recording_the_record_job_made() -> None:
    workflow = load(CRASH_STATES)
    jobs = workflow["jobs"]
    assert jobs["shard"]["needs"] == "record" and jobs["merge"]["needs"] == "shard"
    (recorded,) = [s for s in jobs["record"]["steps"] if "--record-only" in s.get("run", "")]
    assert "--cache-dir cache" in recorded["run"]
    uploaded = [s for s in jobs["record"]["steps"] if "upload-artifact" in s.get("uses", "")]
    downloaded = [s for s in jobs["shard"]["steps"] if "download-artifact" in s.get("uses", "")]
    assert uploaded[0]["with"]["path"] == "cache/" and downloaded[0]["with"]["path"] == "cache"
    assert uploaded[0]["with"]["name"] == downloaded[0]["with"]["name"]
    (judged,) = [s for s in jobs["shard"]["steps"] if "--shard auto" in s.get("run", "")]
    job = "-- targets/ddp_lm.py --steps 20 --ckpt-every 5"  # the job the recording is of
    assert "--cache-dir cache" in judged["run"] and job in judged["run"] and job in recorded["run"]
    shards = jobs["shard"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, int(workflow["env"]["SHARDS"]) + 1))


def test_the_slurm_scripts_are_bash_and_the_merge_waits_for_the_array() -> None:
    """bash -n on each; that they run is tests/e2e/test_slurm_recipes.py's, on a cluster."""
    for path in SLURM:
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"
    submit = (REPO / "deploy/slurm/submit.sh").read_text()
    assert '--dependency="afterany:$array"' in submit  # the merge starts after every task
    assert "--shard auto" in (REPO / "deploy/slurm/campaign-array.sbatch").read_text()
    assert "shard-*" in (REPO / "deploy/slurm/merge.sbatch").read_text()
