"""Remote shard URLs as text: parsing, brace ranges, and the names that messages may show.

NOTE [no secret in a message]
URLs may carry credentials (``https://user:pass@host``, a presigned S3 query string) and a
``pipe:`` command may hold them too (a URL, ``curl -u user:pass``, ``-H 'Authorization: ...'``,
``TOKEN=...``). Every name the rest of the package sees is ``redact(url)``: a URL without
userinfo, query or fragment; a ``pipe:`` command with each URL in it so redacted and the values
of ``-u``/``--user``/``--password``/``--token``, of header options and of variables named like
a secret (``*TOKEN*=``, ``*SECRET*=``, ``*PASSWORD*=``, ``*KEY*=``, ...) replaced by ``***``.
``secrets(url)`` lists what was removed, for ``remote.scrub`` to blank in the storage
libraries' and commands' error texts. A URL that does not parse (an unencoded ``#``, ``/``,
``?`` or ``@`` in a password, a bad port, a broken IPv6 literal) is one ``DatasetRootError``
naming the redacted root, raised with no exception chained to it (``check_url``).
"""
from __future__ import annotations

import re
import urllib.parse

from pipelines.sources.folder import DatasetRootError

_BRACE = re.compile(r"\{([^{}]*)\}")
_HOST = re.compile(r"(?:[\w-]+\.[\w.-]+|localhost|\[[0-9A-Fa-f:.]+\])(?::\d*)?|[\w.-]+:\d+")
_RANGE = re.compile(r"(-?\w*)\.\.(-?\w*)")
_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"]+")  # a URL inside a command
_SECRET_WORD = r"[A-Za-z0-9_]*(?:SECRET|TOKEN|PASSWORD|PASSWD|PASS|KEY|CREDENTIAL|AUTH|SIG)" \
               r"[A-Za-z0-9_]*"
_PIPE_SECRETS = (  # (pattern, group of the kept prefix): the rest of the match is a secret
    re.compile(r"((?:^|\s)(?:-u|--user|--proxy-user|--password|--pass|--token|--secret|"
               r"--oauth2-bearer)(?:=|\s+))('[^']*'|\"[^\"]*\"|\S+)"),
    re.compile(r"((?:^|\s)(?:-H|--header)(?:=|\s+)['\"]?[A-Za-z0-9_-]+:\s*)([^'\"]*)"),
    re.compile(rf"((?:^|[\s;&|(]){_SECRET_WORD}=)('[^']*'|\"[^\"]*\"|\S+)", re.IGNORECASE),
)


def is_pipe(s: str) -> bool:
    return s[:5].lower() == "pipe:"


# -- parsing -------------------------------------------------------------------------------------
def _fault(url: str) -> str | None:
    """Why ``url`` does not parse as a URL, or ``None``; the reason holds nothing of ``url``."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    try:
        p = urllib.parse.urlsplit(url)
        p.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        text = str(e)
        return "a broken IPv6 literal" if "IPv6" in text else (
            "a port out of range" if "range" in text else
            "a bad port, or an unencoded '#', '/' or '?' in the password")
    if "@" in p.netloc.rpartition("@")[0]:
        return "an unencoded '@' in the user name or password"
    m = re.match(r"[/?#][^/?#]*@([^/?#]*)", rest[len(p.netloc):])
    if "@" not in p.netloc and ":" in p.netloc and m and _HOST.fullmatch(m.group(1)):
        # "user:12/34@host.example": "12" read as a port, the rest as the path
        return "an unencoded '#', '/' or '?' in the password"
    if not p.hostname and p.scheme != "s3":
        return "no host"
    return None


def check_url(url: str) -> None:
    """``DatasetRootError`` naming ``redact(url)`` when ``url`` does not parse (module NOTE);
    raised outside any ``except`` block, so no exception with a part of the URL is chained."""
    why = _fault(url)
    if why is not None:
        raise DatasetRootError(f"root={redact(url)!r}: the URL does not parse ({why}); "
                               "percent-encode reserved characters in credentials (%40 for "
                               "'@', %23 for '#', %2F for '/', %3F for '?')")


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of a URL, the default port filled in."""
    p = urllib.parse.urlsplit(url)
    scheme = p.scheme.lower()
    return scheme, (p.hostname or "").lower(), p.port or {"http": 80, "https": 443}.get(scheme)


