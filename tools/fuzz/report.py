"""The verdicts of a suite's runs: per file, per backend (``evaluate``), and the text report
(``summary``): agreement between backends, disagreements (each also an invariant failure)
grouped by which backends differ and why, invariant failures with their reproducers."""
from __future__ import annotations

import re
from collections import Counter


def _clean(reason: str) -> str:
    """A reason's first line without a decoder's source location."""
    r = reason.splitlines()[0] if reason else ""
    return re.sub(r"\S*/(\S+\.(?:cpp|cc|c|h|py)):\d+,? ?", "", r)


def _norm(reason: str) -> str:
    """A reason without file names and numbers, to group by."""
    r = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", _clean(reason))
    r = re.sub(r"\d+", "N", re.sub(r"0x[0-9a-fA-F]+", "HEX", r))
    return re.sub(r"N(, N)+", "N", r.replace("pid(s)", "pid"))[:200]


def _verdicts(run: dict) -> dict[str, tuple[str, str]]:
    """``file -> (verdict, reason)`` of one run: ``decoded``, ``bad`` or ``crash``."""
    files = run.get("files", [])
    v = {files[k]: ("decoded", "") for k in run["decoded"]}
    v.update({files[int(k)]: ("bad", r) for k, r in run["bad"].items()})
    v.update({files[int(k)]: ("crash", r) for k, r in run.get("crash", {}).items()})
    return v


def evaluate(records: list[dict], runs: list[dict]) -> dict:
    """Per-file verdicts, the agreement rate, the disagreements and the invariant failures.

    A file's verdict for a backend is its ``skip`` verdict (its ``error`` verdict where the skip
    run did not reach it). One verdict per file: backends that disagree on a file (one decodes
    it, another calls it bad), or a backend whose ``skip`` and ``error`` verdicts differ, are
    invariant failures (``pipelines.sources.validate`` NOTE [one verdict]). Every invariant
    failure that names a file carries the file's case and mutation: the reproducer.
    """
    by_file = {r["file"]: r for r in records}
    failures = []
    for r in runs:
        for f in r["failures"]:
            rec = by_file.get(f.get("file"), {})
            failures.append({"backend": r["backend"], "policy": r["policy"], **f,
                             "case": rec.get("case"), "mutation": rec.get("mutation"),
                             "seed_file": rec.get("seed_file")})
    verdict = {(r["backend"], r["policy"]): _verdicts(r) for r in runs}
    backends = list(dict.fromkeys(r["backend"] for r in runs))
    for b in backends:  # error and skip must agree on every file
        both = [r for r in runs if r["backend"] == b and r.get("complete")]
        if len(both) < 2:
            continue  # a search that stopped early is already a failure
        s, e = verdict[(b, "skip")], verdict[(b, "error")]
        for f in sorted(set(s) | set(e)):
            vs, ve = s.get(f, ("unknown", "")), e.get(f, ("unknown", ""))
            if vs[0] != ve[0]:
                rec = by_file.get(f, {})
                failures.append({"backend": b, "policy": "skip/error", "file": f,
                                 "error": f"skip: {vs[0]} {vs[1]!r}, error: {ve[0]} {ve[1]!r}",
                                 "case": rec.get("case"), "mutation": rec.get("mutation"),
                                 "seed_file": rec.get("seed_file")})
    out_records, disagreements = [], []
    for rec in records:
        per = {}
        for b in backends:
            got = (verdict.get((b, "skip"), {}).get(rec["file"])
                   or verdict.get((b, "error"), {}).get(rec["file"]) or ("unknown", ""))
            per[b] = {"verdict": got[0], "reason": got[1], "error_policy":
                      verdict.get((b, "error"), {}).get(rec["file"], ("unknown",))[0]}
        rec = {**rec, "verdicts": per}
        out_records.append(rec)
        vs = {p["verdict"] for p in per.values()}
        if "unknown" not in vs and len(vs) > 1:
            disagreements.append(rec)
            why = "; ".join(f"{b}: {p['verdict']} {_clean(p['reason'])[:100]!r}"
                            for b, p in per.items())
            failures.append({"backend": ",".join(backends), "policy": "verdict",
                             "file": rec["file"], "error": f"backends disagree: {why}",
                             "case": rec.get("case"), "mutation": rec.get("mutation"),
                             "seed_file": rec.get("seed_file")})
    known = [r for r in out_records
             if all(p["verdict"] != "unknown" for p in r["verdicts"].values())]
    agree = len(known) - len(disagreements)
    return {"records": out_records, "disagreements": disagreements,
            "agreement": {"agree": agree, "compared": len(known),
                          "rate": agree / len(known) if known else None},
            "good_rejected": [r["file"] for r in out_records if r["kind"] == "none" and
                              any(p["verdict"] in ("bad", "crash")
                                  for p in r["verdicts"].values())],
            "invariant_failures": failures}


