"""A small client of Toxiproxy's HTTP API, with a timeout on every call.

The `toxic` kind used toxiproxy-python, which sets no timeout on its requests:
with the server stopped after its port was checked, creating a proxy blocked the
harness, its clean-up included. It also turned every refusal into "cannot create
proxy" and built its URLs without the brackets an IPv6 host needs. This client
speaks the few calls the kind makes (create and delete a proxy, add, list and
delete a toxic) and turns the server's answers into one line that says what it
refused and why.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from torchchaos.errors import ChaosError

TIMEOUT = 5.0  # seconds for one call: the server answers in milliseconds when it is up


class ToxiproxyError(ChaosError):
    """The Toxiproxy server is unreachable, did not answer in time, or refused a request."""


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    timeout: float = TIMEOUT

    @property
    def where(self) -> str:
        return host_port(self.host, self.port)

    def version(self) -> None:
        """Ask the server its version: that it is Toxiproxy and answers, not only listens."""
        self._call("GET", "/version", None, doing="say its version", json_answer=False)

    def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                        "enabled": True}, doing=f"create proxy {name}")

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}", None, doing=f"delete proxy {name}")

    def add_toxic(self, proxy: str, toxic: dict[str, Any]) -> None:
        self._call("POST", f"/proxies/{proxy}/toxics", toxic,
                   doing=f"add toxic {toxic['name']} to {proxy}")

    def toxics(self, proxy: str) -> list[str]:
        """The names of the toxics the server has on `proxy` (what is in force)."""
        listed = self._call("GET", f"/proxies/{proxy}/toxics", None,
                            doing=f"list the toxics of {proxy}")
        return [t.get("name", "") for t in listed or []]

    def delete_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}", None,
                   doing=f"delete toxic {name}")

    def _call(self, method: str, path: str, body: dict[str, Any] | None, doing: str,
              json_answer: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{self.where}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                text = answer.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(f"Toxiproxy at {self.where} refused to {doing}: "
                                 f"{_refusal(exc)}") from None
        except OSError as exc:  # URLError wraps what the socket raised (its `reason`)
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise ToxiproxyError(f"Toxiproxy at {self.where} did not answer within"
                                     f" {self.timeout:g} s ({doing})") from None
            why = getattr(reason, "strerror", None) or str(reason)
            raise ToxiproxyError(f"no Toxiproxy server at {self.where} ({why}) to"
                                 f" {doing}") from None
        if not json_answer or not text.strip():
            return text
        try:
            return json.loads(text)
        except ValueError:
            raise ToxiproxyError(f"{self.where} answered to {doing} with no JSON: is it a"
                                 f" Toxiproxy server? ({text[:80]!r})") from None


def _refusal(exc: urllib.error.HTTPError) -> str:
    """The server's own reason (its JSON `error`), with the status and what it means."""
    try:
        said = json.loads(exc.read().decode(errors="replace")).get("error", "")
    except (ValueError, AttributeError, OSError):
        said = ""
    said = said or exc.reason or ""
    if "address already in use" in said:
        return f"it cannot listen on the proxy's port ({said}; HTTP {exc.code})"
    if exc.code == 409:
        return f"it already has one of that name ({said}; HTTP 409)"
    return f"{said} (HTTP {exc.code})"