# -- what may be shown ---------------------------------------------------------------------------
def redact(url: str) -> str:
    """``url`` without userinfo, query or fragment; a ``pipe:`` command with its secrets
    replaced (module NOTE)."""
    if is_pipe(url):
        return _redact_pipe(url)[0]
    if "://" not in url:  # a local path
        return url
    if _fault(url) is None:
        p = urllib.parse.urlsplit(url)
        host = p.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if p.port is not None:
            host = f"{host}:{p.port}"
        return urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))
    # unparseable: the scheme, then what follows the last '@' up to a '?' or '#'
    scheme, _, rest = url.partition("://")
    tail = re.split(r"[?#]", rest.rpartition("@")[2], maxsplit=1)[0]
    if not tail or "=" in tail or "&" in tail:
        tail = "..."
    return f"{scheme}://{tail}"


def _redact_pipe(cmd: str) -> tuple[str, list[str]]:
    found: list[str] = []

    def url(m: re.Match) -> str:
        found.extend(secrets(m.group(0)))
        return redact(m.group(0))

    out = _IN_TEXT.sub(url, cmd[5:])  # after "pipe:"
    for pattern in _PIPE_SECRETS:
        def mask(m: re.Match) -> str:
            found.append(m.group(2).strip("'\""))
            quote = m.group(2)[:1] if m.group(2)[:1] in "'\"" else ""
            return f"{m.group(1)}{quote}***{quote}"

        out = pattern.sub(mask, out)
    return cmd[:5] + out, found


def secrets(url: str) -> list[str]:
    """The parts of ``url`` (or of a ``pipe:`` command) that ``redact`` removes: userinfo,
    query values and the query itself, a command's masked values."""
    if is_pipe(url):
        return _redact_pipe(url)[1]
    if "://" not in url:
        return []
    if _fault(url) is not None:  # keep whatever is not the host and path
        scheme, _, rest = url.partition("://")
        head, _, tail = rest.rpartition("@")
        query = re.split(r"[?#]", tail, maxsplit=1)[1:]
        return [s for s in (head, *head.split(":"), *query) if s]
    p = urllib.parse.urlsplit(url)
    out = [p.username or "", p.password or "", p.query, p.fragment]
    out += [urllib.parse.unquote(s) for s in out]
    out += [v for _, v in urllib.parse.parse_qsl(p.query + "&" + p.fragment)]
    return [s for s in out if s]


# -- brace ranges --------------------------------------------------------------------------------
def braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` and ``{000..031}`` (zero padding kept) as WebDataset's URLs do.

    Raises:
        DatasetRootError: naming the (redacted) pattern: unbalanced braces, or a range that is
            not ``{LO..HI}`` with decimal ``LO <= HI``.
    """
    depth = 0
    for c in pattern:
        depth += (c == "{") - (c == "}")
        if depth < 0:
            break
    if depth:
        raise DatasetRootError(f"root={redact(pattern)!r}: unbalanced braces; a brace range is "
                               "{LO..HI} or {a,b,c}")
    return _expand(pattern, pattern)


def _expand(pattern: str, whole: str) -> list[str]:
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body, out = m.group(1), []
    r = _RANGE.fullmatch(body)
    if r:
        lo, hi = r.groups()
        if not (lo.isdecimal() and hi.isdecimal() and lo.isascii() and hi.isascii()) or \
                int(lo) > int(hi):
            raise DatasetRootError(
                f"root={redact(whole)!r}: the brace range {{{body}}} is not {{LO..HI}} with "
                "decimal LO <= HI (e.g. {000000..000127})")
        width = len(lo) if lo.startswith("0") else 0
        items = [str(k).zfill(width) for k in range(int(lo), int(hi) + 1)]
    else:
        items = body.split(",")
    for item in items:
        out += _expand(pattern[:m.start()] + item + pattern[m.end():], whole)
    return out
