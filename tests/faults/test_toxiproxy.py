"""The Toxiproxy backend (`toxic` faults).

The parts that need no server run everywhere: the spec's checks and the clear
refusal when no server answers. The parts that need a Toxiproxy server run
where one is reachable at $TORCHCHAOS_TOXIPROXY (docker-compose.yml starts
one beside the harness); elsewhere they skip and say why. No server is
installable on the machine CI runs on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, TARGET

from torchchaos.errors import UsageError
from torchchaos.faults import toxic
from torchchaos.faults.contract import JobContext
from torchchaos.scenario.schedule import ResolvedFault
from torchchaos.scenario.spec import Trigger, parse_fault_spec

needs_server = pytest.mark.skipif(bool(toxic.unreachable_reason()),
                                  reason=toxic.unreachable_reason() or "ok")
STEPS = ["--steps", "16", "--ckpt-every", "4", "--timeout", "3"]


@pytest.mark.parametrize("spec, error", [
    ("toxic:step=3", "toxic needs type="),
    ("toxic:step=3,type=latency", "toxic type=latency needs latency="),
    ("toxic:step=3,type=bandwidth,latency=5", "has no attribute latency="),
    ("toxic:step=3,type=timeout,flaps=2", "flaps= and gap= need for="),
    ("toxic:rank=0,step=3,type=timeout", "hits a node, not a rank"),
])
def test_bad_specs_are_refused_in_one_line(spec, error):
    with pytest.raises(UsageError, match=error):
        parse_fault_spec(spec)


def _cli(*args: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO),
                                                      **environ})


@pytest.mark.parametrize("network, error", [
    ("host", "toxic: no Toxiproxy server at 127.0.0.1:1"),
    ("netns", "toxic needs --network host"),
])
def test_a_run_that_cannot_have_its_toxic_is_refused(tmp_path, network, error):
    done = _cli("run", "--nodes", "2", "--network", network, "--out", str(tmp_path / "o"),
                "--fault", "toxic:step=3,type=latency,latency=100", "--", str(TARGET),
                environ={toxic.URL_ENV: "http://127.0.0.1:1"})
    assert done.returncode == 2, done.stderr
    assert error in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("0.0.0.0", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _round_trip(endpoint: str) -> float:
    host, port = endpoint.rsplit(":", 1)
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
    return time.monotonic() - start


@needs_server
def test_a_latency_toxic_slows_the_store_path_until_healed():
    server, port = _echo_server()
    kind = toxic.Toxic()
    fault = ResolvedFault("f0-toxic", "toxic", "node", 1, Trigger(step=1),
                          {"type": "latency", "latency": 300}, "toxic", 0)
    ctx = JobContext(run_dir=None, run_id="test", store_port=port)  # type: ignore[arg-type]
    resource = kind.setup_job([fault], ctx)
    ctx.resources["toxic"] = resource
    try:
        assert _round_trip(resource.rendezvous_endpoint) < 0.3
        heal, details = kind.cut(fault, ctx)
        assert details["toxic"] == "latency"
        assert _round_trip(resource.rendezvous_endpoint) >= 0.3
        heal()
        assert _round_trip(resource.rendezvous_endpoint) < 0.3
    finally:
        resource.close()
        server.close()


@needs_server
@pytest.mark.parametrize("fault", ["toxic:step=6,type=latency,latency=500,for=4",
                                   "toxic:step=6,type=timeout,timeout=0,for=4"])
def test_the_reference_target_rides_out_a_bad_store_path(chaos_run, fault):
    report = chaos_run(TARGET, faults=[fault], args=STEPS, nproc=1, nodes=2, network="host",
                       expect="pass")
    assert report.faults[0]["fired"], report.table()
