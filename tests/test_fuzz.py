"""tools.fuzz: the mutations do what they say, the corpus is reproducible, and a fixed-seed run
over every backend x policy keeps every loader invariant (NOTE [fuzz invariants])."""
import hashlib
import io
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from utils import jpeg

from pipelines import dali_available
from pipelines.sources.folder import list_samples
from pipelines.sources.validate import jpeg_size
from tools import fuzz
from tools.fuzz import mutations


def _png(w: int = 48, h: int = 40, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


SEEDS = {"jpeg": jpeg(48, 40), "progressive": jpeg(64, 48, seed=1, progressive=True),
         "png": _png()}


def _kinds(kind, n=12):
    """``n`` mutations of ``kind`` on every seed: ``(seed bytes, new bytes, description)``."""
    for name, data in SEEDS.items():
        for i in range(n):
            out, desc, k = fuzz.mutate_kind(data, np.random.default_rng((7, i)), kind)
            assert k == kind and out != data, (name, desc)
            yield data, out, desc


def test_bitflips_flip_1_to_8_bits_at_the_named_offsets():
    for kind in ("bitflip", "header bitflip"):
        for data, out, desc in _kinds(kind):
            offs = [int(o) for o in re.search(r"@([\d,]+)", desc).group(1).split(",")]
            diff = [i for i in range(len(data)) if data[i] != out[i]]
            assert len(out) == len(data) and diff == offs, desc
            bits = sum(bin(data[i] ^ out[i]).count("1") for i in diff)
            assert 1 <= bits <= 8, desc
            if kind == "header bitflip":  # only before the scan / the image data
                assert max(offs) < mutations._header_end(data), desc
                assert re.search(r"\((\w+,?)+\)$", desc), desc


def test_truncate_insert_delete_do_what_they_say():
    for data, out, desc in _kinds("truncate"):
        cut = int(re.search(r"\((\d+) of (\d+) bytes\)", desc).group(1))
        assert out == data[:cut] and 0 < cut < len(data), desc
        assert desc.startswith(f"truncate@{cut / len(data):.2f}")
    for data, out, desc in _kinds("insert"):
        n, pos = map(int, re.match(r"insert (\d+) bytes@(\d+)", desc).groups())
        assert len(out) == len(data) + n and out[:pos] + out[pos + n:] == data, desc
        if desc.endswith("(FF)"):
            assert out[pos:pos + n] == b"\xff" * n
    for data, out, desc in _kinds("delete"):
        n, pos = map(int, re.match(r"delete (\d+) bytes@(\d+)", desc).groups())
        assert out == data[:pos] + data[pos + n:], desc


def test_duplicate_repeats_one_segment_or_chunk_in_place():
    for data, out, desc in _kinds("duplicate"):
        if mutations._is_png(data):
            typ = desc.rsplit(" ", 1)[1].encode()
            before = [t for _, t, _ in mutations._png_chunks(data)]
            after = [t for _, t, _ in mutations._png_chunks(out)]
            assert after.count(typ) == before.count(typ) + 1 or typ == b"IEND", desc
        else:
            m = re.match(r"duplicate marker FF([0-9A-F]{2})@(\d+)", desc)
            marker, off = int(m.group(1), 16), int(m.group(2))
            seg = next(n for o, mk, n in mutations._jpeg_segments(data) if o == off)
            assert data[off + 1] == marker
            assert out == data[:off + seg] + data[off:off + seg] + data[off + seg:], desc


def test_dimension_edits_read_back():
    for data, out, desc in _kinds("dimension", n=20):
        if mutations._is_png(data):
            m = re.match(r"PNG (width|height) (\d+) \(IHDR(, stale CRC)?\)", desc)
            w, h = struct.unpack(">II", out[16:24])
            assert (w if m.group(1) == "width" else h) == int(m.group(2)), desc
            crc_ok = struct.unpack(">I", out[29:33])[0] == zlib.crc32(out[12:29])
            assert crc_ok == (m.group(3) is None), desc
        else:
            m = re.match(r"(width|height) (\d+) \(SOF\d\)", desc)
            w, h = jpeg_size(out)
            w0, h0 = jpeg_size(data)
            new = int(m.group(2))
            assert (w, h) == ((new, h0) if m.group(1) == "width" else (w0, new)), desc


def test_trailing_data_is_appended_after_the_end():
    sizes = {"1 bytes": 1, "17 bytes": 17, "1 KiB": 1024, "4 KiB": 4096, "64 KiB": 65536}
    for data, out, desc in _kinds("trailing"):
        assert out.startswith(data), desc
        if "copy" in desc:
            assert out == data + data
        else:
            size = re.match(r"trailing (\d+ \w+)", desc).group(1)
            assert len(out) - len(data) == sizes[size], desc
            if desc.endswith("zeros"):
                assert set(out[len(data):]) == {0}


def test_mutate_is_deterministic_covers_every_kind_and_refuses_junk():
    for data in SEEDS.values():
        a = [fuzz.mutate(data, np.random.default_rng((3, i))) for i in range(60)]
        b = [fuzz.mutate(data, np.random.default_rng((3, i))) for i in range(60)]
        assert a == b
    kinds = {fuzz.mutate_kind(SEEDS["jpeg"], np.random.default_rng(i))[2] for i in range(200)}
    assert kinds == set(fuzz.MUTATIONS)
    with pytest.raises(ValueError, match="JPEG or PNG"):
        fuzz.mutate(b"hello, not an image" * 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="kind="):
        fuzz.mutate_kind(SEEDS["jpeg"], np.random.default_rng(0), "nope")


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.jpg")):
        h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_corpus_is_deterministic_and_listable(tmp_path):
    a = fuzz.make_corpus(tmp_path / "a", 24, seed=5)
    b = fuzz.make_corpus(tmp_path / "b", 24, seed=5)
    assert a == b and _digest(tmp_path / "a") == _digest(tmp_path / "b")
    paths = list_samples(tmp_path / "a")[0]
    assert sorted(Path(p).relative_to(tmp_path / "a").as_posix() for p in paths) == \
        [r["file"] for r in a]
    assert len(a) == 24 + fuzz.GOOD_FILES and all(r["file"].endswith(".jpg") for r in a)
    assert {r["seed_kind"] for r in a} == {"jpeg", "png"}
    c = fuzz.make_corpus(tmp_path / "a", 24, seed=6)  # an earlier corpus is replaced
    assert c != a and _digest(tmp_path / "a") != _digest(tmp_path / "b")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a fuzz corpus"):
        fuzz.make_corpus(tmp_path / "mine", 4, seed=0)


def test_evaluate_measures_agreement_and_flags_skip_error_differences():
    recs = [{"file": f"c/{n}.jpg", "case": i, "seed_kind": "jpeg", "seed_file": "s",
             "kind": "bitflip", "mutation": f"bitflip@{i}"} for i, n in enumerate("abc")]

    def run(backend, policy, decoded, bad):
        return {"backend": backend, "policy": policy, "files": [r["file"] for r in recs],
                "decoded": decoded, "bad": {str(k): "why" for k in bad}, "crash": {},
                "failures": [], "complete": True}

    runs = [run("x", "skip", [0, 1], [2]), run("x", "error", [0], [1, 2]),
            run("y", "skip", [0], [1, 2]), run("y", "error", [0], [1, 2])]
    ev = fuzz.evaluate(recs, runs)
    assert ev["agreement"] == {"agree": 2, "compared": 3, "rate": 2 / 3}
    assert [d["file"] for d in ev["disagreements"]] == ["c/b.jpg"]
    f, g = ev["invariant_failures"]
    assert (f["backend"], f["policy"], f["file"], f["mutation"]) == \
        ("x", "skip/error", "c/b.jpg", "bitflip@1")
    # one verdict per file: backends that disagree are a failure too, naming the file
    assert (g["backend"], g["policy"], g["file"], g["mutation"]) == \
        ("x,y", "verdict", "c/b.jpg", "bitflip@1")
    assert "backends disagree" in g["error"] and "x: decoded" in g["error"]
    agreeing = [run("x", p, [0], [1, 2]) for p in ("skip", "error")] + runs[2:]
    assert fuzz.evaluate(recs, agreeing)["invariant_failures"] == []


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_crashing_file_is_pinned_down_and_the_search_goes_on(tiny_root, tmp_path, policy,
                                                               monkeypatch):
    """A decoder that segfaults on one file (in a worker, or in the main process when the loader
    probes its first files): that file gets the ``crash`` verdict and a failure naming it, every
    other file still gets its verdict. The epochs are forks of this process, so they see the
    patched decoder."""
    import os
    import signal

    from pipelines.torch_backend import dataset

    paths = list_samples(tiny_root)[0]
    victims = {Path(paths[k]).read_bytes() for k in (2, 21)}
    real = dataset.decode_rgb

    def decode(data):
        if bytes(data) in victims:
            os.kill(os.getpid(), signal.SIGSEGV)
        return real(data)

    monkeypatch.setattr(dataset, "decode_rgb", decode)
    real_pil = dataset.pil_image  # pageable's decoder (Decoder.PIL)

    def decode_pil(data):
        if bytes(data) in victims:
            os.kill(os.getpid(), signal.SIGSEGV)
        return real_pil(data)

    monkeypatch.setattr(dataset, "pil_image", decode_pil)
    d = fuzz.Driver("pageable", str(tiny_root), tmp_path, epoch_timeout=30, max_crashes=5)
    d.run_skip() if policy == "skip" else d.run_error()
    assert d.complete and sorted(d.crash) == [2, 21] and d.bad == {}
    assert d.decoded == [k for k in range(len(paths)) if k not in (2, 21)]
    assert sorted(f["file"] for f in d.failures) == sorted(d.rel(k) for k in (2, 21))
    assert all(f["error"] for f in d.failures)  # SIGSEGV, "worker exited unexpectedly", ...


@pytest.mark.parametrize("argv, want", [
    (["--cases", "0", "--out", "X"], "--cases 0"),
    (["--cases", "many", "--out", "X"], "--cases"),
    (["--out", "X", "--backends", "pageable,nope"], "nope"),
    (["--out", "X", "--timeout", "-1"], "--timeout"),
    (["--cases", "3"], "--out"),
    (["--out", "X", "--bogus"], "--bogus"),
])
def test_cli_bad_arguments_give_one_line_and_exit_2(argv, want, tmp_path, capsys):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    assert fuzz.main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fuzz: error: ") and want in lines[0], cap.err
    assert cap.out == "" and not (tmp_path / "X").exists()


@pytest.mark.slow
def test_fixed_seed_run_keeps_every_invariant_on_every_backend(tmp_path, capsys):
    """40 cases (every mutation kind, 5 of each on average) x (pageable, pinned, dali when
    installed) x (skip, error), through the CLI; one verdict per file among them."""
    backends = ["pageable", "pinned"] + (["dali"] if dali_available() else [])
    code = fuzz.main(["--cases", "40", "--seed", "0", "--out", str(tmp_path),
                      "--backends", ",".join(backends), "--timeout", "400",
                      "--max-crashes", "2"])
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "fuzz.json").read_text())
    assert result["invariant_failures"] == [] and code == 0, out
    files = [r["file"] for r in result["records"]]
    assert len(files) == 40 + fuzz.GOOD_FILES and result["good_rejected"] == [], out
    assert {r["kind"] for r in result["records"]} == {"none", *mutations.MUTATIONS}  # all kinds
    for r in result["runs"]:  # every file got exactly one verdict from every run
        got = sorted([r["files"][k] for k in r["decoded"]]
                     + [r["files"][int(k)] for k in (*r["bad"], *r["crash"])])
        assert r["complete"] and got == sorted(files), (r["backend"], r["policy"])
    assert "agreement:" in out and f"{result['agreement']['agree']}/" in out
    assert result["disagreements"] == [] and result["agreement"]["rate"] == 1.0, out
    # deterministic in what it checks: the same corpus bytes and the same skip verdicts again
    again = tmp_path / "again"
    assert fuzz.make_corpus(again, 40, seed=0) == \
        [{k: v for k, v in r.items() if k != "verdicts"} for r in result["records"]]
    assert _digest(again) == _digest(tmp_path / "corpus")
    for b in backends[-1:]:  # dali where installed: its verdicts come from its own threads
        rerun = fuzz.run_backend(b, again, "skip", timeout=300)
        first = next(r for r in result["runs"] if (r["backend"], r["policy"]) == (b, "skip"))
        assert rerun["failures"] == [] and rerun["files"] == first["files"], b
        assert rerun["decoded"] == first["decoded"], b
        assert _reasons(rerun["bad"]) == _reasons(first["bad"]), b


def _reasons(bad):
    """Reasons without object addresses (PIL names its ``BytesIO`` in some)."""
    return {k: re.sub(r"0x[0-9a-f]+", "0x…", r) for k, r in bad.items()}
