"""Remote shard roots (pipelines.sources.remote, remote_index, spool): http, s3 (moto) and pipe:
on every backend give the batches of the same shards read locally; faults; resume; a bounded
spool. Servers listen on 127.0.0.1 only."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from data_gen.generate import GenConfig, generate
from pipelines import AugmentSpec, LoaderConfig, create_loader
from pipelines.sources.folder import DatasetRootError
from pipelines.sources.remote import RemoteError, redact
from pipelines.sources.root import list_dataset
from pipelines.sources.shards import ShardError
from tests.remote_server import FaultyServer, moto_s3

BACKENDS = ["dali", "pinned", "pageable"]
N, SHARD = 37, 8
SHARDS = "shard-{000000..000004}.tar"


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=1, debug_indices=True,
                augment=AugmentSpec(size=32), seed=2, read_timeout=2.0)
    base.update(kw)
    return LoaderConfig(**base)


@pytest.fixture
def http(wds):
    with FaultyServer(str(wds)) as srv:
        yield srv


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A listing cache of this test's own: remote shards are indexed afresh."""
    monkeypatch.setenv("GPU_FEED_LISTING_CACHE", str(tmp_path / "listings"))


def _epochs(backend, cfg, epochs=(0, 1)):
    out = []
    with create_loader(backend, cfg) as ld:
        for e in epochs:
            ld.set_epoch(e)
            batches = [(ld.last_batch_indices.tolist(), x.clone(), y.clone()) for x, y in ld]
            assert sorted(ld.last_indices.tolist()) == list(range(N))  # exactly once
            out.append(batches)
    return out


def _same(a, b, pixels=True):
    for ea, eb in zip(a, b, strict=True):
        for (ia, xa, ya), (ib, xb, yb) in zip(ea, eb, strict=True):
            assert ia == ib and (ya == yb).all()
            if pixels:
                assert (xa == xb).all()


# -- roots -------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_http_and_pipe_roots_give_the_local_batches(backend, wds, http, fresh_cache):
    local = _epochs(backend, _cfg(f"{wds}/{SHARDS}"))
    pixels = backend != "dali"  # DALI's crops come from its RNG, not the sample index
    _same(local, _epochs(backend, _cfg(f"{http.url}/{SHARDS}")), pixels)
    _same(local, _epochs(backend, _cfg(f"pipe:cat {wds}/{SHARDS}")), pixels)
    urls = [f"{http.url}/shard-{k:06d}.tar" for k in range(5)]
    _same(local, _epochs(backend, _cfg(urls)), pixels)


def test_each_shard_is_indexed_once_and_read_once_an_epoch(wds, http, fresh_cache):
    names = list_dataset(f"{http.url}/{SHARDS}")[0]
    assert len(names) == N and names[0].startswith(f"{http.url}/shard-")
    assert sum(http.gets.values()) == 5
    list_dataset(f"{http.url}/{SHARDS}")  # the cached index: HEAD requests only
    assert sum(http.gets.values()) == 5
    http.reset()
    with create_loader("pinned", _cfg(f"{http.url}/{SHARDS}", num_workers=2)) as ld:
        list(ld)
    size = sum(os.path.getsize(wds / f"shard-{k:06d}.tar") for k in range(5))
    # the header sample reads one shard at build; each epoch copies each shard about once
    assert sum(http.sent.values()) <= 2 * size


def test_a_window_of_all_shards_is_copied_ahead_and_kept_across_epochs(wds, http, fresh_cache):
    """One shuffle window over all 5 shards: the first batch reads nearly all of them, so the
    fetcher copies them all ahead (not two), and the next epoch, which opens them all again at
    once, finds them still spooled: no copy again, no wait at the epoch's start (spool NOTE
    [ahead])."""
    root = f"{http.url}/{SHARDS}"
    list_dataset(root)
    http.reset()
    with create_loader("pageable", _cfg(root, num_workers=1, batch_size=16)) as ld:
        for e in (0, 1, 2):
            ld.set_epoch(e)
            assert sum(len(y) for _, y in ld) == N
    assert sum(http.gets.values()) == 5, dict(http.gets)


