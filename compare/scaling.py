"""``python -m compare scaling ONE/results.json MANY/results.json``: how a run scales with GPUs.

ONE and MANY are the same command run with fewer and more ranks. For each variant in both, and
the ceiling: the job's samples/s, MANY's per rank, the speed-up and the scaling efficiency
(speed-up / rank ratio), each with the range of the repeats' extremes (an efficiency whose range
holds 100 is within noise of perfect scaling). Setups that differ in more than the rank count
are refused (``--force`` compares them anyway). ``--out FILE`` also writes it as markdown.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import cli, owned
from .diff import comparable
from .plot import read
from .report import grid, md_table
from .results import SuiteResult, VariantResult

PROG = "python -m compare scaling"
METRIC = "samples_per_s"
COLUMNS = ("variant", "ONE samples/s", "MANY samples/s", "MANY per rank", "speed-up", "efficiency %")


def world(r: SuiteResult) -> int:
    return int(r.setup.get("world_size") or 1)


def _ratio(a: VariantResult, b: VariantResult, scale: float) -> tuple[float, float, float]:
    """``(median ratio, low, high)`` of ``b / a / scale`` from medians and extremes."""
    va, vb = a.values(METRIC), b.values(METRIC)
    med = b.median(METRIC) / a.median(METRIC) / scale
    return med, min(vb) / max(va) / scale, max(vb) / min(va) / scale


def rows(one: SuiteResult, many: SuiteResult) -> list[list[str]]:
    w1, w2 = world(one), world(many)
    pairs = [("ceiling", one.ceiling, many.ceiling)] if one.ceiling and many.ceiling else []
    by = {v.label: v for v in many.variants}
    pairs += [(v.label, v, by[v.label]) for v in one.variants if v.label in by]
    out = []
    for label, a, b in pairs:
        s, slo, shi = _ratio(a, b, 1.0)
        e, elo, ehi = (100 * x for x in _ratio(a, b, w2 / w1))
        out.append([label, f"{a.median(METRIC):.1f}", f"{b.median(METRIC):.1f}",
                    f"{b.median(METRIC) / w2:.1f}", f"{s:.2f}x [{slo:.2f}, {shi:.2f}]",
                    f"{e:.1f} [{elo:.1f}, {ehi:.1f}]"])
    return out


def render(one: SuiteResult, many: SuiteResult, body: list[list[str]]) -> str:
    head = (f"ONE: {world(one)} rank(s), MANY: {world(many)} ranks ({many.setup.get('nodes', 1)} "
            f"node(s)); model {many.setup.get('model')}, batch {many.setup.get('batch_size')} per rank, "
            f"workers {one.setup.get('workers')} -> {many.setup.get('workers')} per rank")
    return f"{head}\n\n{grid(COLUMNS, body)}"


def markdown(one: SuiteResult, many: SuiteResult, body: list[list[str]], a: str, b: str) -> str:
    return "\n".join([
        owned.SCALING_TITLE, "", f"- ONE: `{a}` ({world(one)} rank(s))",
        f"- MANY: `{b}` ({world(many)} ranks, {many.setup.get('nodes', 1)} node(s))",
        f"- model {many.setup.get('model')}, batch {many.setup.get('batch_size')} per rank, workers per "
        f"rank {one.setup.get('workers')} (ONE) and {many.setup.get('workers')} (MANY)",
        "- speed-up = MANY / ONE samples/s (the jobs' totals); efficiency = speed-up / rank "
        "ratio = MANY per rank / ONE per rank; [low, high] from the repeats' extremes", "",
        md_table(COLUMNS, body)])


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__, formatter_class=cli.HelpFormatter)
    p.add_argument("one", metavar="ONE", help="results.json (or its folder) with fewer ranks")
    p.add_argument("many", metavar="MANY", help="results.json (or its folder) with more ranks")
    p.add_argument("--force", action="store_true",
                   help="compare runs whose setups differ in more than the rank count")
    p.add_argument("--out", default=None, help="also write the table as markdown here")
    a = p.parse_args(argv)
    try:
        (one_at, one), (many_at, many) = read(a.one, "ONE"), read(a.many, "MANY")
        if world(many) <= world(one):
            raise ValueError(f"MANY {a.many!r} ran {world(many)} rank(s), ONE {a.one!r} "
                             f"{world(one)}: MANY must have more")
        diff = comparable(one, many, a.force, ignore=("world_size",),
                          why="the runs differ in more than the rank count")
        if a.out:  # never over the results it reads, nor a file of another's
            owned.check_out(Path(a.out).parent, "--out", [Path(a.out).name], [one_at, many_at], "scaling.md")
    except ValueError as e:
        return cli.fail(PROG, e)
    for d in diff:
        print(f"note: differs: {d}")
    body = rows(one, many)
    if not body:
        return cli.fail(PROG, "the runs share no variant label")
    print(render(one, many, body))
    if a.out:
        Path(a.out).write_text(markdown(one, many, body, a.one, a.many))
        print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
