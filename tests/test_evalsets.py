"""The hub probe (hub.hub_reachable) against real local HTTP servers: it asks the endpoint and proxies that
huggingface_hub itself uses, and fails fast when nothing answers."""
import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------- the hub probe

class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with 200, a proxy's CONNECT with 502; records each request line."""
    seen = []

    def do_HEAD(self):
        Recorder.seen.append(self.requestline)
        self.send_response(200)
        self.end_headers()

    do_GET = do_HEAD

    def do_CONNECT(self):
        Recorder.seen.append(self.requestline)
        self.send_response(502)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Recorder.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


PROBE = ("import json, time, hub; t = time.time(); ok = hub.hub_reachable(); "
         "print(json.dumps([ok, time.time() - t]))")


def probe(**env):
    base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("HF_")}
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=dict(base, **env), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_probe_asks_the_endpoint_huggingface_hub_uses(server):
    ok, _ = probe(HF_ENDPOINT=f"http://127.0.0.1:{server}")
    assert ok and any(line.startswith("HEAD / ") for line in Recorder.seen)
    Recorder.seen.clear()
    ok, _ = probe(HF_ENDPOINT=f"http://127.0.0.1:{server}", HF_HUB_OFFLINE="1")
    assert not ok and Recorder.seen == []  # offline: not even asked


def test_probe_fails_fast_when_the_endpoint_does_not_answer():
    ok, took = probe(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")  # connection refused
    assert not ok and took < 2
    silent = socket.socket()  # accepts connections (the kernel does), never answers a request
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        ok, took = probe(HF_ENDPOINT=f"http://127.0.0.1:{silent.getsockname()[1]}")
    finally:
        silent.close()
    assert not ok and took < 2.5  # the 1.5 s timeout, not ~20 s of retries


def test_probe_goes_through_the_proxy(server):
    """A mirror reachable only through a proxy: ALL_PROXY makes it reachable (the proxy sees the request);
    HTTPS_PROXY is where an https endpoint's CONNECT goes."""
    closed = free_port()
    assert not probe(HF_ENDPOINT=f"http://127.0.0.2:{closed}")[0]
    ok, _ = probe(HF_ENDPOINT=f"http://127.0.0.2:{closed}", ALL_PROXY=f"http://127.0.0.1:{server}")
    assert ok and any(f"http://127.0.0.2:{closed}/" in line for line in Recorder.seen)
    ok, _ = probe(HF_ENDPOINT=f"https://127.0.0.2:{closed}", HTTPS_PROXY=f"http://127.0.0.1:{server}")
    assert not ok and any(line.startswith(f"CONNECT 127.0.0.2:{closed}") for line in Recorder.seen)
