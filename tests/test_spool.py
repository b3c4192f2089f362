"""The spool of remote shards (pipelines.sources.spool) and the shard cache: the user's files
are never trimmed, a failing source is its RemoteError (never an empty epoch or bad files),
close(), Ctrl-C and a failed build stop every copy, ranks sharing a cache never share a partial
file, and ``~`` is expanded. Servers listen on 127.0.0.1 only."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipelines import AugmentSpec, LoaderConfig, MixSpec, TorchOptions, create_loader
from pipelines.sources.remote import RemoteError
from pipelines.sources.root import list_dataset
from tests.remote_server import FaultyServer, _Handler

BACKENDS = ["dali", "pinned", "pageable"]
N = 37
SHARDS = "shard-{000000..000004}.tar"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Gated(_Handler):
    """``_Handler`` with a 403 on the GETs of ``server.deny`` and a pause halfway through each
    body of ``server.slow`` seconds (HEAD answers stay as they were)."""

    server: Server

    def do_GET(self) -> None:
        s = self.server
        name = self.path.split("?")[0].lstrip("/")
        with s.lock:
            s.log.append((time.monotonic(), name))
        if name in s.deny or "*" in s.deny:
            s.gets[name] += 1
            self.send_error(403, "Forbidden")
            return
        if s.slow:
            path = self._file()
            if path is None:
                super().do_GET()
                return
            s.gets[name] += 1
            with open(path, "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            s.stopping.wait(s.slow)
            self.wfile.write(data[len(data) // 2:])
            return
        super().do_GET()


class Server(FaultyServer):
    def __init__(self, folder: str):
        super().__init__(folder)
        self.RequestHandlerClass = _Gated
        self.deny: set[str] = set()
        self.slow = 0.0
        self.log: list[tuple[float, str]] = []

    def requests_after(self, t: float) -> list[str]:
        with self.lock:
            return [name for at, name in self.log if at > t]


@pytest.fixture
def srv(wds):
    with Server(str(wds)) as s:
        yield s


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A listing cache of this test's own: remote shards are indexed afresh."""
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "listings"))


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=32), seed=2, read_timeout=2.0)
    base.update(kw)
    return LoaderConfig(**base)


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpu-feed-fetch" and t.is_alive()]


def _wait_until(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# -- class 1: the shard cache trims only its own copies -----------------------------------------
def test_trimming_the_shard_cache_never_removes_the_users_files(srv, tmp_path, fresh_cache):
    """A shard cache folder given by the user may hold other files: a ``.tar`` of theirs, one
    named like a cache entry but not written by the cache, any other file. Trimming (here down
    to one byte: as hard as it gets) removes only copies the cache wrote."""
    cache = tmp_path / "cache"
    cache.mkdir()
    theirs = {"mine.tar": b"user tar " * 4000, "notes.txt": b"keep me",
              "0123456789abcdef0123456789abcdef.tar": b"named like an entry " * 100}
    for name, data in theirs.items():
        (cache / name).write_bytes(data)
        os.utime(cache / name, (1, 1))  # the least recently used of all
    root = f"{srv.url}/{SHARDS}"
    with create_loader("pageable", _cfg(root, shard_cache=str(cache), shard_cache_bytes=1,
                                        shuffle_window=8)) as ld:
        for e in (0, 1):
            ld.set_epoch(e)
            assert sum(len(y) for _, y in ld) == N
    for name, data in theirs.items():
        assert (cache / name).read_bytes() == data, name
    # the cache's own copies were trimmed meanwhile: not every shard is still there
    own = [n for n in os.listdir(cache) if n not in theirs and n.endswith(".tar")]
    assert len(own) < 5


# -- class 3: a failing source is its RemoteError ------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("denied", ["*", "shard-000002.tar"])
def test_a_refused_shard_under_skip_is_its_remote_error_not_bad_files(backend, denied, srv,
                                                                      fresh_cache):
    """Under ``on_bad_file="skip"``, a 403 while streaming (the index was cached before) raises
    the ``RemoteError`` naming the shard: with every shard refused no batch is ever yielded
    (before, a silently empty epoch), and the samples the failure kept from the readers (of
    that shard or any other) are never counted as bad files."""
    root = f"{srv.url}/{SHARDS}"
    list_dataset(root)  # indexed: the loader's copies are the first GETs to fail
    srv.deny.add(denied)
    want = r"shard-00000\d" if denied == "*" else "shard-000002"
    with create_loader(backend, _cfg(root, on_bad_file="skip")) as ld:
        with pytest.raises(RemoteError, match=rf"shard '.*{want}\.tar'.*403"):
            for e in (0, 1):
                ld.set_epoch(e)
                for _ in ld:
                    pass
        assert ld.stats.bad_files == 0, ld.stats.bad[:3]


# -- class 5: stop means stop ---------------------------------------------------------------------
def test_close_ends_a_copy_in_flight_and_no_request_follows(srv, fresh_cache):
    """``close()`` while a copy hangs on a stalled server returns within a second or two, the
    fetcher thread ends, and no request reaches the server after it (before, the stop inside
    a copy was taken for a transient failure and retried, and close() waited out its join)."""
    root = f"{srv.url}/{SHARDS}"
    list_dataset(root)
    srv.stall.add("*")
    ld = create_loader("pageable", _cfg(root, num_workers=0, read_timeout=1.0))
    try:
        thread = ld._fetch._thread
        ld._fetch.follow(0, 0)  # the fetcher starts copying as for an epoch
        assert _wait_until(lambda: sum(srv.gets.values()) > 0, 10)
        time.sleep(0.2)
    finally:
        t0 = time.monotonic()
        ld.close()
        took = time.monotonic() - t0
    done = time.monotonic()
    assert took < 2.5, took
    assert _wait_until(lambda: not thread.is_alive(), 1.5)
    time.sleep(2.5)  # longer than a read timeout plus a retry's backoff
    assert srv.requests_after(done) == []


def _lonely(pid: int) -> bool:
    """Whether process ``pid`` is gone (or a zombie nobody reaps)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def _interrupted(wds, tmp_path) -> tuple[int, float]:
    """Run a loop over a ``pipe:`` root in a child Python (no ``with``, no ``close()``) until a
    shard's copy command runs, press Ctrl-C there, wait for it to exit: the command's pid and
    the seconds the exit took."""
    flag, pidfile, tmp = tmp_path / "slow", tmp_path / "pid", tmp_path / "tmp"
    tmp.mkdir()
    urls = [f"pipe:if [ -e {flag} ]; then echo $$ > {pidfile}; exec sleep 30; fi; "
            f"cat {wds}/shard-{k:06d}.tar" for k in range(5)]
    script = textwrap.dedent(f"""
        from pipelines import AugmentSpec, LoaderConfig, create_loader
        from pipelines.sources.root import list_dataset
        urls = {urls!r}
        list_dataset(urls)
        open({str(flag)!r}, "w").close()
        ld = create_loader("pageable", LoaderConfig(root=urls, batch_size=4, device="cpu",
                           num_workers=0, augment=AugmentSpec(size=32)))
        for _ in ld:
            pass
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, TMPDIR=str(tmp),
               GPU_FEED_LISTING_CACHE=str(tmp_path / "listings"))
    p = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=str(tmp_path),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert _wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 60), \
            p.stderr.read().decode() if p.poll() is not None else "no copy started"
        pid = int(pidfile.read_text())
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return pid, took