def _classes(disagreements: list[dict]) -> list[tuple[str, list[dict]]]:
    groups: dict[str, list[dict]] = {}
    for d in disagreements:
        by: dict[str, list[str]] = {}
        for b, p in d["verdicts"].items():
            by.setdefault(p["verdict"], []).append(b)
        key = " vs ".join(f"{','.join(bs)}={v}" for v, bs in sorted(by.items()))
        groups.setdefault(key, []).append(d)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def summary(result: dict, verbose: bool = False) -> str:
    """The short text report of a :func:`run_suite` result."""
    a, recs = result["agreement"], result["records"]
    lines = [f"fuzz: {result['cases']} cases + {len(recs) - result['cases']} good files, "
             f"seed {result['seed']}, backends {','.join(result['backends'])}, "
             f"{result['seconds']:.1f} s"]
    for r in result["runs"]:
        lines.append(f"  {r['backend']:>8}/{r['policy']:<5} {len(r['decoded']):4d} decoded "
                     f"{len(r['bad']):4d} bad {len(r.get('crash', {})):3d} crash  "
                     f"{r.get('epochs', 0):4d} epochs {r['seconds']:6.1f} s"
                     + ("" if r.get("complete") else "  INCOMPLETE"))
    rate = "n/a" if a["rate"] is None else f"{100 * a['rate']:.1f}%"
    unknown = len(recs) - a["compared"]
    lines.append(f"agreement: {a['agree']}/{a['compared']} files = {rate} "
                 f"({len(result['disagreements'])} disagreements"
                 + (f"; {unknown} files lack a verdict from some backend)" if unknown else ")"))
    if result["good_rejected"]:
        lines.append(f"untouched files not decoded: {', '.join(result['good_rejected'])}")
    for key, ds in _classes(result["disagreements"]):
        kinds = Counter(d["kind"] for d in ds).most_common(5)
        seeds = Counter(d["seed_kind"] for d in ds).most_common()
        lines.append(f"  {len(ds)} x {key}  [" + ", ".join(f"{k} {n}" for k, n in kinds)
                     + "; seeds " + ", ".join(f"{k} {n}" for k, n in seeds) + "]")
        reasons: Counter = Counter()
        for d in ds:
            by_reason: dict[str, list[str]] = {}
            for b, p in d["verdicts"].items():
                if p["verdict"] != "decoded":
                    by_reason.setdefault(_norm(p["reason"]), []).append(b)
            reasons.update((",".join(bs), why) for why, bs in by_reason.items())
        for (bs, why), n in reasons.most_common(4):
            lines.append(f"      {bs}: {n} x {why}")
        for d in ds if verbose else ds[:1]:
            why = "; ".join(f"{b}: {_clean(p['reason'])[:100]}"
                            for b, p in d["verdicts"].items() if p["reason"])
            lines.append(f"      e.g. {d['file']}  {d['mutation']}  ({d['seed_file']}) -> {why}")
    fails = result["invariant_failures"]
    pinned = {f["file"] for f in fails if f.get("file")}
    lines.append(f"invariant failures: {len(fails) or 'none'}"
                 + (f" ({len(pinned)} files pinned down)" if pinned else ""))
    groups: dict[str, list[dict]] = {}
    for f in fails:
        groups.setdefault(_norm(f["error"].split(" (from ")[0]), []).append(f)
    for key, fs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        where = Counter(f"{f['backend']}/{f['policy']}" for f in fs)
        lines.append(f"  {len(fs)} x {key}  [" + ", ".join(f"{k} {n}" for k, n in where.items())
                     + "]")
        for ex in [f for f in fs if f.get("file")][:1] or fs[:1]:
            lines.append(f"      e.g. {ex['file']} = case {ex['case']} of --seed "
                         f"{result['seed']}: {ex['mutation']} of {ex['seed_file']}"
                         if ex.get("file") else f"      e.g. {ex['error'].splitlines()[0][:300]}")
    return "\n".join(lines)
