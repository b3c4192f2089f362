"""``python -m compare diff A/results.json B/results.json``: did B get faster or slower than A?

Refuses to compare runs whose setups differ in what decides the numbers (the GPU, the data,
the model, the batch size, the dtype, the image size, the number of ranks: ``compare scaling``
compares rank counts); ``--force`` compares them anyway and says
which differ. The same generated images as a folder and as tar shards (``data_gen --format``)
count as the same data, so ``diff FOLDER SHARDS`` gives the row of each backend for the two
sources. For each variant in both runs it prints the ratio of B's median samples/s to A's
and a verdict: ``faster`` or ``slower`` when the gap is larger than the larger of the two
spreads (max - min over the repeats), else ``no significant difference``. The ceiling row shows
whether the model step itself moved. Exit status: 0, or 2 for a usage error or incompatible runs.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import cli
from .results import SuiteResult

PROG = "python -m compare diff"
METRIC = "samples_per_s"


def _facts(r: SuiteResult) -> Dict[str, object]:
    """What has to match for two runs to be comparable."""
    s, e = r.setup, r.env
    images = {k: v for k, v in (s.get("dataset") or {}).items() if k != "shards"}
    return {"gpu": e.get("gpu") or e.get("cuda_device") or e.get("device_name"),
            "data": images or s.get("data"), "model": s.get("model"),
            "batch_size": s.get("batch_size"), "dtype": s.get("dtype"),
            "augment": s.get("augment"), "device": s.get("device"),
            "world_size": s.get("world_size") or 1}


def incompatible(a: SuiteResult, b: SuiteResult) -> List[str]:
    """``"key: A -> B"`` for each fact that differs between the two runs."""
    fa, fb = _facts(a), _facts(b)
    return [f"{k}: {fa[k]!r} -> {fb[k]!r}" for k in fa if fa[k] != fb[k]]


def comparable(a: SuiteResult, b: SuiteResult, force: bool, ignore: Tuple[str, ...] = (),
               why: str = "the runs are not comparable") -> List[str]:
    """The facts that differ between two runs (``key: A -> B``), apart from ``ignore``.

    Raises:
        ValueError: some differ and not ``force`` (``why``, then the facts and the way out).
    """
    diff = [d for d in incompatible(a, b) if d.split(":", 1)[0] not in ignore]
    if diff and not force:
        raise ValueError(f"{why} ({'; '.join(diff)}); use --force to compare them anyway")
    return diff


def verdict(va, vb) -> Tuple[float, str]:
    """``(ratio, verdict)`` of B against A for one row."""
    ma, mb = va.median(METRIC), vb.median(METRIC)
    noise = max(va.spread(METRIC), vb.spread(METRIC))
    ratio = mb / ma if ma else float("nan")
    if abs(mb - ma) <= noise:
        return ratio, "no significant difference"
    return ratio, "faster" if mb > ma else "slower"


def rows(a: SuiteResult, b: SuiteResult) -> List[Tuple[str, float, float, float, str]]:
    """``(label, A median, B median, ratio, verdict)`` for the ceiling and each shared variant."""
    out = []
    pairs = [("ceiling", a.ceiling, b.ceiling)] if a.ceiling and b.ceiling else []
    labels_b = {v.label: v for v in b.variants}
    pairs += [(v.label, v, labels_b[v.label]) for v in a.variants if v.label in labels_b]
    for label, va, vb in pairs:
        ratio, word = verdict(va, vb)
        out.append((label, va.median(METRIC), vb.median(METRIC), ratio, word))
    return out


def _load(path: str, option: str) -> SuiteResult:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise ValueError(f"{option} {path!r} is not a results.json (or a folder holding one)")
    try:
        return SuiteResult.load(p)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{option} {path!r} is not a compare results.json ({e})") from None


def main(argv: Optional[List[str]] = None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__, formatter_class=cli.HelpFormatter)
    p.add_argument("a", metavar="A", help="the earlier results.json (or its folder)")
    p.add_argument("b", metavar="B", help="the later results.json (or its folder)")
    p.add_argument("--force", action="store_true",
                   help="compare runs whose setups differ, saying which facts differ")
    args = p.parse_args(argv)
    try:
        a, b = _load(args.a, "A"), _load(args.b, "B")
        diff = comparable(a, b, args.force)
    except ValueError as e:
        return cli.fail(PROG, e)
    for d in diff:
        print(f"note: differs: {d}")
    sa, sb = a.setup.get("source", "folder"), b.setup.get("source", "folder")
    if sa != sb:  # the same images (data_gen's statistics match) read from another source
        print(f"note: the same images, read from a {sa} in A and from {sb} in B")
    table = rows(a, b)
    if not table:
        return cli.fail(PROG, "the runs share no variant label")
    print(f"{'variant':28s} {'A samples/s':>12s} {'B samples/s':>12s} {'B/A':>7s}  verdict")
    for label, ma, mb, ratio, word in table:
        print(f"{label:28s} {ma:12.1f} {mb:12.1f} {ratio:7.3f}  {word}")
    only = sorted({v.label for v in a.variants} ^ {v.label for v in b.variants})
    if only:
        print(f"not in both runs: {', '.join(only)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
