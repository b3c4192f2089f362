"""Remote shard roots: which URLs are accepted, and how a whole shard is copied to a local file.

A shard set may live behind ``http://`` / ``https://`` (``urllib``: a socket read timeout and
``Range`` requests), ``s3://`` (``s3fs``, the ``remote`` extra: endpoint and credentials from
the usual AWS environment, ``AWS_ENDPOINT_URL`` included, or ``LoaderConfig.storage_options``)
or ``pipe:COMMAND`` (the command's standard output, as WebDataset's ``pipe:``). A root is one
such URL with brace ranges (``https://host/train-{000000..000127}.tar``) or a list of URLs.
A scheme that fsspec knows but this project has not tested (``gs://``, ``ftp://``, ...) is
refused by name (``check_root``).

NOTE [no secret in a message]
URLs and ``pipe:`` commands may carry credentials. Every name the rest of the package sees is
``redact(url)`` (``remote_url``: the rules, and unparseable URLs); the real URL stays in this
module's registry (``register``), keyed by that name, and in the fetcher. Error texts from the
storage libraries and commands are passed through ``scrub``, which blanks the values of
``storage_options``, the AWS secret variables and the secrets of the URL at hand, and the
final error is raised with no exception chained to it. Credentials given in a URL reach only
the origin (scheme, host, port) they were given for: an HTTP redirect to another origin, or
from https to http, is followed without them (``_Redirects``).

NOTE [faults]
A transient failure (a refused or reset connection, a 5xx, 408 or 429 answer, a read that
times out, a body shorter than its ``Content-Length``) is retried ``Storage.attempts`` times
in all with exponential backoff, within ``Storage.retry_s`` seconds; an interrupted HTTP or S3
copy resumes at the byte it reached. After that, or at once for a permanent failure (any other
4xx answer, wrong credentials, a bad session token, a TLS protocol or certificate failure, a
redirect loop, any other refusal: ``Refused``), one ``RemoteError`` of one line names the
shard (redacted) and the last cause, never as a bad shard that ``on_bad_file="skip"`` would
drop. A stalled server is a read timeout (``Storage.timeout``, ``LoaderConfig.read_timeout``),
never a hang. A server that refuses HEAD (a presigned, GET-only URL) is asked for the size and
validator by a one-byte ranged GET. A ``stop`` event given to ``download`` ends the retries and
back-off sleeps at once (``Stopped``): no request starts once it is set. A ``pipe:`` command
runs in a process group of its own, killed when the copy ends, fails, times out or stops.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines.sources import remote_http
from pipelines.sources.folder import DatasetRootError
from pipelines.sources.remote_http import Refused, Stopped, Transient, is_tls_failure
from pipelines.sources.remote_url import braces, check_url, redact, secrets

SCHEMES = ("http", "https", "s3")  # tested; with pipe: and local paths
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):/(/?)")
S3_PART = 8 << 20  # one ranged GET of an S3 copy
EXTRA = "pip install 'gpu-feed[remote]'"


class RemoteError(DatasetRootError):
    """A remote shard that cannot be listed or copied (NOTE [faults])."""


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
    """Refuse, by name, a URL whose scheme is not tested here, a URL that does not parse, a
    malformed brace range and a URL that is not a shard set (``DatasetRootError``, one line
    naming the redacted root)."""
    entries = _entries(root)
    for k, s in enumerate(entries if entries is not None else [root]):
        if not isinstance(s, str):
            where = f"root[{k}]" if entries is not None else "root"
            raise TypeError(f"{where}: each entry must be a str URL or path, not "
                            f"{type(s).__name__}")
        scheme = scheme_of(s)
        if scheme is None:
            continue
        if scheme not in (*SCHEMES, "pipe"):
            raise DatasetRootError(
                f"root={redact(s)!r}: the {scheme}:// scheme is not supported (supported: "
                "http://, https://, s3://, pipe:COMMAND and local paths); copy or mount the data")
        braces(s)  # a malformed range names the root
        if scheme == "pipe":
            continue
        check_url(s)
        if not urllib.parse.urlsplit(s).path.lower().endswith(".tar"):
            raise DatasetRootError(
                f"root={redact(s)!r}: a remote root must name .tar shards (a brace range "
                "such as train-{000000..000127}.tar, or a list of URLs); remote folders and "
                "globs are not listed")


def scrub(text: str, storage: Storage | None = None, url: str = "") -> str:
    """``text`` with secret values blanked, on one line (NOTE [no secret in a message]): those
    of ``storage``, of the AWS environment and of ``url`` (``remote_url.secrets``)."""
    found = [os.environ.get(k, "") for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    if storage is not None:
        found += [str(v) for k, v in storage.options.items()
                  if k in ("secret", "token", "key", "password")]
    found += secrets(url) if url else []
    for v in sorted(found, key=len, reverse=True):
        if len(v) >= 4:
            text = text.replace(v, "***")
    text = re.sub(r"(X-Amz-[A-Za-z]+=)[^&\s'\"]+", r"\1***", text)
    return " ".join(text.split())


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
    """``fn()`` with botocore's and s3fs's errors sorted into transient and permanent ones, as
    ``remote_http`` sorts HTTP's (by the answer's status where there is one)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - botocore's and aiohttp's many kinds
        err = _s3_sorted(e)
        if err is None:
            raise
    raise err  # outside the except block: nothing chained


