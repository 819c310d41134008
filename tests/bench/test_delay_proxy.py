"""The delay proxy relays S3 requests (GET, PUT, ranged GET, HEAD, errors) to the server and counts them."""

from __future__ import annotations

from lmdata.bench.delay_proxy import DelayProxy
from lmdata.io.location import location


def test_proxy_relays_s3_requests(s3, monkeypatch):
    with DelayProxy(s3.server.endpoint, delay_ms=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        obj = location(s3.uri("p", "obj.bin"))
        obj.write_bytes(bytes(range(256)) * 40)
        assert obj.read_bytes() == bytes(range(256)) * 40
        assert obj.open_input().read_at(3, 256) == bytes([0, 1, 2])
        assert obj.size() == 10240 and not location(s3.uri("p", "missing")).exists()
        assert proxy.requests >= 5 and proxy.sent_bytes >= 10240 + 3
