"""The corpus: mutated files and a few untouched ones in ImageFolder layout, byte-identical for a
seed (``make_corpus``), and any one case of it again on its own (``case_bytes``, a reproducer)."""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .mutations import mutate_kind

CLASSES = 4
GOOD_FILES = 8
MARK = ".fuzz-corpus"  # the file that marks a folder as a corpus (replaced, never merged)


def _seed_files(tmp: Path, seed: int, n_jpeg: int = 24, n_png: int = 12
                ) -> list[tuple[str, str, bytes]]:
    """``(name, kind, bytes)`` of the seeds: data_gen JPEGs and PIL PNG re-encodings of some."""
    from PIL import Image

    from data_gen.generate import GenConfig, generate

    generate(GenConfig(out=str(tmp / "gen"), num_images=n_jpeg, classes=2, seed=seed,
                       width_range=(48, 128), workers=1), progress=False)
    jpegs = sorted((tmp / "gen").glob("*/*.jpg"))
    if len(jpegs) != n_jpeg:
        raise RuntimeError(f"data_gen wrote {len(jpegs)} JPEGs into {tmp / 'gen'}, "
                           f"expected {n_jpeg}")
    seeds = [(p.stem, "jpeg", p.read_bytes()) for p in jpegs]
    for k, p in enumerate(jpegs[:n_png]):
        buf = io.BytesIO()
        with Image.open(p) as im:
            im.convert(("RGB", "L", "RGBA")[k % 3]).save(buf, "PNG")
        seeds.append((f"{p.stem}_{('rgb', 'gray', 'rgba')[k % 3]}", "png", buf.getvalue()))
    return seeds


def make_corpus(out_dir: str | os.PathLike, cases: int, seed: int) -> list[dict]:
    """Write ``cases`` mutated files and a few untouched ones in ImageFolder layout.

    Seeds are small data_gen JPEGs (``width_range=(48, 128)``) and PNG re-encodings of some of
    them (RGB, gray, RGBA), every file named ``.jpg``. Case ``i`` draws its seed file and its
    mutation from ``numpy.random.default_rng((seed, i))``, so the corpus is byte-identical for
    a given ``seed`` and case ``i`` does not depend on ``cases``.

    Args:
        out_dir: the dataset root to write (``class_K/case_NNNNN.jpg``, ``class_K/good_NN.jpg``);
            it must be missing, empty or an earlier corpus (which is replaced).
        cases: mutated files.
        seed: the seed.

    Returns:
        One record per file, sorted by file: ``{"file", "case", "seed_kind", "seed_file",
        "kind", "mutation"}`` (``case`` is ``None`` and ``kind`` ``"none"`` for good files).
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not (out / MARK).exists():
            raise ValueError(f"out_dir={str(out)!r} holds files that are not a fuzz corpus; "
                             "use an empty or new folder")
        shutil.rmtree(out)
    for c in range(CLASSES):
        (out / f"class_{c}").mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text(json.dumps({"cases": cases, "seed": seed}))
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as tmp:
        seeds = _seed_files(Path(tmp), seed)
    records = []
    for j in range(GOOD_FILES):
        name, kind, data = seeds[(j * 5) % len(seeds)]
        rel = f"class_{j % CLASSES}/good_{j:02d}.jpg"
        (out / rel).write_bytes(data)
        records.append({"file": rel, "case": None, "seed_kind": kind, "seed_file": name,
                        "kind": "none", "mutation": "none (good file)"})
    for i in range(cases):
        new, rec = _case(seeds, seed, i)
        (out / rec["file"]).write_bytes(new)
        records.append(rec)
    return sorted(records, key=lambda r: r["file"])


def _case(seeds: list[tuple[str, str, bytes]], seed: int, i: int) -> tuple[bytes, dict]:
    rng = np.random.default_rng((seed, i))
    name, kind, data = seeds[int(rng.integers(0, len(seeds)))]
    new, desc, mkind = mutate_kind(data, rng)
    return new, {"file": f"class_{i % CLASSES}/case_{i:05d}.jpg", "case": i, "seed_kind": kind,
                 "seed_file": name, "kind": mkind, "mutation": desc}


def case_bytes(seed: int, case: int) -> tuple[bytes, dict]:
    """The bytes and record of one case of ``make_corpus(..., seed)``: a reproducer.

    Example:
        >>> data, rec = case_bytes(0, 20)           # doctest: +SKIP
        >>> open("/tmp/case.jpg", "wb").write(data)  # doctest: +SKIP
    """
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as tmp:
        return _case(_seed_files(Path(tmp), seed), seed, case)
