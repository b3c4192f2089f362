"""Budgets that keep the README a guide and docs/results an index (issue 42).

The README stays at most 250 lines, without commit hashes or CI timings; docs/results stays at
most 1 MB with one short README per machine; the installed ``compare`` package stays at most 5,000
lines; and every relative link in the README and under docs/ resolves, anchors included. Each test
names what to do when it fails.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"

README_MAX_LINES = 250
RESULTS_MAX_BYTES = 1024 * 1024  # `du -s --apparent-size` of docs/results, in bytes
MACHINE_README_MAX_LINES = 100
RESULTS_INDEX_MAX_LINES = 40
COMPARE_MAX_LINES = 5000  # every line of compare/**/*.py (the suite, smaller than the library)
DIR_BYTES = 4096  # what a directory adds to `du --apparent-size` on ext4, counted the same everywhere

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks (a link or heading inside one is not one)."""
    return FENCE.sub("", text)


def _markdown_pages() -> list[Path]:
    return [README] + sorted(DOCS.rglob("*.md"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def test_readme_is_at_most_250_lines():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (budget {README_MAX_LINES}): move a topic to a page in docs/")


# A commit hash as prose writes one: 7-40 hex digits, with a digit and a letter, as a word of its
# own, in backticks, in parentheses, or bare.
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")


def test_readme_has_no_commit_hashes():
    found = sorted(set(HASH.findall(README.read_text())))
    assert not found, (
        f"README.md names commits {found}: a result's commit belongs in its folder under "
        "docs/results (command.txt), not in the guide")


def test_the_hash_pattern_finds_hashes_and_spares_figures():
    text = "fixed in 5dc4ef0 (`c575c0a`); 8000 images, 1e-3, a7be2cc0d1e2, 4604 ±12, deadbeef, x/ab12cd3"
    assert HASH.findall(text) == ["5dc4ef0", "c575c0a", "a7be2cc0d1e2"]


# CI and test-run timings: a pytest tally ("1241 passed"), a duration in minutes and seconds
# ("9 min 44 s", "9m44s", "0:06:54"), or seconds said of a test run ("in 414.00s").
TIMING = re.compile(
    r"\b\d+ (?:passed|failed|skipped|errors?|deselected)\b"
    r"|\b\d+\s*min(?:utes?)?\s*\d+\s*s(?:ec(?:onds?)?)?\b"
    r"|\b\d+m\s?\d+s\b"
    r"|\b\d+:\d\d:\d\d\b"
    r"|\bin \d+(?:\.\d+)?\s?s\b",
    re.I)


def test_readme_has_no_ci_timings():
    found = [m.group(0) for m in TIMING.finditer(README.read_text())]
    assert not found, f"README.md quotes test or CI timings {found}: they go stale; leave them out"


def test_the_timing_pattern_finds_timings_and_spares_figures():
    text = ("1241 passed, 284 skipped in 414.00s (0:06:54); took 9 min 44 s, 9m44s. "
            "4604 samples/s, 0.44 s from the cache, batch 256, 3 repeats")
    assert [m.group(0) for m in TIMING.finditer(text)] == [
        "1241 passed", "284 skipped", "in 414.00s", "0:06:54", "9 min 44 s", "9m44s"]


def _apparent_size(folder: Path) -> int:
    """Bytes as `du -s --apparent-size` gives them on ext4: every file's size, 4096 a folder."""
    total = DIR_BYTES
    for p in folder.rglob("*"):
        total += DIR_BYTES if p.is_dir() and not p.is_symlink() else p.lstat().st_size
    return total


def test_docs_results_is_at_most_1_mb():
    size = _apparent_size(RESULTS)
    assert size <= RESULTS_MAX_BYTES, (
        f"docs/results holds {size:,} bytes (budget {RESULTS_MAX_BYTES:,}): delete superseded "
        "runs (git keeps them) and raw logs that a results.json or summary.md repeats")


def test_each_machine_has_a_short_readme():
    machines = sorted(p for p in RESULTS.iterdir() if p.is_dir())
    assert machines
    for machine in machines:
        readme = machine / "README.md"
        assert readme.is_file(), f"{_rel(machine)} has no README.md: one index per machine"
        n = len(readme.read_text().splitlines())
        assert n <= MACHINE_README_MAX_LINES, (
            f"{_rel(readme)} has {n} lines (budget {MACHINE_README_MAX_LINES}): keep the current "
            "table, its command and one short entry per cited folder; history stays in git")


def test_the_results_index_is_short():
    n = len((RESULTS / "README.md").read_text().splitlines())
    assert n <= RESULTS_INDEX_MAX_LINES, f"docs/results/README.md has {n} lines"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped except - and _, spaces to -."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _prose(page.read_text())
    out, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        s = _slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    out.update(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", text))
    return out


# Inline links and images, [text](target "title"), and reference definitions, [label]: target
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def _links(page: Path) -> list[str]:
    text = _prose(page.read_text())
    return [m.group(1) for m in INLINE.finditer(text)] + REFDEF.findall(text)


def _broken(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
        return None  # http:, https:, mailto: ...
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{_rel(page)}: {target} (no such file or folder)"
    if anchor:
        doc = dest / "README.md" if dest.is_dir() else dest
        if doc.suffix == ".md" and doc.is_file() and anchor not in _anchors(doc):
            return f"{_rel(page)}: {target} (no heading #{anchor} in {_rel(doc)})"
    return None


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = _markdown_pages()
    links = [(page, t) for page in pages for t in _links(page)]
    assert len(links) > 20, "the link pattern found too few links to be checking anything"
    broken = [b for page, t in links if (b := _broken(page, t))]
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("target, ok", [
    ("b.md", True), ("sub/", True), ("sub", True), ("nowhere.md", False),
    ("b.md#two-words-here", True), ("b.md#two-words-here-1", True), ("b.md#missing", False),
    ("sub/#in-the-folder", True), ("#top", True), ("#bottom", False),
    ("https://example.com/x", True), ("mailto:a@b.c", True)])
def test_the_link_check_tells_a_broken_link(tmp_path, target, ok):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "README.md").write_text("# In `the` folder\n")
    (tmp_path / "b.md").write_text("## Two words, here\n\n## Two words: here\n\n```\n# missing\n```\n")
    page = tmp_path / "a.md"
    page.write_text(f"# Top\n\n[x]({target})\n")
    assert _links(page) == [target]
    assert (_broken(page, target) is None) is ok


def test_the_compare_package_is_at_most_5000_lines():
    n = sum(len(p.read_text().splitlines()) for p in (ROOT / "compare").rglob("*.py"))
    assert n <= COMPARE_MAX_LINES, (
        f"compare/ has {n} lines of Python (budget {COMPARE_MAX_LINES}): move a developer tool to "
        "tools/, or fold a probe's code into its one file under compare/probes/")
