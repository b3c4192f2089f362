"""Remote shard roots: which URLs are accepted, and how a whole shard is copied to a local file.

A shard set may live behind ``http://`` / ``https://`` (``urllib``: a socket read timeout and
``Range`` requests), ``s3://`` (``s3fs``, the ``remote`` extra: endpoint and credentials from
the usual AWS environment, ``AWS_ENDPOINT_URL`` included, or ``LoaderConfig.storage_options``)
or ``pipe:COMMAND`` (the command's standard output, as WebDataset's ``pipe:``). A root is one
such URL with brace ranges (``https://host/train-{000000..000127}.tar``) or a list of URLs.
A scheme that fsspec knows but this project has not tested (``gs://``, ``ftp://``, ...) is
refused by name (``check_root``).

NOTE [no secret in a message]
URLs may carry credentials (``https://user:pass@host``, a presigned S3 query string). Every
name the rest of the package sees is ``redact(url)``: no userinfo, no query, no fragment; the
real URL stays in this module's registry (``register``), keyed by that name, and in the
fetcher. Error texts from the storage libraries are passed through ``scrub``, which blanks the
values of ``storage_options`` and the AWS secret variables.

NOTE [faults]
A transient failure (a refused or reset connection, a 5xx or 429 answer, a read that times
out, a body shorter than its ``Content-Length``) is retried ``Storage.attempts`` times in all
with exponential backoff, within ``Storage.retry_s`` seconds; an interrupted HTTP or S3 copy
resumes at the byte it reached. After that, or at once for a permanent failure (404, 403,
wrong credentials, a bad session token, any other refusal: ``Refused``), one ``RemoteError``
names the shard (redacted) and the last cause, never as a bad shard that
``on_bad_file="skip"`` would drop. A stalled server is a read timeout (``Storage.timeout``,
``LoaderConfig.read_timeout``), never a hang.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines.sources.folder import DatasetRootError

SCHEMES = ("http", "https", "s3")  # tested; with pipe: and local paths
_BRACE = re.compile(r"\{([^{}]*)\}")
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):/(/?)")
CHUNK = 1 << 20
S3_PART = 8 << 20  # one ranged GET of an S3 copy
EXTRA = "pip install 'gpu-feed[remote]'"


class RemoteError(DatasetRootError):
    """A remote shard that cannot be listed or copied (NOTE [faults])."""


class Transient(OSError):
    """A failure worth another attempt (NOTE [faults])."""


class Refused(OSError):
    """A failure that another attempt would not mend: the server refused the request (a bad
    session token's 400, an unknown key, a denied action) (NOTE [faults])."""


@dataclass(frozen=True)
class Storage:
    """How remote shards are reached (from ``LoaderConfig``).

    Attributes:
        options: keyword arguments of ``s3fs.S3FileSystem`` (``storage_options``).
        timeout: seconds a connection or a read may wait before it counts as failed.
        attempts: tries per request, the first included.
        retry_s: seconds all the tries of one request may take.
        cache: ``LoaderConfig.shard_cache``, the folder that keeps shards across epochs.
    """

    options: dict = field(default_factory=dict, repr=False)  # may hold secrets
    timeout: float = 60.0
    attempts: int = 5
    retry_s: float = 300.0
    cache: str | None = None


# -- which roots are remote ----------------------------------------------------------------------
def scheme_of(s: str) -> str | None:
    """``"http"``, ``"s3"``, ``"pipe"``, ... for a URL; ``None`` for a local path (a path that
    exists locally is local, whatever it looks like)."""
    if s.lower().startswith("pipe:"):
        scheme = "pipe"
    else:
        m = _URL.match(s)
        if m is None:
            return None
        scheme = m.group(1).lower()
    return None if os.path.exists(s) else scheme


def _entries(root) -> list[str] | None:
    if isinstance(root, (list, tuple)):
        return [os.fspath(r) if isinstance(r, os.PathLike) else r for r in root]
    return None


def is_remote(root) -> bool:
    """Whether ``root`` (a str, a path, or a list of them) names any URL or ``pipe:``."""
    entries = _entries(root)
    if entries is not None:
        return any(isinstance(e, str) and scheme_of(e) is not None for e in entries)
    return isinstance(root, str) and scheme_of(root) is not None


def check_root(root) -> None:
    """Refuse, by name, a URL whose scheme is not tested here, and a URL that is not a shard
    set (``DatasetRootError``)."""
    entries = _entries(root)
    for s in entries if entries is not None else [root]:
        if not isinstance(s, str):
            raise TypeError(f"root={root!r}: each entry must be a str URL or path, not "
                            f"{type(s).__name__}")
        scheme = scheme_of(s)
        if scheme is None:
            continue
        if scheme not in (*SCHEMES, "pipe"):
            raise DatasetRootError(
                f"root={redact(s)!r}: the {scheme}:// scheme is not supported (supported: "
                "http://, https://, s3://, pipe:COMMAND and local paths); copy or mount the data")
        if scheme != "pipe" and not urllib.parse.urlsplit(s).path.lower().endswith(".tar"):
            raise DatasetRootError(
                f"root={redact(s)!r}: a remote root must name .tar shards (a brace range "
                "such as train-{000000..000127}.tar, or a list of URLs); remote folders and "
                "globs are not listed")


def redact(url: str) -> str:
    """``url`` without userinfo, query or fragment (NOTE [no secret in a message])."""
    if url.lower().startswith("pipe:"):
        return url
    p = urllib.parse.urlsplit(url)
    host = p.hostname or ""
    if p.port is not None:
        host = f"{host}:{p.port}"
    return urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))


