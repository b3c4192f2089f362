"""Secrets in remote roots (pipelines.sources.remote_url, remote_http): credentials go only to
the origin they were given for, and no name, message or chained exception shows them; a
``pipe:`` command is shown redacted. Servers listen on 127.0.0.1 only."""
from __future__ import annotations

import urllib.request

import pytest

from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.sources.folder import DatasetRootError
from pipelines.sources.remote import RemoteError, Storage, redact
from pipelines.sources.root import list_dataset, open_source
from tests.remote_server import FaultyServer

SHARDS = "shard-{000000..000004}.tar"


@pytest.fixture
def http(wds):
    with FaultyServer(str(wds)) as srv:
        yield srv


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "listings"))


def _texts(e: BaseException) -> str:
    """The text of ``e`` and of every exception chained to it (cause and context)."""
    out, todo, seen = [], [e], set()
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        out.append(f"{type(x).__name__}: {x} {x.args!r}")
        todo += [x.__cause__, x.__context__]
    return "\n".join(out)


# -- redirects -----------------------------------------------------------------------------------
def test_credentials_are_not_sent_to_another_origin_on_a_redirect(wds, fresh_cache):
    """Userinfo is sent as Basic auth to the origin it was given for, kept on a redirect within
    that origin, and dropped on a redirect to another port (another origin), as ``requests``
    does."""
    with FaultyServer(str(wds)) as home, FaultyServer(str(wds)) as other:
        port = home.server_address[1]
        home.redirect["shard-000000.tar"] = "/moved/shard-000000.tar"  # same origin
        home.redirect["moved/shard-000000.tar"] = f"{other.url}/shard-000000.tar"
        url = f"http://user:hunter22@127.0.0.1:{port}/shard-000000.tar"
        names = list_dataset(url)[0]
        assert names and all("hunter22" not in n for n in names)
        auth = {path: a for _, path, a in home.seen}
        assert auth["/shard-000000.tar"] and auth["/moved/shard-000000.tar"]
        assert other.seen and all(a is None for _, _, a in other.seen), other.seen


def test_credentials_are_dropped_on_a_downgrade_to_http():
    """https -> http on the same host is another origin: no ``Authorization`` goes with it."""
    from pipelines.sources.remote_http import _Redirects

    req = urllib.request.Request("https://h.example/a.tar", method="HEAD")
    req.add_header("Authorization", "Basic c2VjcmV0")
    new = _Redirects().redirect_request(req, None, 302, "Found", {}, "http://h.example/a.tar")
    assert new is not None and not new.has_header("Authorization")
    assert new.get_method() == "HEAD"
    same = _Redirects().redirect_request(req, None, 302, "Found", {}, "https://h.example/b.tar")
    assert same.has_header("Authorization")


# -- URLs that do not parse ----------------------------------------------------------------------
@pytest.mark.parametrize("url", [
    "http://reader:pa#ss-zq81@127.0.0.1:9/train-{000..003}.tar",
    "http://reader:pa/ss-zq81@127.0.0.1:9/train.tar",
    "http://reader:pa?ss-zq81@127.0.0.1:9/train.tar",
    "http://reader:pa@ss-zq81@127.0.0.1:9/train.tar",
    "http://reader:4417/ss-zq81@127.0.0.1:9/train.tar",  # the password's head read as a port
    "https://reader:pass-zq81@127.0.0.1:99999/train.tar",
    "https://reader:pass-zq81@127.0.0.1:8o/train.tar",
    "https://reader:pass-zq81@[::1/train.tar",
])
def test_a_url_that_does_not_parse_is_one_error_without_the_secret(url):
    for call in (lambda: LoaderConfig(root=url), lambda: list_dataset(url),
                 lambda: LoaderConfig(root=[url, url])):
        with pytest.raises(DatasetRootError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "does not parse" in msg and "train" in msg, msg
        chain = _texts(e.value)
        for part in ("zq81", "pa#ss", "pa/ss", "pa?ss", "pa@ss", "4417"):
            assert part not in chain, chain
    assert "zq81" not in redact(url)


# -- pipe: commands ------------------------------------------------------------------------------
def test_pipe_commands_are_redacted_in_paths_and_errors(wds, fresh_cache):
    root = f"pipe:API_TOKEN=tok-zq81-secret cat {wds}/{SHARDS}"
    cfg = LoaderConfig(root=root, batch_size=4, device="cpu", num_workers=0,
                       augment=AugmentSpec(size=32))
    with create_loader("pageable", cfg) as ld:
        assert ld.paths and all("tok-zq81" not in p for p in ld.paths)
        assert ld.paths[0].startswith("pipe:API_TOKEN=*** cat ")
        assert sum(len(y) for _, y in ld) == len(ld.paths)
    bad = ("pipe:curl -s -u bob:pw-zq81 -H 'Authorization: Bearer tk-zq81' "
           "'https://bob:pw2-zq81@h.example/a.tar?sig=sg-zq81'; "
           "echo 'denied https://bob:pw2-zq81@h.example/a.tar?sig=sg-zq81' >&2; exit 3")
    assert "zq81" not in redact(bad) and "h.example/a.tar" in redact(bad)
    with pytest.raises(RemoteError) as e:
        open_source(bad, storage=Storage(attempts=1))
    assert "exited with status 3" in str(e.value) and "\n" not in str(e.value)
    assert "zq81" not in _texts(e.value), _texts(e.value)


def test_a_query_token_never_reaches_a_message(http, fresh_cache):
    port = http.server_address[1]
    http.status["shard-000000.tar"] = [400, 400]
    url = f"http://127.0.0.1:{port}/shard-000000.tar?X-Amz-Signature=sg-zq81&token=tk-zq81"
    with pytest.raises(RemoteError) as e:
        list_dataset(url)
    assert "shard-000000.tar" in str(e.value)
    assert "zq81" not in _texts(e.value)


@pytest.mark.parametrize("root", [
    "https://user:hunter2@example.com/s-{0..3}.tar?token=hunter2",
    ["pipe:curl -u user:hunter2 https://example.com/a.tar",
     "https://example.com/b.tar?X-Amz-Signature=hunter2"],
])
def test_a_config_and_a_results_file_never_show_the_secret(root):
    """``repr(LoaderConfig)`` (in errors, logs and tracebacks) and the suite's results.json
    record a remote root redacted."""
    from compare.suite import shown as _shown

    cfg = LoaderConfig(root=root, device="cpu")
    assert "hunter2" not in repr(cfg) and "hunter2" not in str(cfg)
    assert "example.com" in repr(cfg)
    assert "hunter2" not in _shown(cfg.root) and "example.com" in _shown(cfg.root)
