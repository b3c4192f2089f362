"""A small HTTP server on 127.0.0.1 for tests/test_remote.py: files of a folder, HEAD and
``Range`` requests, and faults on demand (503 answers, dropped connections, stalls, any status,
HEAD refused, redirects to any URL, itself included). Each request is recorded with its
``Authorization`` header; an ``https://`` URL to it gets plain HTTP back: a TLS failure."""
from __future__ import annotations

import collections
import contextlib
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Handler(BaseHTTPRequestHandler):
    server: FaultyServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def _record(self) -> bool:
        """Record the request; answer it here (True) when a fault is set for it."""
        s = self.server
        name = self.path.split("?")[0].lstrip("/")
        with s.lock:
            s.seen.append((self.command, self.path, self.headers.get("Authorization")))
            code = s.status.get(name, [None]).pop(0) if s.status.get(name) else None
        if name in s.redirect:
            self.send_response(302)
            self.send_header("Location", s.redirect[name])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        if code is not None or (self.command == "HEAD" and s.head_refused):
            self.send_error(code or 403)
            return True
        return False

    def _file(self):
        path = os.path.join(self.server.folder, self.path.split("?")[0].lstrip("/"))
        return path if os.path.isfile(path) else None

    def do_HEAD(self) -> None:
        if self._record():
            return
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.send_header("ETag", f'"{os.path.getmtime(path)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        s = self.server
        name = self.path.split("?")[0].lstrip("/")
        s.gets[name] += 1
        if self._record():
            return
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        with s.lock:
            fail = s.fail_503.get(name, 0)
            if fail:
                s.fail_503[name] = fail - 1
            drop = s.drop.get(name, 0)
            if drop:
                s.drop[name] = drop - 1
        if fail:
            self.send_error(503, "try later")
            return
        with open(path, "rb") as f:
            data = f.read()
        lo, hi = 0, len(data) - 1
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, last = rng[6:].split("-")
            lo, hi = int(first), min(hi, int(last)) if last else hi
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("ETag", f'"{os.path.getmtime(path)}"')
        body = data[lo:hi + 1]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if name in s.stall or "*" in s.stall:
            s.stopping.wait(8)  # longer than the tests' read_timeout, bounded
            return
        if drop:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)
        s.sent[name] += len(body)


class FaultyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, folder: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.folder = folder
        self.lock = threading.Lock()
        self.fail_503: dict[str, int] = {}
        self.drop: dict[str, int] = {}
        self.stall: set[str] = set()
        self.status: dict[str, list[int]] = {}  # name -> the codes its next requests get
        self.redirect: dict[str, str] = {}  # name -> the Location of a 302
        self.head_refused = False  # HEAD answers 403 (a presigned, GET-only URL)
        self.seen: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.connections = 0
        self.gets: collections.Counter = collections.Counter()
        self.sent: collections.Counter = collections.Counter()
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def process_request(self, request, client_address) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
        self._thread.join(5)

    def reset(self) -> None:
        with self.lock:
            self.fail_503.clear()
            self.drop.clear()
            self.stall.clear()
            self.status.clear()
            self.redirect.clear()
            self.head_refused = False
            self.seen.clear()
            self.connections = 0
            self.gets.clear()
            self.sent.clear()
        time.sleep(0)



@contextlib.contextmanager
def moto_s3():
    """A moto S3 server on 127.0.0.1 with an empty ``bucket``, the AWS environment pointing at
    it while the block runs; yields ``(env, fs)``. Moto keeps its state per process, not per
    server, so it is reset first: two modules in one xdist worker never see each other's
    objects."""
    import urllib.request

    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed "
                                                            "(pip install '.[dev]')")
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed (pip install '.[remote]')")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    srv.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing-secret-value", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        urllib.request.urlopen(urllib.request.Request(
            f"{env['AWS_ENDPOINT_URL']}/moto-api/reset", method="POST"), timeout=10).close()
        fs = s3fs.S3FileSystem(endpoint_url=env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
        fs.mkdir("bucket")
        yield env, fs
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.stop()
