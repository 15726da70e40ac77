"""The Toxiproxy client's answers when the server misbehaves (torchchaos.faults.toxiproxy_api).

No Toxiproxy server can be installed on this machine kind, so the refusals are
answered here by a small HTTP server that replies as Toxiproxy does (status and
its JSON `{"error": ...}` body); the hung server is a real listener that never
answers. What is tested is the client: a timeout on every call, one line naming
what was refused and why, and a toxic counted in force only once it is listed.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from torchchaos.errors import UsageError
from torchchaos.faults import toxic
from torchchaos.faults.contract import JobContext
from torchchaos.faults.toxiproxy_api import Server, ToxiproxyError
from torchchaos.scenario.schedule import ResolvedFault
from torchchaos.scenario.spec import Trigger


def _answering(routes: dict[tuple[str, str], tuple[int, object]]) -> Iterator[Server]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            status, body = routes.get((self.command, self.path), (404, {"error": "not found"}))
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield Server("127.0.0.1", http.server_address[1], timeout=2.0)
    finally:
        http.shutdown()
        http.server_close()


@pytest.fixture
def refusing() -> Iterator[Server]:
    yield from _answering({
        ("POST", "/proxies"): (500, {"error": "listen tcp 0.0.0.0:4000: bind: address already"
                                              " in use", "status": 500}),
        ("POST", "/proxies/p/toxics"): (409, {"error": "toxic already exists",
                                              "status": 409}),
    })


def test_a_server_that_cannot_listen_says_so(refusing: Server):
    with pytest.raises(ToxiproxyError) as caught:
        refusing.create_proxy("p", listen="0.0.0.0:4000", upstream="127.0.0.1:29500")
    said = str(caught.value)
    assert "refused to create proxy p: it cannot listen on the proxy's port" in said, said
    assert "address already in use" in said and "HTTP 500" in said and "\n" not in said


def test_a_refused_toxic_says_the_servers_reason(refusing: Server):
    with pytest.raises(ToxiproxyError, match=r"refused to add toxic t to p: it already has one"
                                             r" of that name \(toxic already exists; HTTP 409\)"):
        refusing.add_toxic("p", {"name": "t", "type": "latency"})


def test_a_server_that_never_answers_times_out_instead_of_blocking():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        hung = Server("127.0.0.1", listener.getsockname()[1], timeout=0.5)
        began = time.monotonic()
        with pytest.raises(ToxiproxyError, match="did not answer within 0.5 s"):
            hung.create_proxy("p", listen="0.0.0.0:4000", upstream="127.0.0.1:29500")
        assert time.monotonic() - began < 30  # bounded (the limit is generous: no timing test)
    finally:
        listener.close()


def test_something_else_on_the_port_is_no_toxiproxy_server():
    for server in _answering({("GET", "/proxies/p/toxics"): (200, b"<html>a web server")}):
        with pytest.raises(ToxiproxyError, match="no JSON: is it a Toxiproxy server"):
            server.toxics("p")


def test_a_toxic_the_server_took_but_does_not_list_is_not_in_force(tmp_path):
    """The fault's effect is checked, not assumed: `cut` raises, so the nemesis records
    fault_error and no nemesis_begin, and the run reads "could not judge"
    (tests/report/test_fault_effect.py)."""
    for server in _answering({("POST", "/proxies/p/toxics"): (200, {"name": "f0-latency"}),
                              ("GET", "/proxies/p/toxics"): (200, [])}):
        fault = ResolvedFault("f0", "toxic", "node", 1, Trigger(step=6),
                              {"type": "latency", "latency": 500}, "toxic:node=1,step=6", 0)
        ctx = JobContext(tmp_path, "run", resources={
            "toxic": toxic.StoreProxy(server, "p", "127.0.0.1:1")})
        with pytest.raises(ToxiproxyError, match="took toxic f0-latency but does not list it"):
            toxic.Toxic().cut(fault, ctx)


@pytest.mark.parametrize("url, where", [("http://[::1]:8474", "[::1]:8474"),
                                        ("127.0.0.1:9000", "127.0.0.1:9000"),
                                        ("http://toxiproxy", "toxiproxy:8474")])
def test_server_urls_ipv6_included(monkeypatch, url, where):
    monkeypatch.setenv(toxic.URL_ENV, url)
    assert toxic.server().where == where


@pytest.mark.parametrize("url", ["::1:8474", "http://host:port"])
def test_a_url_that_is_none_is_refused_in_one_line(monkeypatch, url):
    monkeypatch.setenv(toxic.URL_ENV, url)
    with pytest.raises(UsageError, match="is not a URL like"):
        toxic.server()
