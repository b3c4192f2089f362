"""The ``http://`` / ``https://`` transport of remote shards: one request, its failure sorted.

Each function makes one attempt; ``remote._retrying`` retries what is ``Transient`` (NOTE
[faults] in ``remote``). Here a failure is sorted: a reset or refused connection, a read that
times out, a 5xx, 408 or 429 answer are ``Transient``; 404 and 410 are ``FileNotFoundError``,
401 and 403 ``PermissionError``, any other 4xx, a redirect loop, a TLS protocol or certificate
failure and an HTTP protocol error are ``Refused``. Messages hold no part of the URL beyond
what ``remote_url.redact`` shows.

NOTE [redirects]
Credentials given in the URL (userinfo, sent as a ``Basic`` ``Authorization`` header) go only
to the origin (scheme, host, port) they were given for, as ``requests`` does: ``_Redirects``
follows a redirect to another origin, or from ``https`` to ``http``, without the header, and
it never comes back on a later hop. A query string is the server's to keep: a redirect goes to
the ``Location`` the server names. A HEAD stays a HEAD across redirects.
"""
from __future__ import annotations

import base64
import http.client
import re
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from pipelines.sources.remote_url import origin, redact

CHUNK = 1 << 20
MAX_REDIRECTS = 10


class Transient(OSError):
    """A failure worth another attempt (NOTE [faults] in ``remote``)."""


class Refused(OSError):
    """A failure that another attempt would not mend: the server refused the request (a bad
    session token's 400, an unknown key, a denied action), or TLS failed (NOTE [faults])."""


class Stopped(Exception):
    """``remote.download``'s ``stop`` event was set: the copy ended early, without error."""


def is_tls_failure(e: BaseException | None) -> bool:
    """Whether ``e`` (or an exception chained to it) is a TLS protocol or certificate failure;
    an EOF in the middle of TLS is a dropped connection, not one."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ssl.SSLError):
            return not isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError))
        if "SSL" in type(e).__name__ or "Certificate" in type(e).__name__:
            return True
        e = e.__cause__ or e.__context__
    return False


def status_error(code: int, reason: str, method: str = "GET") -> OSError:
    """The failure an HTTP answer ``code`` stands for (module doc)."""
    text = f"HTTP {code} {' '.join(str(reason).split())}".strip()
    if 300 <= code < 400:
        return Refused(f"{text}: a redirect loop, more than {MAX_REDIRECTS} redirects, or a "
                       "redirect that cannot be followed")
    if code >= 500 or code in (408, 429):
        if method == "HEAD" and code == 501:  # no HEAD here: stamp() asks a GET
            return Refused(text)
        return Transient(text)
    if code in (404, 410):
        return FileNotFoundError(text)
    if code in (401, 403):
        return PermissionError(text)
    return Refused(text)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """NOTE [redirects]."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        new.method = req.get_method()  # HEAD stays HEAD
        home = getattr(req, "home", None) or origin(req.full_url)
        new.home = home  # type: ignore[attr-defined]
        if origin(new.full_url) != home:  # another origin, or https -> http: no credentials
            new.remove_header("Authorization")
        return new


def open_url(url: str, timeout: float, *, method: str = "GET", lo: int = 0,
             hi: int | None = None):
    """The response to one request for ``url`` (``Range: bytes=lo-hi`` when ``lo`` or ``hi``
    is given); failures sorted as the module doc says."""
    req = urllib.request.Request(url, method=method)
    p = urllib.parse.urlsplit(url)
    if p.username:  # userinfo in the URL: basic auth, never shown (NOTE [redirects])
        user, word = urllib.parse.unquote(p.username), urllib.parse.unquote(p.password or "")
        token = base64.b64encode(f"{user}:{word}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        req.full_url = redact(url) + (f"?{p.query}" if p.query else "")
    if lo or hi is not None:
        req.add_header("Range", f"bytes={lo}-{'' if hi is None else hi}")
    opener = urllib.request.build_opener(_Redirects)
    err: OSError
    try:
        return opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        err = status_error(e.code, e.reason, method)
    except urllib.error.URLError as e:
        why = e.reason if isinstance(e.reason, BaseException) else None
        text = f"{type(why).__name__}: {why}" if why is not None else str(e.reason)
        err = Refused(f"TLS failed: {text}") if is_tls_failure(why) else Transient(text)
    except ssl.SSLError as e:
        err = Refused(f"TLS failed: {type(e).__name__}: {e}") if is_tls_failure(e) \
            else Transient(f"{type(e).__name__}: {e}")
    except (TimeoutError, ConnectionError, http.client.IncompleteRead) as e:
        err = Transient(f"{type(e).__name__}: {e}")
    except (http.client.HTTPException, ValueError) as e:  # garbage for an answer, a bad URL
        err = Refused(f"{type(e).__name__}: {_first_line(e)}")
    raise err  # outside the except blocks: no exception holding the URL is chained


def _first_line(e: BaseException) -> str:
    return re.sub(r"\s+", " ", str(e))[:200]


def size_and_tag(r) -> tuple[int, str]:
    """``(size, validator)`` from a HEAD's answer or a ranged GET's (``Content-Range``'s total);
    ``-1`` for an unknown size, ``""`` without ETag or Last-Modified."""
    size = -1
    total = re.fullmatch(r"bytes [^/]*/(\d+)", (r.headers.get("Content-Range") or "").strip())
    n = r.headers.get("Content-Length")
    if r.status == 206 and total:
        size = int(total.group(1))
    elif r.status != 206 and n and n.isdigit():
        size = int(n)
    return size, r.headers.get("ETag") or r.headers.get("Last-Modified") or ""


def head(url: str, timeout: float) -> tuple[int, str]:
    """``size_and_tag`` of ``url``: from a HEAD or, when the server refuses HEAD (a presigned,
    GET-only URL answers 403, some servers 405 or 501), from a GET of its first byte."""
    try:
        with open_url(url, timeout, method="HEAD") as r:
            return size_and_tag(r)
    except (PermissionError, FileNotFoundError, Refused) as e:
        if str(e).startswith("TLS failed"):
            raise
    with open_url(url, timeout, hi=0) as r:  # the body (one byte, or all if no ranges) unread
        return size_and_tag(r)


def copy(url: str, f, timeout: float, beat: Callable[[], None],
         stop: threading.Event | None = None) -> None:
    """One attempt: from ``f``'s position (a ``Range`` request) to the end."""
    lo = f.tell()
    with open_url(url, timeout, lo=lo) as r:
        if lo and r.status != 206:  # no ranges: start over
            f.seek(0)
            f.truncate()
            lo = 0
        n = r.headers.get("Content-Length")
        want = lo + int(n) if n and n.isdigit() else -1
        err: Exception | None = None
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise Stopped
                chunk = r.read(CHUNK)
                if not chunk:
                    break
                f.write(chunk)
                beat()
        except ssl.SSLError as e:
            err = Refused(f"TLS failed: {type(e).__name__}: {e} at byte {f.tell()}") \
                if is_tls_failure(e) else Transient(f"{type(e).__name__}: {e} at byte {f.tell()}")
        except OSError as e:  # TimeoutError, ConnectionError and kin
            err = Transient(f"{type(e).__name__}: {e} at byte {f.tell()}")
        except http.client.HTTPException as e:  # IncompleteRead and kin
            err = Transient(f"{type(e).__name__} at byte {f.tell()}")
        if err is not None:
            raise err
        if want >= 0 and f.tell() < want:
            raise Transient(f"the body ended at byte {f.tell()} of {want} (Content-Length)")
