"""``--out s3://bucket/prefix``: tar shards made in a temporary folder, then uploaded (issue 44).

NOTE [upload]
``python -m data_gen --format wds --out s3://bucket/prefix`` makes the dataset as for a local
``--out`` (the same bytes for the same arguments), in a temporary folder (``TMPDIR``), then
copies its shards and, last, its ``manifest.json`` to ``bucket/prefix/`` through s3fs (the
``remote`` extra) and deletes the folder. So the manifest there means the upload finished.

* An unfinished upload is recognised, never refused: before its first object a run writes
  ``UPLOADING`` (``.data_gen-upload.json``: the generator tag and every name it may write,
  those of an unfinished upload it takes over included), and deletes it after the manifest.
  The next run, without ``--force``, treats the objects that marker names as its own: those
  already holding its bytes (size and ETag) stay, the rest are uploaded again, and those it no
  longer writes (another recipe's) are deleted. Any other object is foreign (next point).

* Credentials and endpoint: as the loader's ``s3://`` roots, the usual AWS environment
  (``AWS_ENDPOINT_URL`` included) or ``--storage-option KEY=VALUE`` (keyword arguments of
  ``s3fs.S3FileSystem``, e.g. ``endpoint_url=http://127.0.0.1:9000``).
* Nothing is overwritten silently: a prefix that holds a foreign object is refused before
  anything is generated, and checked again before the upload, unless ``--force``: then foreign
  objects of the same names are replaced, the others stay, and a warning counts both.
* Errors are one line that names ``--out`` and the object, with secret values blanked (the
  AWS secret variables and the secret-like storage options); botocore retries a transient
  failure a bounded number of times (``RETRIES``), each request within ``TIMEOUT_S``.
* The bucket is never created here; only ``s3://`` is uploaded to (an ``http(s)://`` PUT
  target is refused by name).

data_gen stands alone (it imports nothing from ``pipelines``), so this module does not share
the loader's transport code.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from .generate import GenConfig, generate
from .outdir import GENERATOR_TAG, MANIFEST

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+)://")
TIMEOUT_S = 60.0
RETRIES = 5
EXTRA = "pip install 'gpu-feed[remote]'"
UPLOADING = ".data_gen-upload.json"  # the marker of an unfinished upload (module NOTE)
_SECRET_KEYS = ("secret", "token", "key", "password", "aws_secret_access_key",
                "aws_session_token")


def is_url(out: str) -> bool:
    """Whether ``--out`` names a URL (``scheme://...``) rather than a folder."""
    return _URL.match(str(out)) is not None


def parse_options(pairs: list[str] | None) -> dict:
    """``--storage-option KEY=VALUE`` pairs as keyword arguments; ``true``/``false`` and numbers
    become a bool or a number, anything else stays a str.

    Raises:
        ValueError: a pair without ``=``, naming the option.
    """
    out: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option {pair.split('=')[0]!r}: expected KEY=VALUE")
        low = value.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
        elif re.fullmatch(r"-?\d+", value):
            out[key] = int(value)
        elif re.fullmatch(r"-?\d+\.\d*", value):
            out[key] = float(value)
        else:
            out[key] = value
    return out


def scrub(text: str, options: dict) -> str:
    """``text`` on one line, with secret values blanked (module NOTE)."""
    secrets = [os.environ.get(k, "") for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    secrets += [str(v) for k, v in options.items() if k.lower() in _SECRET_KEYS]
    for v in secrets:
        if len(v) >= 4:
            text = text.replace(v, "***")
    text = re.sub(r"(X-Amz-[A-Za-z]+=)[^&\s'\"]+", r"\1***", text)
    return " ".join(text.split())[:400]


class Bucket:
    """An ``s3://bucket/prefix`` destination and its s3fs filesystem.

    Args:
        url: ``--out``, ``s3://bucket`` or ``s3://bucket/prefix`` (a trailing ``/`` is dropped).
        options: ``--storage-option`` values (keyword arguments of ``s3fs.S3FileSystem``).
    """

    def __init__(self, url: str, options: dict):
        m = _URL.match(url)
        scheme = m.group(1).lower() if m else ""
        if scheme != "s3":
            raise ValueError(f"--out {url!r}: data_gen uploads to s3://bucket/prefix only, not "
                             f"{scheme}://; write to a folder (--out DIR) and copy or serve it")
        path = url[m.end():].strip("/") if m else ""
        if not path or "?" in path or "#" in path:
            raise ValueError(f"--out {url!r}: expected s3://bucket/prefix")
        self.url, self.path, self.options = f"s3://{path}", path, dict(options)
        self.label = f"--out {self.url!r}"
        try:
            import s3fs
        except ImportError:
            raise ImportError(f"--out s3://... needs s3fs and fsspec: {EXTRA}") from None
        opts = dict(self.options)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts:
            opts["endpoint_url"] = endpoint
        cfg = dict(opts.pop("config_kwargs", {}))
        cfg.setdefault("connect_timeout", TIMEOUT_S)
        cfg.setdefault("read_timeout", TIMEOUT_S)
        cfg.setdefault("retries", {"max_attempts": RETRIES, "mode": "standard"})
        try:
            self.fs = s3fs.S3FileSystem(config_kwargs=cfg, skip_instance_cache=True, **opts)
        except TypeError as e:
            raise ValueError(f"--storage-option: {scrub(str(e), self.options)}") from None

    def _fail(self, what: str, e: BaseException) -> OSError:
        hint = {PermissionError: " (check the credentials: AWS_ACCESS_KEY_ID, "
                                 "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or "
                                 "--storage-option)",
                FileNotFoundError: " (does the bucket exist? data_gen does not create it)"}
        more = next((h for t, h in hint.items() if isinstance(e, t)), "")
        text = scrub(f"{type(e).__name__}: {e}", self.options)
        return OSError(f"{self.label}: {what} failed: {text}{more}")

    def existing(self) -> dict[str, dict]:
        """The objects under the prefix: name (relative to it) -> s3fs's details."""
        try:
            self.fs.invalidate_cache(self.path)  # what is there now, not what was listed before
            found = self.fs.find(self.path, detail=True)
        except Exception as e:  # noqa: BLE001 - botocore's and aiohttp's many kinds
            raise self._fail("listing", e) from None
        head = self.path + "/"
        return {p[len(head):]: d for p, d in sorted(found.items()) if p.startswith(head)}

    def unfinished(self, there: dict[str, dict]) -> set[str]:
        """The names of an unfinished upload of data_gen's here (its ``UPLOADING`` marker's)."""
        if UPLOADING not in there:
            return set()
        try:
            mark = json.loads(self.fs.cat_file(f"{self.path}/{UPLOADING}"))
        except ValueError:  # not JSON: not our marker
            return set()
        except Exception as e:  # noqa: BLE001 - botocore's and aiohttp's many kinds
            raise self._fail(f"reading {UPLOADING!r}", e) from None
        ok = isinstance(mark, dict) and mark.get("generator") == GENERATOR_TAG
        return {UPLOADING, *mark.get("files", ())} if ok else set()

    def check(self, force: bool) -> tuple[dict[str, dict], set[str]]:
        """The objects already there and the names of an unfinished upload of ours among them;
        refuse any other object without ``force``."""
        there = self.existing()
        ours = self.unfinished(there)
        theirs = sorted(set(there) - ours)
        if theirs and not force:
            raise FileExistsError(f"{self.label} holds {len(theirs)} objects (e.g. {theirs[0]!r}); "
                                  "choose another prefix, delete them, or pass --force to "
                                  "replace those of the same names")
        return there, ours

    def call(self, what: str, fn, *args) -> None:
        """``fn(*args)`` (an s3fs call), its error one line naming ``what``."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - botocore's and aiohttp's many kinds
            raise self._fail(what, e) from None

    def put(self, local: Path, rel: str) -> None:
        """Upload ``local`` as ``prefix/rel``."""
        self.call(f"upload of {rel!r}", self.fs.put_file, str(local), f"{self.path}/{rel}")


def _same(local: Path, info: dict) -> bool:
    """Whether the object ``info`` (s3fs's details) holds ``local``'s bytes: its size, and an
    ETag that is their MD5 (a multipart upload's is not: then it is uploaded again)."""
    if info.get("size") != local.stat().st_size:
        return False
    return str(info.get("ETag", "")).strip('"') == hashlib.md5(local.read_bytes()).hexdigest()


def generate_and_upload(cfg: GenConfig, options: dict | None = None,
                        progress: bool | None = None) -> dict:
    """Make ``cfg`` in a temporary folder and upload it to ``cfg.out``, an ``s3://`` URL
    (module NOTE).

    Args:
        cfg: what to generate; ``cfg.out`` is ``s3://bucket/prefix``, ``cfg.layout`` ``"wds"``,
            ``cfg.force`` allows a prefix that holds foreign objects (same names replaced).
        options: keyword arguments of ``s3fs.S3FileSystem`` (``--storage-option``).
        progress: show progress bars (``None``: when stdout is a terminal).

    Returns:
        The manifest, with ``"root"``: the shards as a loader root
        (``s3://bucket/prefix/shard-{000000..000019}.tar``).

    Raises:
        ValueError: not an ``s3://`` URL, or not ``layout="wds"`` (the loader streams tar
            shards only).
        FileExistsError: the prefix holds objects other than an unfinished upload of data_gen's
            (module NOTE) and ``cfg.force`` is not set.
        OSError: listing or uploading failed (one line, no secret).
    """
    bucket = Bucket(str(cfg.out), options or {})
    if cfg.layout != "wds":
        raise ValueError(f"{bucket.label}: a remote --out takes --format wds (the loader streams "
                         f"tar shards only), not --format {cfg.layout}")
    bucket.check(cfg.force)  # before any work
    tmp = tempfile.mkdtemp(prefix="data_gen-upload-")
    try:
        local = Path(tmp) / "out"
        manifest = generate(replace(cfg, out=str(local), force=False), progress=progress)
        there, ours = bucket.check(cfg.force)  # again: the prefix may have changed meanwhile
        names = [f["path"] for f in manifest["files"]]
        mark = {"generator": GENERATOR_TAG, "files": sorted((ours | {*names, MANIFEST}) - {UPLOADING})}
        bucket.call(f"writing {UPLOADING!r}", bucket.fs.pipe_file, f"{bucket.path}/{UPLOADING}",
                    json.dumps(mark).encode())  # before any object: this upload is ours
        kept = [rel for rel in names if rel in ours & set(there) and _same(local / rel, there[rel])]
        if kept:
            print(f"data_gen: resuming an unfinished upload to {bucket.label}: {len(kept)} of "
                  f"{len(names)} objects are already there", file=sys.stderr)
        for rel in [n for n in names if n not in kept] + [MANIFEST]:  # the manifest last
            bucket.put(local / rel, rel)
        for rel in sorted((ours & set(there)) - {*names, MANIFEST, UPLOADING}) + [UPLOADING]:
            bucket.call(f"deleting {rel!r}", bucket.fs.rm_file, f"{bucket.path}/{rel}")  # ours
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    theirs = set(there) - ours
    replaced = theirs & set(names + [MANIFEST])
    if theirs:
        print(f"data_gen: warning: {bucket.label} held {len(theirs)} objects: {len(replaced)} "
              f"replaced (same names), {len(theirs - replaced)} left as they were",
              file=sys.stderr)
    shards = sorted(n for n in names if n.endswith(".tar"))
    first, last = shards[0][len("shard-"):-4], shards[-1][len("shard-"):-4]
    span = first if first == last else f"{{{first}..{last}}}"
    return {**manifest, "root": f"{bucket.url}/shard-{span}.tar"}