def scrub(text: str, storage: Storage | None = None) -> str:
    """``text`` with secret values blanked (NOTE [no secret in a message])."""
    secrets = [os.environ.get(k, "") for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    if storage is not None:
        secrets += [str(v) for k, v in storage.options.items()
                    if k in ("secret", "token", "key", "password")]
    for v in secrets:
        if len(v) >= 4:
            text = text.replace(v, "***")
    return re.sub(r"(X-Amz-[A-Za-z]+=)[^&\s'\"]+", r"\1***", text)


def braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` and ``{000..031}`` (zero padding kept) as WebDataset's URLs do."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body, out = m.group(1), []
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi = r.groups()
        width = len(lo) if lo.startswith("0") else 0
        items = [str(k).zfill(width) for k in range(int(lo), int(hi) + 1)]
    else:
        items = body.split(",")
    for item in items:
        out += braces(pattern[:m.start()] + item + pattern[m.end():])
    return out


def expand(root) -> list[str]:
    """The real URLs (or local paths) of ``root``: brace ranges expanded, lists in order."""
    entries = _entries(root)
    out: list[str] = []
    for s in entries if entries is not None else [root]:
        out += braces(s)  # pipe:COMMAND too, as WebDataset
    return out


# display name -> (real URL, Storage): NOTE [no secret in a message]
_REGISTRY: dict[str, tuple[str, Storage]] = {}


def register(root, storage: Storage) -> list[str]:
    """The shard names of ``root`` (redacted URLs), remembered with their real URLs."""
    check_root(root)
    names = []
    for url in expand(root):
        name = redact(url) if scheme_of(url) else url
        if scheme_of(url):
            _REGISTRY[name] = (url, storage)
        names.append(name)
    if len(set(names)) != len(names):
        raise DatasetRootError(f"root: a shard is named twice ({len(names)} URLs, "
                               f"{len(set(names))} distinct once credentials are removed)")
    return names


def names(root) -> list[str]:
    """``register``'s names of ``root``, registered with a default ``Storage`` when ``root`` was
    not registered before; a local entry of a list must be an existing file."""
    out = []
    for url in expand(root):
        if scheme_of(url):
            name = redact(url)
            if name not in _REGISTRY:
                check_root(url)
                _REGISTRY[name] = (url, Storage())
            out.append(name)
        elif not os.path.isfile(url):
            raise DatasetRootError(f"root: shard {url!r} does not exist")
        else:
            out.append(url)
    if not out:
        raise DatasetRootError("root=[]: an empty list of shards")
    return out


def shown(root) -> str:
    """``root`` as messages show it: redacted, a list by its first entry and count."""
    entries = _entries(root)
    if entries is None:
        s = os.fspath(root)
        return redact(s) if scheme_of(s) else s
    head = redact(entries[0]) if entries and scheme_of(entries[0]) else (entries[:1] or [""])[0]
    return f"[{head}, ...: {len(entries)} shards]" if len(entries) > 1 else f"[{head}]"


# remote_index.cached_index, set when that module is imported (pipelines.sources.root imports
# it): it imports shards, which imports this module, so this module does not import it
INDEXER: Callable[[str], Any] | None = None


def index(name: str):
    """The ``ShardIndex`` of remote shard ``name`` (``remote_index.cached_index``)."""
    if INDEXER is None:
        raise RuntimeError("pipelines.sources.remote_index is not imported; open remote roots "
                           "through pipelines.sources.root")
    return INDEXER(name)


def real(name: str) -> tuple[str, Storage]:
    """The real URL and ``Storage`` of a shard name from ``register``."""
    return _REGISTRY.get(name, (name, Storage()))


# -- the transports ------------------------------------------------------------------------------
def _s3(storage: Storage):
    try:
        import s3fs
    except ImportError:
        raise ImportError(f"s3:// roots need s3fs and fsspec: {EXTRA}") from None
    opts = dict(storage.options)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "endpoint_url" not in opts and "endpoint_url" not in opts.get("client_kwargs", {}):
        opts["endpoint_url"] = endpoint
    cfg = dict(opts.pop("config_kwargs", {}))
    cfg.setdefault("connect_timeout", storage.timeout)
    cfg.setdefault("read_timeout", storage.timeout)
    cfg.setdefault("retries", {"max_attempts": 1})  # NOTE [faults]: retried here, bounded
    return s3fs.S3FileSystem(config_kwargs=cfg, skip_instance_cache=True, **opts)


def _s3_call(fn: Callable[[], Any]):
    """``fn()`` with botocore's and s3fs's errors sorted into transient and permanent ones."""
    try:
        return fn()
    except (PermissionError, FileNotFoundError):
        raise
    except Exception as e:  # noqa: BLE001 - botocore's and aiohttp's many kinds
        name = type(e).__name__
        text = str(e)
        if any(t in name + text for t in ("Timeout", "timeout", "Connection", "Throttl", "SlowDown",
                                          "InternalError", "ServiceUnavailable", "503", "500",
                                          "IncompleteRead", "ResponseStreamingError")):
            raise Transient(f"{name}: {text}") from None
        if isinstance(e, (OSError, ValueError)) or name == "ClientError":
            # s3fs turns botocore's 400 answers (a bad session token: InvalidToken; on a HEAD,
            # only "Bad Request") into OSError(EINVAL): no shard is to blame
            raise Refused(f"{name}: {text}") from None
        raise


def _http_open(url: str, storage: Storage, lo: int = 0, method: str = "GET"):
    req = urllib.request.Request(url, method=method)
    p = urllib.parse.urlsplit(url)
    if p.username:  # userinfo in the URL: basic auth, never shown
        import base64

        token = base64.b64encode(
            f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}".encode())
        req.add_header("Authorization", f"Basic {token.decode()}")
        url = redact(url) + (f"?{p.query}" if p.query else "")
        req.full_url = url
    if lo:
        req.add_header("Range", f"bytes={lo}-")
    try:
        return urllib.request.urlopen(req, timeout=storage.timeout)  # noqa: S310 - http(s) only
    except urllib.error.HTTPError as e:
        if e.code >= 500 or e.code == 429:
            raise Transient(f"HTTP {e.code} {e.reason}") from None
        raise PermissionError(f"HTTP {e.code} {e.reason}") if e.code in (401, 403) else \
            FileNotFoundError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise Transient(f"{type(e.reason).__name__}: {e.reason}") from None
    except (TimeoutError, ConnectionError) as e:
        raise Transient(f"{type(e).__name__}: {e}") from None


def _retrying(what: str, storage: Storage, step: Callable[[], Any],
              stop: threading.Event | None = None):
    """``step()`` until it returns, retrying ``Transient`` failures (NOTE [faults]); once
    ``stop`` is set, no attempt starts and a wait for the next ends at once (``RemoteError``)."""
    start = time.monotonic()
    for attempt in range(1, storage.attempts + 1):
        if stop is not None and stop.is_set():
            raise RemoteError(f"{what}: stopped")
        try:
            return step()
        except (Transient, TimeoutError, ConnectionError) as e:
            cause = f"{type(e).__name__}: {e}" if not isinstance(e, Transient) else str(e)
            if "timed out" in cause.lower() or isinstance(e, TimeoutError):
                cause += f" (no data for read_timeout={storage.timeout:g} s)"
            wait = min(0.2 * 2 ** (attempt - 1), 10.0)
            if attempt == storage.attempts or time.monotonic() - start + wait > storage.retry_s:
                raise RemoteError(f"{what}: failed after {attempt} attempts in "
                                  f"{time.monotonic() - start:.1f} s; last: "
                                  f"{scrub(cause, storage)}") from None
            if stop is None:
                time.sleep(wait)
            elif stop.wait(wait):
                raise RemoteError(f"{what}: stopped") from None
        except (PermissionError, FileNotFoundError, Refused) as e:
            cause = str(e) if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
            raise RemoteError(f"{what}: {scrub(cause, storage)} (check the URL and the "
                              "credentials)") from None
    raise AssertionError("unreachable")


def stamp(name: str) -> np.ndarray:
    """``[size, tag hash]`` of a remote shard (``-1`` when unknown), what its cached index is
    checked against: size and ETag (or Last-Modified); a ``pipe:`` command by its text."""
    url, storage = real(name)
    scheme = scheme_of(url)

    def tag_hash(tag: str) -> int:
        return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:7], "little")

    if scheme == "pipe":
        return np.asarray([-1, tag_hash(url)], np.int64)
    if scheme == "s3":
        fs = _s3(storage)
        info = _retrying(f"shard {name!r}", storage, lambda: _s3_call(lambda: fs.info(url)))
        tag = str(info.get("ETag") or info.get("LastModified") or "")
        return np.asarray([int(info.get("size", -1)), tag_hash(tag)], np.int64)

    def head():
        with _http_open(url, storage, method="HEAD") as r:
            n = r.headers.get("Content-Length")
            return (int(n) if n and n.isdigit() else -1,
                    r.headers.get("ETag") or r.headers.get("Last-Modified") or "")

    size, tag = _retrying(f"shard {name!r}", storage, head)
    return np.asarray([size, tag_hash(tag)], np.int64)


def download(name: str, dst: str, expect: int = -1, beat: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> int:
    """Copy shard ``name`` into the file ``dst`` (written as ``dst.part``, then renamed); its
    size. ``RemoteError`` after the retries (NOTE [faults]), or when the body is not of the
    ``expect``ed size, or once ``stop`` is set (no request starts after it)."""
    url, storage = real(name)
    scheme = scheme_of(url)
    part = dst + ".part"
    what = f"shard {name!r}"
    beat = beat or (lambda: None)
    with open(part, "wb") as f:
        try:
            if scheme == "pipe":
                def run():
                    f.seek(0)
                    f.truncate()
                    _pipe_copy(url[5:], f, storage, beat)
                _retrying(what, storage, run, stop)
            elif scheme == "s3":
                fs = _s3(storage)
                total = expect if expect >= 0 else int(_retrying(
                    what, storage, lambda: _s3_call(lambda: fs.info(url)), stop)["size"])
                while f.tell() < total:
                    lo = f.tell()
                    hi = min(total, lo + S3_PART)
                    data = _retrying(what, storage, functools.partial(
                        _s3_call, functools.partial(fs.cat_file, url, start=lo, end=hi)), stop)
                    if not data:
                        raise RemoteError(f"{what}: ended at byte {lo} of {total}")
                    f.write(data)
                    beat()
            else:
                _retrying(what, storage, lambda: _http_copy(url, f, storage, beat), stop)
            f.flush()
        except BaseException:
            f.close()
            _unlink(part)
            raise
        size = f.tell()
    if expect >= 0 and size != expect:
        _unlink(part)
        raise RemoteError(f"{what}: {size} bytes arrived, its index says {expect} (the shard "
                          "changed or ended early); clear the listing cache to index it again")
    os.replace(part, dst)
    return size


def _http_copy(url: str, f, storage: Storage, beat: Callable[[], None]) -> None:
    """One attempt: from ``f``'s position (a ``Range`` request) to the end."""
    lo = f.tell()
    with _http_open(url, storage, lo=lo) as r:
        if lo and r.status != 206:  # no ranges: start over
            f.seek(0)
            f.truncate()
            lo = 0
        n = r.headers.get("Content-Length")
        want = lo + int(n) if n and n.isdigit() else -1
        try:
            while True:
                chunk = r.read(CHUNK)
                if not chunk:
                    break
                f.write(chunk)
                beat()
        except (TimeoutError, ConnectionError, OSError) as e:
            raise Transient(f"{type(e).__name__}: {e} at byte {f.tell()}") from None
        except Exception as e:  # http.client.IncompleteRead and kin
            raise Transient(f"{type(e).__name__} at byte {f.tell()}") from None
        if want >= 0 and f.tell() < want:
            raise Transient(f"the body ended at byte {f.tell()} of {want} (Content-Length)")


def _pipe_copy(cmd: str, f, storage: Storage, beat: Callable[[], None]) -> None:
    """One attempt: the standard output of ``cmd``, written straight into ``f``. Started with
    ``posix_spawn`` and no pipe at all: a DataLoader worker forked meanwhile would inherit a
    pipe's write end (``subprocess``'s exec-error pipe too) and the copy would wait for that
    worker to exit. No new output for ``storage.timeout`` s is a timeout, a non-zero exit
    status an error."""
    f.flush()
    with tempfile.TemporaryFile() as err:
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", cmd], dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, f.fileno(), 1), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
        status = None
        try:
            size, moved = -1, time.monotonic()
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.02)
                beat()
                now, grown = time.monotonic(), os.fstat(f.fileno()).st_size
                if grown != size:
                    size, moved = grown, now
                elif now - moved > storage.timeout:
                    raise TimeoutError(f"pipe: no output for {storage.timeout:g} s")
        finally:
            if status is None:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        f.seek(0, os.SEEK_END)
        code = os.waitstatus_to_exitcode(status)
        if code:
            err.seek(0)
            text = err.read(400).decode(errors="replace").strip()
            raise Transient(f"the command exited with status {code}" + (f": {text}" if text else ""))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def copy_local(src: str, dst: str) -> None:
    """``dst`` as a copy of ``src`` (a spool entry made from an indexing copy)."""
    shutil.copyfile(src, dst + ".part")
    os.replace(dst + ".part", dst)
