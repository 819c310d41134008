"""A loopback HTTP proxy that adds a fixed latency to every request: object storage on a laptop.

This kernel has no netem, so the remote benchmark puts this in front of the S3 server:

    with DelayProxy("127.0.0.1:9000", delay_ms=20) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url      # http://127.0.0.1:<port>
        ...                                             # every request now costs >= 20 ms more
    proxy.requests, proxy.sent_bytes                    # requests that went through, bytes sent back

Each request waits ``delay_ms`` before it is forwarded (so ``n`` requests in flight overlap
their waits, as on a real network), then the upstream response is relayed whole. Requests
are served by one thread each, over keep-alive connections (one upstream connection per
thread). Loopback only; for benchmarks and tests, not production.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        body = self._body()
        time.sleep(self.server.delay_s)
        with self.server.lock:
            self.server.requests += 1
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP | {"content-length", "expect"}}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in (0, 1):  # a kept-alive upstream connection may have been closed: retry once
            conn = self.server.upstream()
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                self.server.drop_upstream()
                if attempt:
                    self.send_error(502)
                    return
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                self.send_header(k, v)
        # a HEAD answer's length is the object's, not its (empty) body's
        length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
            with self.server.lock:
                self.server.sent_bytes += len(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, delay_ms: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream_host, port = upstream.rsplit(":", 1)
        self.upstream_port = int(port)
        self.delay_s = delay_ms / 1000.0
        self.requests = 0
        self.sent_bytes = 0  # response bodies relayed to the client
        self.lock = threading.Lock()
        self._local = threading.local()

    def upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        return conn

    def drop_upstream(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None


class DelayProxy:
    """``DelayProxy("127.0.0.1:PORT", delay_ms)``: start with ``start()`` or ``with``; ``url`` is its endpoint."""

    def __init__(self, upstream: str, delay_ms: float = 0.0) -> None:
        upstream = upstream.split("://", 1)[-1].rstrip("/")
        self._server = _Server(upstream, delay_ms)
        self._thread = threading.Thread(target=self._server.serve_forever, name="delay-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def requests(self) -> int:
        return self._server.requests

    @property
    def sent_bytes(self) -> int:
        """Bytes of response bodies relayed so far (what the client downloaded)."""
        return self._server.sent_bytes

    @property
    def delay_ms(self) -> float:
        return self._server.delay_s * 1000.0

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        self._server.delay_s = value / 1000.0

    def start(self) -> "DelayProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """``python -m lmdata.bench.delay_proxy HOST:PORT DELAY_MS``: serve until killed, print the URL first."""
    import sys

    proxy = DelayProxy(sys.argv[1], float(sys.argv[2])).start()
    print(proxy.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
