"""A fault-injecting HTTP proxy for reliability tests: flaky S3 on 127.0.0.1.

``FaultProxy(upstream)`` listens on an ephemeral loopback port and forwards every request
to ``upstream`` (the moto S3 server). With probability ``rate`` per request (seeded, so a
failing run can be replayed) it injects one fault instead:

* ``500``       HTTP 500 InternalError (S3 XML body), request not forwarded
* ``503``       HTTP 503 SlowDown (S3 XML body), request not forwarded
* ``reset``     TCP reset (SO_LINGER 0), before forwarding or after (a *lost response*:
                the upstream applied the request, the client never hears)
* ``stall``     sleep ``stall_s`` (longer than the client timeout), then close
* ``truncate``  forward, then send a Content-Length larger than the bytes sent and close

``outage = "reset"`` (or True) resets every connection, ``outage = "stall"`` answers
nothing until the client times out: a permanent outage. ``counts`` tells how many
of each fault were injected, ``requests`` how many requests arrived, ``get_bytes()`` how many
body bytes successful GETs returned (what a client read from the object store) and
``max_in_flight`` the most requests forwarded at once. The server thread is
a daemon and shuts itself down after ``max_lifetime_s`` so a forgotten proxy cannot keep a
test run alive. Only for tests: it buffers whole bodies in memory.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("500", "503", "reset", "stall", "truncate")

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}

_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{msg}</Message>'
    "<RequestId>faultproxy</RequestId></Error>"
)


@dataclass
class FaultConfig:
    """What to inject and how often. ``faults`` are drawn uniformly when a fault fires."""

    rate: float = 0.1
    seed: int = 0
    faults: tuple[str, ...] = FAULTS
    stall_s: float = 3.0
    #: Share of ``reset``/``stall`` faults applied after the upstream handled the request.
    after_share: float = 0.5
    #: Only inject on requests whose method is in this set (None: every method).
    methods: frozenset[str] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], got {self.rate}")


@dataclass
class _State:
    config: FaultConfig
    upstream: tuple[str, int]
    rng: random.Random
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter = field(default_factory=Counter)
    requests: int = 0
    outage: str | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    #: response body bytes of successful GETs, by request path (query string dropped)
    get_bytes: Counter = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0

    def draw(self, method: str) -> tuple[str | None, bool]:
        """(fault or None, after-forwarding?) for one request."""
        with self.lock:
            self.requests += 1
            if self.outage:
                self.counts["outage"] += 1
                return "outage-" + self.outage, False
            cfg = self.config
            if cfg.methods is not None and method not in cfg.methods:
                return None, False
            if cfg.rate <= 0 or self.rng.random() >= cfg.rate:
                return None, False
            fault = self.rng.choice(cfg.faults)
            after = self.rng.random() < cfg.after_share
            if fault == "truncate" and method == "HEAD":
                fault = "reset"  # a HEAD has no body to cut short
            if fault == "truncate":
                after = True
            elif fault in ("500", "503"):
                after = False
            self.counts[fault + ("-after" if after and fault in ("reset", "stall") else "")] += 1
            return fault, after


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reset(self) -> None:
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    def _stall(self) -> None:
        self.server.state.stopping.wait(self.server.state.config.stall_s)
        self._reset()

    def _error(self, status: int, code: str, msg: str) -> None:
        body = _XML.format(code=code, msg=msg).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        host, port = self.server.state.upstream
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() in _HOP_HEADERS or name.lower() == "content-length":
                    continue
                conn.putheader(name, value)
            if body or self.command in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_HEADERS]
            return resp.status, resp.reason, headers, data
        finally:
            conn.close()

    def _handle(self) -> None:
        state = self.server.state
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        fault, after = state.draw(self.command)
        if fault == "outage-reset" or (fault == "reset" and not after):
            return self._reset()
        if fault == "outage-stall" or (fault == "stall" and not after):
            return self._stall()
        if fault == "500":
            return self._error(500, "InternalError", "injected by faultproxy")
        if fault == "503":
            return self._error(503, "SlowDown", "Please reduce your request rate (faultproxy).")
        with state.lock:
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            status, reason, headers, data = self._forward(body)
        except OSError:
            return self._error(502, "BadGateway", "upstream unreachable")
        finally:
            with state.lock:
                state.in_flight -= 1
        if self.command == "GET" and 200 <= status < 300 and fault is None:
            with state.lock:
                state.get_bytes[self.path.split("?", 1)[0]] += len(data)
        if fault == "reset":
            return self._reset()
        if fault == "stall":
            return self._stall()
        is_head = self.command == "HEAD"
        if fault == "truncate" and len(data) < 2:
            return self._reset()  # nothing to cut short: lose the response instead
        self.send_response(status, reason)
        for name, value in headers:
            if name.lower() == "content-length" and not is_head:
                continue
            self.send_header(name, value)
        if not is_head:
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if is_head:
            return
        if fault == "truncate":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self._reset()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: _State


class FaultProxy:
    """Start with ``FaultProxy(upstream_url, FaultConfig(...))``; use ``.endpoint``."""

    def __init__(self, upstream: str, config: FaultConfig | None = None, *,
                 max_lifetime_s: float = 900.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://HOST:PORT, got {upstream!r}")
        cfg = config or FaultConfig()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State(cfg, (parts.hostname, parts.port or 80), random.Random(cfg.seed))
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="faultproxy", daemon=True)
        self._thread.start()
        self._timer = threading.Timer(max_lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        self._stopped = False

    # -- controls --------------------------------------------------------------------------
    @property
    def config(self) -> FaultConfig:
        return self._server.state.config

    def configure(self, **changes: object) -> None:
        """Change fault settings on the fly (e.g. ``rate=0`` to heal, ``rate=0.1``)."""
        state = self._server.state
        with state.lock:
            cfg = FaultConfig(**{**state.config.__dict__, **changes})
            state.config = cfg
            if "seed" in changes:
                state.rng = random.Random(cfg.seed)

    @property
    def outage(self) -> str | None:
        """None (healthy), "reset" or "stall": how every request fails during an outage."""
        return self._server.state.outage

    @outage.setter
    def outage(self, value: bool | str | None) -> None:
        mode = "reset" if value is True else (value or None)
        if mode not in (None, "reset", "stall"):
            raise ValueError(f"outage must be False, True, 'reset' or 'stall', got {value!r}")
        with self._server.state.lock:
            self._server.state.outage = mode

    @property
    def counts(self) -> dict[str, int]:
        with self._server.state.lock:
            return dict(self._server.state.counts)

    @property
    def injected(self) -> int:
        """Faults injected so far (outage refusals included)."""
        return sum(self.counts.values())

    @property
    def requests(self) -> int:
        return self._server.state.requests

    def get_bytes(self, contains: str = "") -> int:
        """Body bytes of successful GET responses sent so far, for paths containing ``contains``."""
        with self._server.state.lock:
            return sum(n for p, n in self._server.state.get_bytes.items() if contains in p)

    @property
    def max_in_flight(self) -> int:
        """Most requests forwarded upstream at the same time so far."""
        return self._server.state.max_in_flight

    def options(self, base: dict) -> dict:
        """``open_store`` options of ``base`` (an S3Server's) pointed at this proxy."""
        return {**base, "endpoint": self.endpoint}

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._timer.cancel()
        self._server.state.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["FAULTS", "FaultConfig", "FaultProxy"]
