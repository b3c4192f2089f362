"""Bad input: corpus x backends x policies (DALI in CPU mode). Nothing is lost silently."""
import json
import warnings
from pathlib import Path

import pytest
import torch

from data_gen.bad_inputs import BAD_MANIFEST, make_bad_inputs
from pipelines import AugmentSpec, BadFileError, LoaderConfig, create_loader
from pipelines.epoch_plan import epoch_batches
from pipelines.sources.validate import check_image_bytes

BACKENDS = ["pageable", "pinned", pytest.param("dali", marks=pytest.mark.dali)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # cuda: DALI mixed decode, pinned


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("bad")
    make_bad_inputs(out)
    return out


def _manifest(root):
    return json.loads((Path(root) / BAD_MANIFEST).read_text())


def _cfg(root, **kw):
    base = dict(root=root, batch_size=4, device="cpu", num_workers=0, shuffle=False,
                augment=AugmentSpec(mode="eval", size=32, resize_size=32), debug_indices=True)
    base.update(kw)
    return LoaderConfig(**base)


def test_validator_classifies_the_corpus(corpus):
    for rel, f in _manifest(corpus)["files"].items():
        reason = check_image_bytes((corpus / rel).read_bytes())
        assert (reason is not None) == (f["expect"] == "bad"), (rel, reason)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_error_policy_raises_one_clear_error_naming_the_file(corpus, backend, workers, device):
    bad = {Path(p).name for p in _manifest(corpus)["bad"]}
    with create_loader(backend, _cfg(corpus, num_workers=workers, device=device)) as ld:
        with pytest.raises(BadFileError) as ei:
            for _ in ld:
                pass
    msg = str(ei.value)
    assert any(n in msg for n in bad), msg
    assert "on_bad_file='skip'" in msg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_skip_policy_counts_names_and_keeps_batch_sizes(corpus, backend, policy, device):
    m = _manifest(corpus)
    n = len(m["files"])
    with create_loader(backend, _cfg(corpus, on_bad_file="skip", last_batch=policy,
                                     device=device)) as ld:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            sizes = [len(y) for _, y in ld]
        st = ld.stats
        # expected: the shared plan, minus batches whose files are all bad (dropped, counted)
        paths = sorted(str(p) for p in corpus.glob("class_*/*.jpg"))
        is_bad = [Path(p).relative_to(corpus).as_posix() in set(m["bad"]) for p in paths]
        plan = epoch_batches(n, batch_size=4, seed=0, epoch=0, shuffle=False, policy=ld.config.last_batch)
        kept = [len(b) for b in plan if not all(is_bad[i] for i in b)]
        assert sizes == kept and st["dropped_batches"] == len(plan) - len(kept)
        assert len(sizes) == len(ld) - st["dropped_batches"]
        if policy != "partial":
            assert all(s == 4 for s in sizes)
        in_plan = sorted({Path(paths[i]).relative_to(corpus).as_posix()
                          for b in plan for i in b if is_bad[i]})
        assert st["bad_files"] == len(in_plan) >= 2  # 'drop' never reads the last two files
        assert sorted(Path(p).relative_to(corpus).as_posix() for p, _ in st["bad"]) == in_plan
        # replaced samples are good ones from the same batch: no bad index is ever yielded
        yielded = {Path(paths[i]).relative_to(corpus).as_posix() for i in ld.last_indices}
        assert not yielded & set(m["bad"])
    msgs = [str(x.message) for x in w if "bad files" in str(x.message)]
    assert len(msgs) == 1 and f"skipped {len(in_plan)} bad files" in msgs[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_unusual_valid_files_decode_to_correct_rgb(corpus, backend, device):
    valid = [r for r, f in _manifest(corpus)["files"].items()
             if f["expect"] == "valid" and f["kind"] != "generated JPEG"]
    root = corpus.parent / f"valid_{backend}_{device}"
    (root / "c").mkdir(parents=True, exist_ok=True)
    for r in valid:
        (root / "c" / Path(r).name).write_bytes((corpus / r).read_bytes())
    spec = AugmentSpec(mode="eval", size=32, resize_size=32)
    with create_loader(backend, _cfg(root, augment=spec, batch_size=len(valid), device=device)) as ld:
        x, _ = next(iter(ld))
    x = x.float().cpu()
    names = sorted(Path(r).name for r in valid)
    mean = torch.tensor(spec.mean).view(3, 1, 1)
    std = torch.tensor(spec.std).view(3, 1, 1)
    px = (x.float() * std + mean) * 255
    rot = px[names.index("exif_rotated.jpg")]
    top, bottom = rot[:, :12].mean(dim=(1, 2)), rot[:, -12:].mean(dim=(1, 2))
    assert top[0] > 150 and top[2] < 80 and bottom[2] > 150 and bottom[0] < 80  # red on top
    gray = px[names.index("grayscale.jpg")]
    assert (gray.max(dim=0).values - gray.min(dim=0).values).max() < 3  # R == G == B
    one = px[names.index("one_by_one.jpg")]
    assert one[1].mean() > 150 and one[0].mean() < 60                    # the green pixel
    cmyk, prog = px[names.index("cmyk.jpg")], px[names.index("progressive.jpg")]
    png = px[names.index("png_named.jpg")]
    assert (cmyk - png).abs().mean() < 12 and (prog - png).abs().mean() < 6


def test_bad_inputs_cli(tmp_path, capsys):
    from data_gen.__main__ import main

    assert main(["--bad-inputs", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "bomb.jpg" in out and "exif_rotated.jpg" in out


# --- where --bad-inputs writes (data_gen/outdir.py, data_gen/partial.py) ---------------------

PROBLEMS = {"truncated.jpg", "zero_bytes.jpg", "bomb.jpg", "cmyk.jpg", "bad_manifest.json"}
TINY_ARGS = ["--num-images", "6", "--classes", "2", "--width-range", "32,48", "--workers", "1",
             "--quiet"]


def _files(root):
    """``{relative path: bytes}`` of every file under ``root``."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in Path(root).rglob("*")
            if p.is_file()}


def test_the_corpus_manifest_lists_every_file_it_wrote(corpus):
    from data_gen.generate import read_manifest

    m = read_manifest(corpus)
    assert m["kind"] == "bad-inputs"
    listed = {f["path"] for f in m["files"]}
    on_disk = set(_files(corpus))
    assert on_disk == listed | {"manifest.json"}
    assert {f"class_0001/{n}" for n in ("truncated.jpg", "bomb.jpg")} | {BAD_MANIFEST} <= listed
    assert set(_manifest(corpus)["files"]) == listed - {BAD_MANIFEST}


def test_bad_inputs_over_a_dataset_refuses_unless_forced(tmp_path, capsys):
    from data_gen.__main__ import main

    d = tmp_path / "d"
    assert main(["--out", str(d), *TINY_ARGS]) == 0
    before = _files(d)
    capsys.readouterr()
    assert main(["--bad-inputs", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "dataset" in err and "--force" in err
    assert _files(d) == before and sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert main(["--bad-inputs", str(d), "--force"]) == 0
    files = _files(d)
    assert set(files) == set(_manifest(d)["files"]) | {BAD_MANIFEST, "manifest.json"}
    assert not any(files.get(p) == b for p, b in before.items() if p != "manifest.json")


def test_a_dataset_over_a_corpus_leaves_no_problem_files(tmp_path, capsys):
    from data_gen.__main__ import main
    from data_gen.generate import read_manifest

    d = tmp_path / "d"
    make_bad_inputs(d, good=4)
    before = _files(d)
    assert main(["--out", str(d), *TINY_ARGS]) == 2
    assert "bad-inputs corpus" in capsys.readouterr().err
    assert _files(d) == before
    assert main(["--out", str(d), *TINY_ARGS, "--force"]) == 0
    files = set(_files(d))
    assert files == {f["path"] for f in read_manifest(d)["files"]} | {"manifest.json"}
    assert len(files) == 7 and not {Path(p).name for p in files} & PROBLEMS


def test_regenerating_a_corpus_replaces_it_whole(tmp_path):
    d = tmp_path / "d"
    make_bad_inputs(d, good=6)
    m = make_bad_inputs(d, good=4, seed=1)  # the same kind: no force needed
    assert set(_files(d)) == set(m["files"]) | {BAD_MANIFEST, "manifest.json"}
    assert len([p for p in m["files"] if "img_" in p]) == 4


# --- one verdict per file (pipelines.sources.validate NOTE [one verdict]) --------------------

def _decoders_disagree() -> dict[str, bytes]:
    """Files on which the decoders disagree (found by ``python -m tools.fuzz``), each of which
    the byte check must refuse: ``name -> bytes``."""
    import io
    import struct
    import zlib

    from PIL import Image
    from utils import jpeg

    from pipelines.sources.validate import sof_offset

    base = jpeg(96, 64, seed=1)
    sof = sof_offset(base)
    sos = base.find(b"\xff\xda", sof)  # PIL writes the scan after the frame and the tables
    scan = sos + 2 + struct.unpack(">H", base[sos + 2:sos + 4])[0]
    mid = (scan + len(base)) // 2
    buf = io.BytesIO()
    Image.open(io.BytesIO(jpeg(40, 30))).save(buf, "PNG")
    png = buf.getvalue()
    tall = bytearray(png)
    tall[20:24] = struct.pack(">I", 60)  # twice the rows its data holds, a valid header CRC
    tall[29:33] = struct.pack(">I", zlib.crc32(bytes(tall[12:29])))
    return {
        "stray_bytes.jpg": base[:sof] + b"\x00\x00\x13" + base[sof:],  # libjpeg skips, DALI not
        "ff00_in_header.jpg": base[:sof] + b"\xff\x00" + base[sof:],
        "marker_in_scan.jpg": base[:mid] + b"\xff\x85" + base[mid:],  # DALI decodes, libjpeg not
        "com_in_scan.jpg": base[:mid] + b"\xff\xfe" + base[mid:],  # PIL decodes, torchvision not
        "second_sos.jpg": base[:scan] + base[sos:scan] + base[scan:],
        "two_ihdr.png.jpg": png[:33] + png[8:33] + png[33:],  # PIL decodes, DALI not
        "short_rows.png.jpg": bytes(tall),
    }


def _valid_variants() -> dict[str, bytes]:
    import io

    from PIL import Image
    from utils import jpeg

    buf = io.BytesIO()
    Image.open(io.BytesIO(jpeg(96, 64))).save(buf, "JPEG", restart_marker_rows=1)
    return {"restart_markers.jpg": buf.getvalue(), "progressive.jpg": jpeg(96, 64, progressive=True),
            "mpf.jpg": jpeg(96, 64) + jpeg(32, 32, seed=9), "fill.jpg": jpeg(96, 64)}


def _decodes(data: bytes) -> dict[str, bool]:
    """Whether each decoder reads ``data``: torchvision's, PIL's, and DALI's CPU one."""
    import numpy as np

    from pipelines import dali_available
    from pipelines.torch_backend.dataset import decode_rgb
    from pipelines.torch_backend.decode import pil_image

    out = {}
    for name, f in (("torchvision", decode_rgb), ("pil", pil_image)):
        try:
            f(data)
            out[name] = True
        except Exception:  # noqa: BLE001 - any refusal counts
            out[name] = False
    if dali_available():
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_pipelined=False,
                      exec_async=False, prefetch_queue_depth=1)
        def pipe():
            return fn.decoders.image(fn.external_source(name="j", dtype=types.UINT8),
                                     device="cpu", output_type=types.RGB)

        p = pipe()
        p.build()
        try:
            p.feed_input("j", [np.frombuffer(data, np.uint8)])
            p.run()
            out["dali"] = True
        except Exception:  # noqa: BLE001
            out["dali"] = False
    return out


@pytest.mark.parametrize("name", sorted(_decoders_disagree()))
def test_the_check_refuses_what_any_decoder_refuses(name):
    data = _decoders_disagree()[name]
    reason = check_image_bytes(data)
    assert reason is not None and "\n" not in reason, name
    got = _decodes(data)
    assert not all(got.values()), (name, got)  # some decoder refuses it: so must every backend


@pytest.mark.parametrize("name", sorted(_valid_variants()))
def test_valid_variants_pass_the_check_and_every_decoder(name):
    data = _valid_variants()[name]
    if name == "fill.jpg":
        from pipelines.sources.validate import sof_offset

        i = sof_offset(data)
        data = data[:i] + b"\xff" * 7 + data[i:]
    assert check_image_bytes(data) is None, name
    assert all(_decodes(data).values()), name


@pytest.mark.slow
def test_every_backend_gives_every_file_one_verdict_under_both_policies(tmp_path):
    """The files the decoders disagree on, among good ones, through each backend's loader under
    ``skip`` and ``error`` (``tools.fuzz``'s driver, each run in a child process): the same
    bad set everywhere, exactly the disagreeing files."""
    from pipelines import dali_available
    from tools import fuzz

    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for k, (name, data) in enumerate(sorted({**_decoders_disagree(),
                                              **_valid_variants()}.items())):
        (root / ("a", "b")[k % 2] / name).write_bytes(data)
    from utils import jpeg

    for k in range(6):
        (root / ("a", "b")[k % 2] / f"good_{k}.jpg").write_bytes(jpeg(64, 48, seed=20 + k))
    backends = ["pageable", "pinned"] + (["dali"] if dali_available() else [])
    want = sorted(_decoders_disagree())
    for b in backends:
        for policy in fuzz.POLICIES:
            r = fuzz.run_backend(b, root, policy, timeout=300)
            assert r["failures"] == [] and r["crash"] == {}, (b, policy, r["failures"])
            bad = sorted(Path(r["files"][int(k)]).name for k in r["bad"])
            assert bad == want, (b, policy)
            assert len(r["decoded"]) == len(r["files"]) - len(want), (b, policy)
