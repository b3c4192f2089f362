"""``python -m compare plot RESULTS.json [--out DIR]``: draw a run's PNG plots from its ``results.json``.

``throughput.png`` (samples/s and GPU idle % per variant) and ``timeline.png`` (data wait per
step of the first repeat); matplotlib is imported only to draw. Errors are one line naming the
argument, exit status 2 (1 for a missing matplotlib).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import cli, owned
from .results import SuiteResult

PROG = "python -m compare plot"
FILES = ("throughput.png", "timeline.png")


class MatplotlibMissing(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency of the project
        raise MatplotlibMissing(
            "matplotlib is not installed: pip install 'matplotlib>=3.6' to draw the plots") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(res: SuiteResult, out: Path) -> list[Path]:
    """Write ``FILES`` for ``res`` into the existing folder ``out``; return their paths."""
    plt = _pyplot()
    out = Path(out)
    labels = [res.row_label(v) for v in res.variants]
    med = [v.median("samples_per_s") for v in res.variants]
    err = [v.spread("samples_per_s") / 2 for v in res.variants]
    idle = [v.median("idle_pct") for v in res.variants]
    if res.on_gpu:
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    else:  # no GPU timed: no idle panel (report.CPU_ONLY)
        fig, a = plt.subplots(1, 1, figsize=(7, 4.2))
        b = None
    a.bar(labels, med, yerr=err, color="#4878d0", capsize=4)
    if res.ceiling is not None:
        c = res.ceiling.median("samples_per_s")
        a.axhline(c, color="k", ls="--", lw=1)
        a.text(max(len(labels), 1) - 0.5, c, f"ceiling {c:.0f}", ha="right", va="bottom", fontsize=8)
    a.set_ylabel("samples/s (median, ± half range)")
    a.set_title(f"Training throughput: {res.setup.get('model')}, batch {res.setup.get('batch_size')}")
    if b is not None:
        b.bar(labels, idle, color="#ee854a")
        b.set_ylim(0, 100)
        b.set_ylabel("GPU idle % (compute stream)")
        b.set_title("GPU idle (lower is better)")
    for ax in (a, b) if b is not None else (a,):
        ax.tick_params(axis="x", rotation=20)
    where = (res.env.get("gpu") or "GPU") if res.on_gpu else (
        "CPU only: these numbers do not predict GPU ones")
    fig.suptitle(f"{where} · {res.env.get('cpu_count')} CPU cores", fontsize=9)
    fig.tight_layout()
    p1 = out / FILES[0]
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(12, 3.8))
    drawn = 0
    for v in res.variants:
        if v.repeats and v.repeats[0].waits_ms:
            ax.plot(v.repeats[0].waits_ms, label=v.label, lw=1)
            drawn += 1
    ax.set_xlabel("timed step (first repeat)")
    ax.set_ylabel("data wait (ms)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title("Host time blocked in next(loader), per step")
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no per-step data waits recorded", ha="center", va="center",
                transform=ax.transAxes)
    fig.tight_layout()
    p2 = out / FILES[1]
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Draw throughput.png and timeline.png from a suite results.json "
                    "(as python -m compare writes them) and print the paths written.")
    p.add_argument("results", metavar="RESULTS.json",
                   help="a results.json written by python -m compare, or the folder holding it")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="folder for the PNGs, created if missing (default: the folder of RESULTS.json)")
    return p


def read(arg: str, label: str = "RESULTS.json:") -> tuple[Path, SuiteResult]:
    """A results argument (a file or its folder): its path and run; a one-line ``ValueError``."""
    src = Path(arg) / "results.json" if Path(arg).is_dir() else Path(arg)
    if not src.is_file():
        raise ValueError(f"{label} {arg!r} is not a results.json (or a folder holding one)")
    try:
        return src, SuiteResult.load(src)
    except ValueError as e:
        raise ValueError(f"{label} {arg!r} is {e}") from None
    except OSError as e:
        raise ValueError(f"{label} cannot read {arg!r} ({e.strerror or e})") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m compare plot``; ``argv`` excludes the word ``plot``."""
    a = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        src, res = read(a.results)
        out = Path(a.out) if a.out is not None else src.parent
        owned.check_out(out, "--out", FILES)  # never over a PNG of another's
        out.mkdir(parents=True, exist_ok=True)
    except ValueError as e:
        return cli.fail(PROG, e)
    except OSError as e:
        return cli.fail(PROG, f"--out: cannot create folder {str(out)!r} ({e.strerror or e})")
    try:
        written = plots(res, out)
    except MatplotlibMissing as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        return cli.fail(PROG, f"--out: cannot write into {str(out)!r} ({e.strerror or e})")
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
