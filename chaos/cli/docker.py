"""`torchchaos docker up|down|status|build`: a Docker engine of torchchaos's own on this
machine, and the project's image built in it without a registry (docs/how-to/containers.md)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from torchchaos.host.owners import state_dir

DEFAULT_FOLDER = "docker"  # in the state folder: /run/torchchaos/docker for root


def default_root() -> Path:
    return state_dir() / DEFAULT_FOLDER


def add_commands(sub: Any) -> None:
    docker = sub.add_parser(
        "docker", help="start or stop a Docker engine of torchchaos's own; build the image",
        description="A Docker engine on this machine, with everything of its own in DIR:"
        " `up` starts Debian's dockerd (no default bridge, no iptables rules) and prints the"
        " DOCKER_HOST line for docker and docker-compose; `build` makes the Debian base with"
        " debootstrap (once: it is cached) and builds this repository's Dockerfile on it"
        " offline, or on --base where a registry serves one; `down` removes every"
        " container, stops the daemon and removes DIR. Needs root and Debian's docker.io"
        " (and debootstrap for the base).")
    actions = docker.add_subparsers(dest="docker_command", required=True)
    actions.add_parser("up", help="start the engine; print its DOCKER_HOST")
    build = actions.add_parser("build", help="build the project's image in the engine")
    build.add_argument("--base", default=None, metavar="IMAGE",
                       help="the image to build on (default: the Debian base made here)")
    build.add_argument("--repo", type=Path, default=None, metavar="DIR",
                       help="the torchchaos checkout whose Dockerfile is built (default: the"
                       " one this torchchaos is installed from)")
    for action in (actions.choices["up"], build,
                   actions.add_parser("down", help="stop the engine, remove its folder"),
                   actions.add_parser("status", help="whether the engine answers")):
        action.add_argument("--dir", type=Path, default=None, metavar="DIR",
                            help=f"the engine's folder (default {default_root()})")


def cmd_docker(ns: argparse.Namespace) -> int:
    from torchchaos.cli.output import progress_printer
    from torchchaos.errors import UsageError
    from torchchaos.host.docker import images
    from torchchaos.host.docker.engine import Engine

    root = ns.dir if ns.dir is not None else default_root()
    if ns.docker_command == "up":
        engine = Engine.start(root, owned=False)
        print(f"docker up: dockerd answers; its log: {engine.log}")
        print(f"export DOCKER_HOST={shlex.quote(engine.env()['DOCKER_HOST'])}")
        return 0
    engine = Engine.of(root)
    if ns.docker_command == "status":
        answers = engine.answers()
        print("dockerd answers" if answers else f"dockerd does not answer ({engine.log})")
        return 0 if answers else 1
    if ns.docker_command == "build":
        repo = ns.repo or images.checkout()
        if repo is None:
            raise UsageError("this torchchaos is not installed from a checkout: pass --repo"
                             " DIR, a clone of the repository, whose Dockerfile is built")
        say = progress_printer(False)
        base = ns.base or images.base_image(engine, say)
        print(images.build_image(engine, repo.resolve(), base, say))
        return 0
    from torchchaos.cli.output import print_down

    return print_down("docker", root, engine.stop())


COMMANDS = {"docker": cmd_docker}