def _end(pid: int) -> None:
    if not _lonely(pid):
        os.kill(pid, signal.SIGKILL)  # the sleep this test started


def test_ctrl_c_stops_the_fetcher_and_removes_its_spool(wds, tmp_path):
    """Ctrl-C in a loop that is not in a ``with`` block: at exit the fetcher is stopped and
    its private spool removed, as ``close()`` does, at once (before, the exit waited out the
    join of a thread that could no longer run)."""
    pid, took = _interrupted(wds, tmp_path)
    try:
        assert took < 5.0, took
        assert list((tmp_path / "tmp").glob("gpu-feed-spool-*")) == []
    finally:
        _end(pid)


def test_ctrl_c_ends_the_copy_command_of_a_pipe_root(wds, tmp_path):
    """When the process exits after Ctrl-C, the command copying a shard is ended too."""
    pid, _ = _interrupted(wds, tmp_path)
    try:
        assert _wait_until(lambda: _lonely(pid), 2.0), "the copy command outlived the loader"
    finally:
        _end(pid)


@pytest.mark.parametrize("how", ["base", "backend"])
def test_a_failed_create_loader_ends_its_fetcher(how, srv, fresh_cache, monkeypatch):
    """A build that fails after the fetcher started (in the base: a mix of the wrong width;
    in the backend: an impossible CPU binding) ends the fetcher at once, while the caller
    still holds the exception (and so the half-built loader)."""
    root = f"{srv.url}/{SHARDS}"
    list_dataset(root)
    before = set(_fetch_threads())
    if how == "base":
        backend, cfg, opts = "pageable", _cfg(root, mix=MixSpec(mixup_alpha=0.2, num_classes=7)), None
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        monkeypatch.delenv("LOCAL_RANK", raising=False)
        backend, cfg, opts = "pinned", _cfg(root), TorchOptions(cpu_binding="rank")
    with pytest.raises(ValueError) as e:
        create_loader(backend, cfg, opts)
    assert _wait_until(lambda: not set(_fetch_threads()) - before, 2.0), str(e.value)


def test_ranks_sharing_a_cache_never_write_the_same_partial_file(srv, tmp_path, fresh_cache):
    """Two loaders (as two ranks of a host) copy the same shards into one shard cache at the
    same time: each writes its own partial file and renames it, so both succeed and every
    cached shard is whole (before, both wrote ``<name>.part`` and the second rename failed)."""
    root = f"{srv.url}/{SHARDS}"
    list_dataset(root)
    cache = tmp_path / "cache"
    srv.slow = 0.4  # each body pauses halfway: the two copies of a shard overlap
    cfg = _cfg(root, num_workers=0, batch_size=32, shard_cache=str(cache))
    with create_loader("pageable", cfg) as a, create_loader("pageable", cfg) as b:
        a._fetch.follow(0, 0)
        b._fetch.follow(0, 0)
        spooled = lambda: len([n for n in os.listdir(cache) if n.endswith(".tar")]) == 5  # noqa: E731
        assert _wait_until(lambda: spooled() or a._fetch.error or b._fetch.error, 30)
        assert a._fetch.error is None and b._fetch.error is None, (a._fetch.error,
                                                                   b._fetch.error)
        srv.slow = 0.0
        for ld in (a, b):
            assert sum(len(y) for _, y in ld) == N
    assert [n for n in os.listdir(cache) if ".part" in n or n.endswith(".tmp")] == []


# -- class 6: ~ in shard_cache ---------------------------------------------------------------------
def test_a_shard_cache_under_home_is_expanded(srv, tmp_path, fresh_cache, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    cfg = _cfg(f"{srv.url}/{SHARDS}", shard_cache="~/shards")
    assert cfg.shard_cache == str(home / "shards")
    with create_loader("pageable", cfg) as ld:
        assert sum(len(y) for _, y in ld) == N
    assert len([n for n in os.listdir(home / "shards") if n.endswith(".tar")]) == 5
    assert os.listdir(cwd) == []  # no folder named "~" here