def test_an_untested_scheme_and_a_remote_folder_are_refused_by_name():
    for url in ("gs://bucket/train-{0..3}.tar", "ftp://host/a.tar", "hf://datasets/x/a.tar"):
        with pytest.raises(DatasetRootError, match=f"the {url.split(':')[0]}:// scheme is not "
                                                   "supported"):
            LoaderConfig(root=url)
    with pytest.raises(DatasetRootError, match="must name .tar shards"):
        LoaderConfig(root="s3://bucket/train/")


def test_credentials_never_appear_in_names_or_errors(wds, http, fresh_cache):
    port = http.server_address[1]
    url = f"http://user:hunter22@127.0.0.1:{port}/missing.tar?X-Amz-Signature=s3cr3tsig"
    assert redact(url) == f"http://127.0.0.1:{port}/missing.tar"
    with pytest.raises(RemoteError) as e:
        list_dataset(url)
    assert "hunter22" not in str(e.value) and "s3cr3tsig" not in str(e.value)
    assert "missing.tar" in str(e.value)


# -- faults ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_503s_and_dropped_connections_are_retried(backend, wds, http, fresh_cache):
    root = f"{http.url}/{SHARDS}"
    local = _epochs(backend, _cfg(f"{wds}/{SHARDS}"), epochs=(0,))
    list_dataset(root)  # indexed; now the epoch's copies fail at first
    for k in range(5):
        http.fail_503[f"shard-{k:06d}.tar"] = 2
        http.drop[f"shard-{k:06d}.tar"] = 1 if k % 2 else 0
    got = _epochs(backend, _cfg(root), epochs=(0,))
    _same(local, got, pixels=backend != "dali")
    assert sum(http.gets.values()) >= 5 + 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stalled_server_is_a_clear_timeout(backend, wds, http, fresh_cache):
    root = f"{http.url}/{SHARDS}"
    list_dataset(root)
    http.stall.add("*")
    t = time.monotonic()
    cfg = _cfg(root, read_timeout=0.5)
    with pytest.raises(Exception, match=r"shard .*shard-0000\d\d.tar.*failed after \d+ attempts"
                                        r".*read_timeout=0.5 s") as e:
        with create_loader(backend, cfg) as ld:
            list(ld)
    assert "\n" not in str(e.value)
    assert time.monotonic() - t < 60


