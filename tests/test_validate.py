"""The byte check accepts what real decoders accept, and refuses what they cannot decode."""
import io

import numpy as np
import pytest
import torch
from PIL import Image
from utils import jpeg

from pipelines.sources.validate import check_image_bytes, jpeg_size, sof_offset


def _decoders_read(data: bytes):
    from torchvision.io import decode_image

    Image.open(io.BytesIO(data)).convert("RGB").load()
    return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8)).shape


def _insert_before_sof(data: bytes, junk: bytes) -> bytes:
    i = sof_offset(data)
    return data[:i] + junk + data[i:]


@pytest.mark.parametrize("name, make", [
    ("motion photo: an MP4 after the JPEG", lambda d: d + b"\x00\x00\x00\x18ftypmp42" + bytes(5000)),
    ("MPF: a second JPEG after the first", lambda d: d + jpeg(32, 32, seed=9)),
    ("fill bytes 0xFF before a marker", lambda d: _insert_before_sof(d, b"\xff" * 7)),
])
def test_valid_variants_pass_and_real_decoders_agree(name, make):
    data = make(jpeg(64, 48))
    assert _decoders_read(data)[-2:] == (48, 64), name
    assert check_image_bytes(data) is None, name
    assert jpeg_size(data) == (64, 48)


def test_forged_huge_header_in_a_tiny_file_is_refused():
    data = bytearray(jpeg(16, 16))
    i = sof_offset(bytes(data))
    data[i + 5 : i + 9] = (9000).to_bytes(2, "big") * 2
    reason = check_image_bytes(bytes(data))
    assert reason is not None and "cannot hold 9000x9000" in reason


@pytest.mark.parametrize("size", [(1, 1), (4000, 3000), (17, 9)])
@pytest.mark.parametrize("progressive", [False, True])
def test_flat_images_stay_above_the_scan_size_bound(size, progressive):
    buf = io.BytesIO()
    Image.new("L", size, 0).save(buf, "JPEG", quality=1, optimize=True, progressive=progressive)
    assert check_image_bytes(buf.getvalue()) is None


def test_truncated_main_image_after_an_exif_thumbnail_is_refused():
    thumb = jpeg(16, 16, seed=3)  # its own FF D9 sits in APP1, before the main SOF
    exif = b"Exif\x00\x00" + thumb
    main = jpeg(256, 256, seed=4)
    data = main[:2] + b"\xff\xe1" + (len(exif) + 2).to_bytes(2, "big") + exif + main[2:]
    assert check_image_bytes(data) is None
    cut = data[: len(data) * 3 // 4]
    assert "no end-of-image" in check_image_bytes(cut)


def test_noise_is_not_an_image():
    assert "not a JPEG, PNG, WebP or BMP" in check_image_bytes(np.random.default_rng(0).bytes(100))


def _png(mode, size, **kw):
    buf = io.BytesIO()
    Image.new(mode, size, 0).save(buf, "PNG", **kw)
    return buf.getvalue()


def test_png_with_a_forged_height_is_refused_though_pil_loads_it():
    import struct
    import zlib

    d = bytearray(_png("RGB", (48, 40)))
    d[20:24] = struct.pack(">I", 100000)
    d[29:33] = struct.pack(">I", zlib.crc32(bytes(d[12:29])))  # a valid header CRC
    Image.open(io.BytesIO(bytes(d))).load()                    # PIL: a mostly black image
    assert "cannot hold 48x100000" in check_image_bytes(bytes(d))


@pytest.mark.parametrize("mode, size", [("RGB", (4000, 3000)), ("1", (5000, 5000)),
                                        ("P", (1000, 1000)), ("I;16", (300, 200)), ("L", (1, 1))])
def test_flat_pngs_at_the_best_deflate_ratio_pass(mode, size):
    assert check_image_bytes(_png(mode, size, optimize=True)) is None


def test_the_end_of_image_shortcut_keeps_every_verdict(tmp_path):
    """A file ending with FF D9 skips the search for the first FF D9 after the scan (it held
    the GIL for every sample the torch backends read and every file of DALI's first epoch);
    cut anywhere, with data after the image or with a second image, the verdicts are the
    search's."""
    import io

    import numpy as np
    from PIL import Image

    from pipelines.sources.validate import check_image_bytes

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(buf, "JPEG")
    jpg = buf.getvalue()
    assert jpg.endswith(b"\xff\xd9") and check_image_bytes(jpg) is None
    for cut in range(len(jpg) // 3, len(jpg) - 1, 97):  # truncated: every cut is caught
        assert "truncated" in check_image_bytes(jpg[:cut])
    assert check_image_bytes(jpg[:-2]) == "truncated JPEG (no end-of-image marker)"
    assert check_image_bytes(jpg + b"\0" * 64) is None  # padding after the image
    assert check_image_bytes(jpg + jpg) is None  # a second image (MPF)
    # a truncated first image followed by a second one: the second image's SOI is a marker
    # inside the first one's scan (NOTE [one verdict])
    assert "marker FFD8" in check_image_bytes(jpg[:len(jpg) // 2] + jpg)