def _s3_sorted(e: Exception) -> OSError | None:
    name, text = type(e).__name__, str(e)
    cause = e.__cause__ or e  # s3fs's OSError from botocore's ClientError
    status = getattr(cause, "response", None) or {}
    code = status.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(status, dict) \
        else None
    if is_tls_failure(e):
        return Refused(f"TLS failed: {name}: {text}")
    if isinstance(code, int) and code >= 300:
        sorted_ = remote_http.status_error(code, f"{name}: {text}")
        return e if type(sorted_) in (PermissionError, FileNotFoundError) and \
            isinstance(e, type(sorted_)) else sorted_
    if isinstance(e, (PermissionError, FileNotFoundError)):
        return e
    if any(t in name + text for t in ("Timeout", "timeout", "Connection", "Throttl", "SlowDown",
                                      "InternalError", "ServiceUnavailable", "503", "500",
                                      "IncompleteRead", "ResponseStreamingError")):
        return Transient(f"{name}: {text}")
    if isinstance(e, (OSError, ValueError)) or name == "ClientError" or \
            type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "s3fs"):
        # s3fs turns botocore's 400 answers (a bad session token: InvalidToken; on a HEAD,
        # only "Bad Request") into OSError(EINVAL): no shard is to blame
        return Refused(f"{name}: {text}")
    return None


def _retrying(what: str, storage: Storage, step: Callable[[], Any],
              stop: threading.Event | None = None, url: str = ""):
    """``step()`` until it returns, retrying ``Transient`` failures (NOTE [faults]); waits on
    ``stop`` and raises ``Stopped`` once it is set, before any further attempt. The
    ``RemoteError`` is one line, scrubbed of ``url``'s secrets, and has nothing chained."""
    start = time.monotonic()
    failure = ""
    for attempt in range(1, storage.attempts + 1):
        if stop is not None and stop.is_set():
            raise Stopped(what)
        wait = 0.0
        try:
            return step()
        except (Transient, TimeoutError, ConnectionError) as e:
            cause = f"{type(e).__name__}: {e}" if not isinstance(e, Transient) else str(e)
            if "timed out" in cause.lower() or isinstance(e, TimeoutError):
                cause += f" (no data for read_timeout={storage.timeout:g} s)"
            wait = min(0.2 * 2 ** (attempt - 1), 10.0)
            if attempt == storage.attempts or time.monotonic() - start + wait > storage.retry_s:
                failure = (f"{what}: failed after {attempt} attempts in "
                           f"{time.monotonic() - start:.1f} s; last: {cause}")
        except (PermissionError, FileNotFoundError, Refused) as e:
            cause = str(e) if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
            failure = f"{what}: {cause} (check the URL and the credentials)"
        if failure:
            break
        if stop is None:
            time.sleep(wait)
        elif stop.wait(wait):
            raise Stopped(what)
    raise RemoteError(scrub(failure, storage, url))


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
        info = _retrying(f"shard {name!r}", storage, lambda: _s3_call(lambda: fs.info(url)),
                         url=url)
        tag = str(info.get("ETag") or info.get("LastModified") or "")
        return np.asarray([int(info.get("size", -1)), tag_hash(tag)], np.int64)

    size, tag = _retrying(f"shard {name!r}", storage,
                          lambda: remote_http.head(url, storage.timeout), url=url)
    return np.asarray([size, tag_hash(tag)], np.int64)