def test_a_truncated_shard_is_an_error_or_a_counted_skip(wds, tmp_path, fresh_cache):
    d = tmp_path / "s"
    shutil.copytree(wds, d)
    t = d / "shard-000001.tar"
    t.write_bytes(t.read_bytes()[: t.stat().st_size // 2])
    with FaultyServer(str(d)) as srv:
        root = f"{srv.url}/{SHARDS}"
        with pytest.raises(ShardError, match=r"shard-000001.tar.*truncated"):
            list_dataset(root)
        with pytest.warns(RuntimeWarning, match=r"skipped 1 bad shards or samples.*truncated"):
            names = list_dataset(root, skip_bad=True)[0]
        assert 0 < len([n for n in names if "shard-000001" in n]) < SHARD


@pytest.mark.parametrize("backend", ["pageable", "dali"])
def test_a_shard_that_shrinks_after_indexing_fails_or_is_skipped(backend, wds, tmp_path,
                                                               fresh_cache):
    d = tmp_path / "s"
    shutil.copytree(wds, d)
    with FaultyServer(str(d)) as srv:
        root = f"{srv.url}/{SHARDS}"
        list_dataset(root)
        t = d / "shard-000002.tar"
        data = t.read_bytes()
        t.write_bytes(data[:4096])
        os.utime(t, (1, 1))  # the same ETag (this server's is the mtime): the index is kept
        with pytest.raises(Exception, match=r"shard-000002.tar.*"):
            with create_loader(backend, _cfg(root)) as ld:
                list(ld)


# -- resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_mid_epoch_from_a_remote_root(backend, http, fresh_cache):
    root = f"{http.url}/{SHARDS}"
    with create_loader(backend, _cfg(root)) as ld:
        ld.set_epoch(1)
        full = []
        for k, _ in enumerate(ld):
            full.append(ld.last_batch_indices.tolist())
            if k == 3:
                state = ld.state_dict()
    with create_loader(backend, _cfg(root)) as ld:
        ld.load_state_dict(state)
        assert [ld.last_batch_indices.tolist() for _ in ld] == full[4:]


# -- bounded spool ----------------------------------------------------------------------------
def _spool_bytes(folder) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """1000 photos of about 12 KB in 40 shards of 25 (about 12 MB). The bound under test is in
    shards (12 of them), not bytes, so small photos keep the test's shape at a quarter of the
    cost of generating (and decoding) 400-pixel ones (issue 42)."""
    out = tmp_path_factory.mktemp("big")
    generate(GenConfig(out=str(out), num_images=1000, classes=10, seed=1,
                       width_range=(160, 176), workers=2, layout="wds", shard_size=25),
             progress=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True])
def test_the_spool_stays_bounded_on_a_larger_set(cached, big, tmp_path, fresh_cache):
    shard = max(os.path.getsize(big / n) for n in os.listdir(big) if n.endswith(".tar"))
    total = sum(os.path.getsize(big / n) for n in os.listdir(big) if n.endswith(".tar"))
    cache = tmp_path / "cache"
    bound = 12 * shard
    assert total > 2 * (bound + shard)  # a spool that kept every shard would break the bound
    kw = dict(shard_cache=str(cache), shard_cache_bytes=bound) if cached else {}
    with FaultyServer(str(big)) as srv:
        root = f"{srv.url}/shard-{{000000..000039}}.tar"
        list_dataset(root)
        cfg = _cfg(root, batch_size=16, shuffle_window=25, num_workers=2,
                   augment=AugmentSpec(size=16), debug_indices=True, **kw)
        peak, stop = [0], threading.Event()
        with create_loader("pinned", cfg) as ld:
            folder = cache if cached else ld._fetch.data_dir

            def watch():
                while not stop.is_set():
                    peak[0] = max(peak[0], _spool_bytes(folder))
                    time.sleep(0.005)

            w = threading.Thread(target=watch)
            w.start()
            try:
                n = sum(len(y) for _, y in ld)
            finally:
                stop.set()
                w.join()
            tmp = ld._fetch.tmp
        assert n == 1000 and peak[0] > 0
        assert peak[0] <= bound + shard, (peak[0], bound)  # a copy in flight beside the bound
        assert not os.path.exists(tmp)  # the private spool is deleted at close()


# -- s3 (moto) ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3(wds):
    with moto_s3() as (env, fs):
        for k in range(5):
            fs.put_file(str(wds / f"shard-{k:06d}.tar"), f"bucket/wds/shard-{k:06d}.tar")
        yield env


@pytest.mark.parametrize("backend", BACKENDS)
def test_s3_roots_give_the_local_batches(backend, wds, s3, fresh_cache):
    local = _epochs(backend, _cfg(f"{wds}/{SHARDS}"), epochs=(1,))
    got = _epochs(backend, _cfg(f"s3://bucket/wds/{SHARDS}"), epochs=(1,))
    _same(local, got, pixels=backend != "dali")


def test_a_missing_bucket_is_one_clear_error(s3, fresh_cache):
    with pytest.raises(RemoteError) as e:
        list_dataset(f"s3://nobucket/wds/{SHARDS}")
    msg = str(e.value)
    assert "s3://nobucket/wds/shard-000000.tar" in msg and "\n" not in msg
    assert s3["AWS_SECRET_ACCESS_KEY"] not in msg


@pytest.fixture
def s3_auth(s3):
    """The moto server checks signatures (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``, set to 0
    through its ``/moto-api/reset-auth``) for this test: only the IAM user's key, made here,
    is let in. ``(access key id, secret)``."""
    import boto3
    import requests

    ep = s3["AWS_ENDPOINT_URL"]
    iam = boto3.client("iam", endpoint_url=ep, region_name="us-east-1")
    if not any(u["UserName"] == "reader" for u in iam.list_users()["Users"]):
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    requests.post(f"{ep}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    try:
        yield key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        requests.post(f"{ep}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()
        # IAM allows 2 keys a user: the next test on this (module-wide) server makes its own
        iam.delete_access_key(UserName="reader", AccessKeyId=key["AccessKeyId"])


def _texts(e: BaseException) -> str:
    """The text of ``e`` and of every exception chained to it."""
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(f"{type(e).__name__}: {e} {e.args!r}")
        e = e.__cause__ or e.__context__
    return "\n".join(out)


@pytest.mark.parametrize("wrong", ["secret", "token"])
def test_wrong_s3_credentials_are_one_clear_error_without_the_secret(wrong, s3_auth, fresh_cache):
    key_id, secret = s3_auth
    root = f"s3://bucket/wds/{SHARDS}"
    good = {"key": key_id, "secret": secret}
    with create_loader("pageable", _cfg(root, storage_options=good)) as ld:  # auth is on
        assert sum(len(y) for _, y in ld) == N
    with pytest.raises(RemoteError):  # the environment's key is not the IAM user's
        list_dataset(root)
    bad = dict(good, **({"secret": "wrong-secret-zzz"} if wrong == "secret"
                        else {"token": "wrong-session-token-zzz"}))
    with pytest.raises(RemoteError) as e:  # refused access is no bad shard to skip
        create_loader("pageable", _cfg(root, storage_options=bad, on_bad_file="skip"))
    msg = str(e.value)
    assert "s3://bucket/wds/shard-000000.tar" in msg and "credentials" in msg and "\n" not in msg
    chain = _texts(e.value)
    for value in (secret, bad.get("token", ""), "wrong-secret-zzz"):
        assert not value or value not in chain, chain


# -- data_gen --out s3:// ------------------------------------------------------------------------
GEN = ["--format", "wds", "--num-images", "30", "--classes", "3", "--seed", "5", "--width-range",
       "40,64", "--shard-size", "8", "--workers", "1", "--quiet"]


def _data_gen(argv, capsys) -> tuple[int, str, str]:
    from data_gen.__main__ import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _objects(prefix: str) -> dict[str, bytes]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return {p[len(prefix) + 1:]: fs.cat_file(p) for p in fs.find(prefix)}


def test_data_gen_uploads_shards_that_every_backend_reads(s3, tmp_path, fresh_cache, capsys):
    rc, out, err = _data_gen([*GEN, "--out", "s3://bucket/gen/"], capsys)
    assert rc == 0, err
    root = json.loads(out)["root"]
    assert root == "s3://bucket/gen/shard-{000000..000003}.tar"
    local = tmp_path / "local"
    assert _data_gen([*GEN, "--out", str(local)], capsys)[0] == 0
    objects = _objects("bucket/gen")  # the same bytes as a local run, the manifest too
    assert objects == {p.name: p.read_bytes() for p in local.iterdir()}
    labels = {int(r["key"]): r["label"] for r in json.loads(objects["manifest.json"])["samples"]}
    assert len(labels) == 30
    for backend in BACKENDS:
        with create_loader(backend, _cfg(root)) as ld:
            got = {}
            for _, y in ld:
                keys = [int(os.path.basename(n).split(".")[0])
                        for n in (ld.paths[i] for i in ld.last_batch_indices.tolist())]
                got.update(zip(keys, y.tolist()))
            assert sorted(ld.last_indices.tolist()) == list(range(30))  # each sample once
        assert got == labels, backend


def test_data_gen_never_overwrites_a_prefix_silently(s3, fresh_cache, capsys):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3["AWS_ENDPOINT_URL"])
    fs.pipe_file("bucket/mine/shard-000000.tar", b"my own shard")
    fs.pipe_file("bucket/mine/notes.txt", b"my notes")
    rc, out, err = _data_gen([*GEN, "--out", "s3://bucket/mine"], capsys)
    assert rc == 2 and out == ""
    assert err.strip() == ("data_gen: error: --out 's3://bucket/mine' holds 2 objects (e.g. "
                           "'notes.txt'); choose another prefix, delete them, or pass --force to "
                           "replace those of the same names")
    assert _objects("bucket/mine") == {"shard-000000.tar": b"my own shard",
                                       "notes.txt": b"my notes"}
    rc, out, err = _data_gen([*GEN, "--out", "s3://bucket/mine", "--force"], capsys)
    assert rc == 0 and "held 2 objects: 1 replaced (same names), 1 left as they were" in err
    after = _objects("bucket/mine")
    assert after["notes.txt"] == b"my notes" and len(after) == 4 + 1 + 1
    assert after["shard-000000.tar"] != b"my own shard"


@pytest.mark.parametrize("argv, message", [
    (["--out", "https://127.0.0.1:9/up"], "--out 'https://127.0.0.1:9/up': data_gen uploads "
                                          "to s3://bucket/prefix only, not https://"),
    (["--out", "s3://nobucket/up"], "--out 's3://nobucket/up': listing failed: "
                                    "FileNotFoundError: "),
    (["--out", "s3://bucket/up", "--format", "folder"], "a remote --out takes --format wds"),
    (["--out", "s3://bucket/up", "--storage-option", "nokey"], "--storage-option 'nokey': "
                                                               "expected KEY=VALUE"),
    (["--out", "local", "--storage-option", "a=b"], "--storage-option applies only to --out "
                                                    "s3://"),
])
def test_data_gen_upload_refusals_are_one_line(argv, message, s3, capsys):
    argv = [a for a in GEN if a not in ("--shard-size", "8")] + argv
    rc, out, err = _data_gen(argv, capsys)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_data_gen_upload_with_a_wrong_secret_says_so_without_it(s3_auth, capsys):
    key_id, _ = s3_auth
    rc, out, err = _data_gen([*GEN, "--out", "s3://bucket/denied", "--storage-option",
                              f"key={key_id}", "--storage-option", "secret=wrong-secret-zzz"],
                             capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("data_gen: error: --out 's3://bucket/denied': listing failed: "
                          "PermissionError: ") and "check the credentials" in err
    assert "wrong-secret-zzz" not in err and s3_auth[1] not in err


def test_numpy_is_used():  # keep the import honest for ruff
    assert np.int64(1) == 1


def test_the_suite_takes_a_remote_root(http, tmp_path, fresh_cache):
    """``python -m compare --data URL`` runs and records the URL (a ``Path`` mangled it)."""
    from compare.suite import main as suite

    url = f"{http.url}/{SHARDS}"
    assert suite(["--data", url, "--model", "none", "--backends", "pageable", "--steps", "2",
                  "--warmup", "1", "--repeats", "1", "--no-ceiling", "--workers", "1",
                  "--out", str(tmp_path / "run")]) == 0
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["setup"]["data"] == url and r["variants"][0]["repeats"][0]["samples_per_s"] > 0


def test_close_stops_the_fetcher_at_once_when_every_shard_is_spooled(http, fresh_cache):
    """NOTE [ahead]: with every shard spooled and read from an epoch's first batches, the
    fetcher's walk ran on through later epochs without end, ignoring ``close()`` (which then
    waited out its 10 s join) and spinning a core meanwhile."""
    # batches of 32 of 37 samples: both batches of every epoch read from all 5 shards
    ld = create_loader("pageable", _cfg(f"{http.url}/{SHARDS}", num_workers=0, batch_size=32))
    n = sum(1 for _ in ld)  # a whole epoch: every shard is in the spool now
    assert n == len(ld) == 2
    thread = ld._fetch._thread
    time.sleep(0.5)  # the fetcher looks ahead meanwhile
    t0 = time.monotonic()
    ld.close()
    assert time.monotonic() - t0 < 3.0
    assert not thread.is_alive()


# -- issue 55: permanent failures, GET-only URLs, stop, one-line errors ------------------------
def test_a_presigned_get_only_url_is_stamped_from_a_get(wds, http, fresh_cache):
    """HEAD answers 403 (a URL presigned for GET): size and ETag come from a one-byte GET, the
    same as a HEAD's, so the cached index is used the next time without a copy."""
    http.head_refused = True
    root = f"{http.url}/{SHARDS}?X-Amz-Signature=abc"
    names = list_dataset(root)[0]
    assert len(names) == N
    http.reset()
    http.head_refused = True
    assert list_dataset(root)[0] == names
    assert sum(http.sent.values()) <= 5, dict(http.sent)  # one byte a shard: no copy


def test_tls_failures_and_4xx_answers_are_not_retried(wds, http, fresh_cache):
    """An https:// URL to a plain HTTP server fails its TLS handshake: permanent, one try; a
    400 likewise; a 408 is transient, retried."""
    port = http.server_address[1]
    with pytest.raises(RemoteError, match=r"shard-000000.tar.*TLS") as e:
        list_dataset(f"https://127.0.0.1:{port}/shard-000000.tar")
    assert "\n" not in str(e.value) and http.connections == 1
    http.reset()
    http.status["shard-000001.tar"] = [400, 400]
    with pytest.raises(RemoteError, match=r"shard-000001.tar.*HTTP 400"):
        list_dataset(f"{http.url}/shard-000001.tar")
    assert len(http.seen) == 2  # the HEAD, then one GET in its stead: no retry
    http.reset()
    http.status["shard-000002.tar"] = [408, 408]
    assert len(list_dataset(f"{http.url}/shard-000002.tar")[0]) > 0


def test_a_tls_error_raised_by_the_connection_is_not_retried(wds, http, fresh_cache, monkeypatch):
    import ssl

    from pipelines.sources import remote, remote_http

    calls = []

    def broken(url, timeout, **kw):
        calls.append(url)
        raise ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] bad record mac")

    name = remote.register(f"{http.url}/shard-000000.tar", remote.Storage(attempts=4))[0]
    monkeypatch.setattr(remote_http.urllib.request.OpenerDirector, "open",
                        lambda self, req, timeout=None: broken(req.full_url, timeout))
    with pytest.raises(RemoteError, match="TLS failed"):
        remote.download(name, str(wds.parent / "copy.tar"))
    assert len(calls) == 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _download_in_thread(name, dst):
    """``remote.download(name, dst)`` in a thread: ``(stop event, exceptions raised, thread)``."""
    import threading

    from pipelines.sources import remote

    stop = threading.Event()
    out: list[BaseException] = []

    def run():
        try:
            remote.download(name, str(dst), stop=stop)
        except BaseException as e:  # noqa: BLE001 - checked by the caller
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return stop, out, t



@pytest.mark.parametrize("end", ["timeout", "stop"])
def test_a_pipe_command_leaves_no_process_behind(end, tmp_path):
    """A ``pipe:`` command and what it started (here a background ``sleep``) are killed as a
    process group when the copy times out or is stopped."""

    from pipelines.sources import remote

    pids = tmp_path / "pids"
    cmd = f"pipe:sleep 300 & echo $! > {pids}; echo $$ >> {pids}; wait"
    name = remote.register(cmd, remote.Storage(timeout=0.5 if end == "timeout" else 60,
                                               attempts=1))[0]
    stop, out, t = _download_in_thread(name, tmp_path / "copy.tar")
    deadline = time.monotonic() + 10
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    if end == "stop":
        t0 = time.monotonic()
        stop.set()
    t.join(15)
    assert not t.is_alive()
    if end == "stop":
        assert time.monotonic() - t0 < 2 and isinstance(out[0], remote.Stopped)
    else:
        assert isinstance(out[0], RemoteError) and "no output" in str(out[0])
    time.sleep(0.2)
    assert [p for p in map(int, pids.read_text().split()) if _alive(p)] == []
    assert not (tmp_path / "copy.tar").exists()


def test_a_stop_ends_the_retries_and_no_request_follows(wds, http, tmp_path):

    from pipelines.sources import remote

    http.status["shard-000000.tar"] = [503] * 50
    name = remote.register(f"{http.url}/shard-000000.tar",
                           remote.Storage(attempts=50, retry_s=300))[0]
    stop, out, t = _download_in_thread(name, tmp_path / "copy.tar")
    while len(http.seen) < 3 and t.is_alive():  # into the back-off sleeps
        time.sleep(0.01)
    t0 = time.monotonic()
    stop.set()
    t.join(10)
    assert time.monotonic() - t0 < 1.0 and isinstance(out[0], remote.Stopped)
    seen = len(http.seen)
    time.sleep(1.5)  # longer than the back-off at this point
    assert len(http.seen) == seen


@pytest.mark.parametrize("pattern", ["shard-{000..0x9}.tar", "shard-{5..1}.tar",
                                     "shard-{000000..000004.tar", "shard-000000..000004}.tar",
                                     "shard-{0..1}}{.tar"])
def test_a_malformed_brace_range_is_one_error_naming_the_root(pattern, http):
    url = f"http://user:pw-zq81@127.0.0.1:{http.server_address[1]}/{pattern}"
    for call in (lambda: LoaderConfig(root=url), lambda: list_dataset(url)):
        with pytest.raises(DatasetRootError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "brace" in msg and "zq81" not in msg
        assert redact(url).split("/")[-1] in msg


def test_a_redirect_loop_is_one_line_naming_the_shard(http, fresh_cache):
    http.redirect["loop.tar"] = "/loop.tar"
    url = f"http://user:pw-zq81@127.0.0.1:{http.server_address[1]}/loop.tar"
    with pytest.raises(RemoteError) as e:
        list_dataset(url)
    msg = str(e.value)
    assert "\n" not in msg and "redirect loop" in msg and "zq81" not in msg
    assert f"'{redact(url)}'" in msg
    assert len(http.seen) <= 2 * 12  # HEAD and GET, each up to the redirect bound: no retry
