"""Images without a registry: a Debian base made here, and the project's image on it.

`base_image` makes a root filesystem with Debian's own `debootstrap` (minbase, plus
Python, venv and the system packages the faults need) and imports it into the engine.
The tarball is kept in the cache folder, so a machine that keeps its cache makes it
once (about 45 s here, 300 MB) and later engines import it in seconds.

`build_image` builds the repository's Dockerfile on a base (the one made here, or a
user's `python:3.11-slim-bookworm` where a registry is reachable) with no network: the
context is a copy of the repository's files plus `.wheels/`, every wheel the install
needs, fetched on this machine by pip for the base's own Python version (pip's own
configuration decides where from: on this machine kind, torch's CPU build from the
local file).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from torchchaos.errors import CannotJudge, Unavailable
from torchchaos.host.docker.engine import Engine
from torchchaos.progress import Progress

BASE_REPOSITORY = "torchchaos-base"
SUITE = "bookworm"
MIRROR_ENV = "TORCHCHAOS_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# what the faults need inside (FUSE, nftables, namespaces, ps), and a Python with venv
PACKAGES = ("python3", "python3-venv", "fuse3", "nftables", "iproute2", "util-linux",
            "procps", "ca-certificates",
            # what a node container runs the host's own Python and torch with
            "libstdc++6")
PROJECT_REPOSITORY = "torchchaos"
BUILD_SECONDS = 1800


CACHE_ENV = "TORCHCHAOS_IMAGE_CACHE"


def cache_dir() -> Path:
    """Where the base's tarball is kept: $TORCHCHAOS_IMAGE_CACHE, else the machine's
    /var/cache/torchchaos for root (the base is the machine's, not a session's: a test
    run's own XDG_CACHE_HOME would make it again each time), else ~/.cache/torchchaos."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.geteuid() == 0:
        return Path("/var/cache/torchchaos/docker")
    return Path(os.path.expanduser("~/.cache")) / "torchchaos" / "docker"


def base_tag() -> str:
    """The base's name: it changes when what goes into it does."""
    what = "\n".join([SUITE, mirror(), *PACKAGES]).encode()
    return f"{BASE_REPOSITORY}:{SUITE}-{hashlib.sha256(what).hexdigest()[:10]}"


def mirror() -> str:
    return os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR


def base_image(engine: Engine, progress: Progress | None = None) -> str:
    """The Debian base in `engine` (made, or taken from the cache, then imported): its
    tag."""
    say = progress or _silent
    tag = base_tag()
    client = engine.client()
    try:
        if client.images.list(name=tag):
            return tag
        tarball = cache_dir() / f"{tag.replace(':', '-')}.tar"
        if not tarball.is_file():
            say(f"making the Debian {SUITE} base with debootstrap (once per machine)")
            _debootstrap(tarball)
        say(f"importing {tarball.name}")
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(str(tarball), repository=repository, tag=version)
    finally:
        client.close()
    return tag


def _debootstrap(tarball: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise Unavailable("debootstrap is not installed (apt-get install -y debootstrap):"
                          " without a registry, the base image is made with it")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-") as folder:
        root = Path(folder) / "root"
        log = Path(folder) / "debootstrap.log"
        with open(log, "w") as out:
            done = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                 SUITE, str(root), mirror()], stdout=out, stderr=subprocess.STDOUT,
                timeout=BUILD_SECONDS)
        if done.returncode != 0:
            raise CannotJudge(f"debootstrap of Debian {SUITE} from {mirror()} failed:"
                              f" {_last_line(log)}")
        partial = tarball.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=".")
        partial.rename(tarball)  # whole, or not there


def checkout() -> Path | None:
    """The torchchaos checkout this package runs from (an editable install), if any."""
    import torchchaos

    repo = Path(torchchaos.__file__).resolve().parents[1]
    project = repo / "pyproject.toml"
    if (repo / "Dockerfile").is_file() and project.is_file() \
            and 'name = "torchchaos"' in project.read_text():
        return repo
    return None


def build_image(engine: Engine, repo: Path, base: str, progress: Progress | None = None,
                dockerfile: str = "Dockerfile") -> str:
    """The repository's image on `base`, built offline: its tag."""
    say = progress or _silent
    tag = f"{PROJECT_REPOSITORY}:{_content_hash(repo, base, dockerfile)}"
    client = engine.client(timeout=BUILD_SECONDS)
    try:
        if client.images.list(name=tag):
            return tag
        with staged_context(engine, repo, base, say) as context:
            say(f"building {tag} on {base}")
            _build(client, context, tag, base, dockerfile)
    finally:
        client.close()
    return tag


