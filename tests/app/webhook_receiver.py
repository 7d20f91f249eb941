"""A real HTTP server on 127.0.0.1 in a thread that records webhook requests and answers from a script.

Tests wait on `received(n)` (a condition variable), never on sleeps. A scripted "hang" holds the request until the
receiver is closed, so the sender's timeout is what ends it."""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """`script` answers requests in order (an int status, 'hang', or ('redirect', location)); then `default`."""

    def __init__(
        self, script: list[object] | None = None, default: object = 200, tls: ssl.SSLContext | None = None
    ) -> None:
        self.requests: list[Received] = []
        self._script, self._default = list(script or []), default
        self._cond = threading.Condition()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._cond:
                    answer = receiver._script.pop(0) if receiver._script else receiver._default
                    receiver.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    receiver._cond.notify_all()
                if answer == "hang":
                    receiver._release.wait(60)
                    return
                if isinstance(answer, tuple):
                    self.send_response(302)
                    self.send_header("location", answer[1])
                else:
                    self.send_response(int(answer))  # type: ignore[call-overload]
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def received(self, n: int, timeout: float = 60.0, where: Any = None) -> list[Received]:
        """Block until at least n requests (matching `where`, if given) arrived; AssertionError after timeout."""

        def matching() -> list[Received]:
            return [r for r in self.requests if where is None or where(r)]

        with self._cond:
            if not self._cond.wait_for(lambda: len(matching()) >= n, timeout):
                raise AssertionError(
                    f"expected {n} webhook requests, got {len(matching())}: {[r.body[:200] for r in self.requests]}"
                )
            return matching()