def download(name: str, dst: str, expect: int = -1, beat: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> int:
    """Copy shard ``name`` into the file ``dst`` (written as ``dst.part``, then renamed).

    Args:
        name: a shard name from ``register`` (a redacted URL).
        dst: the local file to write.
        expect: the size the shard's index says, or ``-1``.
        beat: called as the bytes arrive (a heartbeat; it may raise to abort the copy).
        stop: once set, no further request starts: the retries, back-off sleeps, the copy's
            read loop and a ``pipe:`` command (its process group killed) end with ``Stopped``.

    Returns:
        The size of the copy.

    Raises:
        RemoteError: after the retries or at once for a permanent failure (NOTE [faults]), or
            when the body is not of the ``expect``ed size.
        Stopped: ``stop`` was set; ``dst`` is not written.
    """
    url, storage = real(name)
    scheme = scheme_of(url)
    part = dst + ".part"
    what = f"shard {name!r}"
    beat = beat or (lambda: None)
    retry = functools.partial(_retrying, what, storage, stop=stop, url=url)
    with open(part, "wb") as f:
        try:
            if scheme == "pipe":
                def run():
                    f.seek(0)
                    f.truncate()
                    _pipe_copy(url[5:], f, storage, beat, stop)
                retry(run)
            elif scheme == "s3":
                fs = _s3(storage)
                total = expect if expect >= 0 else int(retry(
                    lambda: _s3_call(lambda: fs.info(url)))["size"])
                while f.tell() < total:
                    lo = f.tell()
                    hi = min(total, lo + S3_PART)
                    data = retry(functools.partial(
                        _s3_call, functools.partial(fs.cat_file, url, start=lo, end=hi)))
                    if not data:
                        raise RemoteError(f"{what}: ended at byte {lo} of {total}")
                    f.write(data)
                    beat()
            else:
                retry(lambda: remote_http.copy(url, f, storage.timeout, beat, stop))
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


def _pipe_copy(cmd: str, f, storage: Storage, beat: Callable[[], None],
               stop: threading.Event | None = None) -> None:
    """One attempt: the standard output of ``cmd``, written straight into ``f``. Started with
    ``posix_spawn`` and no pipe at all: a DataLoader worker forked meanwhile would inherit a
    pipe's write end (``subprocess``'s exec-error pipe too) and the copy would wait for that
    worker to exit. No new output for ``storage.timeout`` s is a timeout, a non-zero exit
    status an error. The command runs in a process group of its own, killed whatever the end
    (done, failed, timed out, ``stop`` set, ``beat`` raised): no process of it outlives the copy."""
    f.flush()
    with tempfile.TemporaryFile() as err:
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", cmd], dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, f.fileno(), 1), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)],
            setpgroup=0)
        status = None
        try:
            size, moved = -1, time.monotonic()
            while True:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = code
                    break
                if stop is not None and stop.wait(0.02):
                    raise Stopped(f"pipe: {pid}")
                if stop is None:
                    time.sleep(0.02)
                beat()
                now, grown = time.monotonic(), os.fstat(f.fileno()).st_size
                if grown != size:
                    size, moved = grown, now
                elif now - moved > storage.timeout:
                    raise TimeoutError(f"pipe: no output for {storage.timeout:g} s")
        finally:
            _kill_group(pid)  # the pid names the group while any member lives: never reused
            if status is None:
                os.waitpid(pid, 0)
        f.seek(0, os.SEEK_END)
        code = os.waitstatus_to_exitcode(status)
        if code:
            err.seek(0)
            text = err.read(400).decode(errors="replace").strip()
            raise Transient(f"the command exited with status {code}" + (f": {text}" if text else ""))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def copy_local(src: str, dst: str) -> None:
    """``dst`` as a copy of ``src`` (a spool entry made from an indexing copy)."""
    shutil.copyfile(src, dst + ".part")
    os.replace(dst + ".part", dst)