@contextlib.contextmanager
def staged_context(engine: Engine, repo: Path, base: str,
                   progress: Progress | None = None) -> Iterator[Path]:
    """A build context in the engine's folder, removed afterwards: the repository's files
    and `.wheels/`, every wheel its install needs, for `base`'s Python (what `docker
    build` or docker-compose gets as TORCHCHAOS_CONTEXT)."""
    say = progress or _silent
    with tempfile.TemporaryDirectory(dir=engine.root, prefix="context-") as folder:
        context = Path(folder)
        _copy_repository(repo, context)
        client = engine.client()
        try:
            python = _python_of(client, base)
        finally:
            client.close()
        say(f"fetching the wheels for {base}'s Python {python}")
        _fetch_wheels(repo, context / ".wheels", python)
        yield context


def _build(client: object, context: Path, tag: str, base: str, dockerfile: str) -> None:
    import docker

    try:
        client.images.build(path=str(context), tag=tag, dockerfile=dockerfile,  # type: ignore[attr-defined]
                            buildargs={"BASE": base}, network_mode="none", rm=True,
                            forcerm=True)
    except docker.errors.BuildError as exc:
        said = [str(step.get("stream") or step.get("error") or "").strip()
                for step in exc.build_log]
        said = [line for line in said if line]
        raise CannotJudge(f"the image {tag} could not be built: {exc.msg}"
                          f" ({said[-2] if len(said) > 1 else ''})") from None
    except docker.errors.APIError as exc:
        raise CannotJudge(f"the image {tag} could not be built: {exc.explanation}") from None


def _python_of(client: object, base: str) -> str:
    """The base's Python version, asked of the base itself (wheels must fit it)."""
    import docker

    try:
        said = client.containers.run(  # type: ignore[attr-defined]
            base, ["python3", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            remove=True, network_mode="none")
    except docker.errors.DockerException as exc:
        raise CannotJudge(f"the base {base} has no Python 3 to run: {exc}") from None
    return said.decode().strip()


def _repository_files(repo: Path) -> list[str]:
    """The files git tracks or would track (not what .gitignore leaves out)."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, timeout=60)
    if listed.returncode != 0:
        raise Unavailable(f"{repo} is not a git checkout: the image is built from the"
                          " repository's files")
    return sorted(name for name in set(listed.stdout.decode().split("\0"))
                  if name and (repo / name).is_file())


def _copy_repository(repo: Path, into: Path) -> None:
    for name in _repository_files(repo):
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, into / name)


def requirements(repo: Path) -> list[str]:
    """What `pip install -e '.[test]'` needs, with the build's setuptools."""
    import tomllib  # Python 3.11: building images needs it, the harness does not
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    extras = project["project"].get("optional-dependencies", {})
    name = project["project"]["name"]

    def expand(extra: str) -> list[str]:
        found = []
        for requirement in extras.get(extra, []):
            if requirement.startswith(f"{name}["):  # "torchchaos[docs,megatron]"
                for inner in requirement[len(name) + 1:-1].split(","):
                    found += expand(inner.strip())
            else:
                found.append(requirement)
        return found

    build = project.get("build-system", {}).get("requires", [])
    return [*project["project"]["dependencies"], *expand("test"), *build, "wheel"]


def _fetch_wheels(repo: Path, into: Path, python: str) -> None:
    into.mkdir()
    requirements_file = into.parent / "wheels.txt"
    requirements_file.write_text("\n".join(requirements(repo)) + "\n")
    platforms = [f"--platform={p}" for p in ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64",
                                             "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                             "linux_x86_64", "any")]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(into),
         f"--python-version={python}", "--implementation=cp", "--abi=cp311", "--abi=abi3",
         "--abi=none", *platforms, "--only-binary=:all:", "-r", str(requirements_file)],
        capture_output=True, text=True, timeout=BUILD_SECONDS)
    requirements_file.unlink()
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise CannotJudge(f"pip could not fetch the image's wheels: "
                          f"{(lines or done.stderr.splitlines() or ['?'])[-1]}")


def _content_hash(repo: Path, base: str, dockerfile: str) -> str:
    """Of every file the context gets (8.6 MB here: hashed in well under a second), so an
    image is rebuilt exactly when what it is built from changed."""
    digest = hashlib.sha256(f"{base}\n{dockerfile}\n".encode())
    for name in _repository_files(repo):
        digest.update(name.encode() + b"\0")
        try:
            digest.update((repo / name).read_bytes())
        except OSError:
            continue
    return digest.hexdigest()[:12]


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _silent(_line: str) -> None:
    pass
