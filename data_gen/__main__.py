"""``python -m data_gen --out DIR --num-images N --classes C --seed S``; ``--format wds --out
s3://bucket/prefix`` uploads the shards (data_gen/upload.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .generate import LAYOUTS, GenConfig, generate
from .outdir import read_manifest
from .upload import generate_and_upload, is_url, parse_options


def _pair(s: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in s.replace(":", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not LO,HI") from None
    return a, b


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["convert"]:  # large photos converted once (data_gen/convert/)
        from .convert.cli import main as convert_main

        return convert_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m data_gen", description=__doc__.replace("``", ""))
    p.add_argument("--out", help="output directory (its layout: --format), or s3://bucket/prefix "
                                 "to upload tar shards (--format wds) made in a temporary folder")
    p.add_argument("--bad-inputs", metavar="DIR",
                   help="write a corpus of problem files (truncated, empty, CMYK, EXIF, bomb...) "
                        "next to good ones into DIR, instead of a dataset")
    p.add_argument("--num-images", type=int, default=1000, metavar="N",
                   help="images to write (default: 1000)")
    p.add_argument("--classes", type=int, default=10, metavar="C",
                   help="classes, the images spread evenly over them (default: 10)")
    p.add_argument("--seed", type=int, default=0,
                   help="the same seed and options write the same files (default: 0)")
    p.add_argument("--width-range", type=_pair, default=(300, 800), metavar="LO,HI",
                   help="image widths in pixels, inclusive, drawn uniformly (default: 300,800)")
    p.add_argument("--quality-range", type=_pair, default=(75, 95), metavar="LO,HI",
                   help="JPEG quality range, inclusive (default: 75,95)")
    p.add_argument("--format", choices=LAYOUTS, default="folder", dest="layout",
                   help="folder: ImageFolder layout; list: a flat images/ folder plus "
                        "labels.csv (a file-list dataset: --data OUT/labels.csv); wds: WebDataset "
                        "tar shards OUT/shard-NNNNNN.tar in a seeded shuffled order, each "
                        "sample KEY.jpg|png|webp|bmp and KEY.cls")
    p.add_argument("--shard-size", type=int, default=None, metavar="K",
                   help="samples per shard with --format wds (the last shard holds the rest; "
                        "default: 1000); refused with any other --format")
    p.add_argument("--target", choices=("class", "multilabel", "regression"), default="class",
                   help="with --format list or wds, what else each sample carries: multilabel "
                        "(a labels column of class names joined by ';', or KEY.txt of class ids) "
                        "or regression (width and height columns, or KEY.json keys); load with "
                        "target='multilabel' or target=('width', 'height')")
    p.add_argument("--mix-formats", action="store_true",
                   help="write some images as PNG, WebP and BMP among the JPEGs")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--force", action="store_true",
                   help="write beside files data_gen did not write (they stay), or replace a "
                        "data_gen output of the other kind (dataset / bad-inputs corpus)")
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="with --out s3://..., a keyword argument of s3fs.S3FileSystem (e.g. "
                        "endpoint_url=http://127.0.0.1:9000); else the AWS environment")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (there is none either when stdout is not a terminal, "
                        "unless GPU_FEED_PROGRESS=1)")
    a = p.parse_args(argv)
    if not a.bad_inputs and not a.out:
        p.error("--out is required (or --bad-inputs DIR)")
    if a.bad_inputs and is_url(a.bad_inputs):
        print(f"data_gen: error: --bad-inputs {a.bad_inputs!r}: takes a folder, not a URL",
              file=sys.stderr)
        return 2
    if a.storage_option and not (a.out and is_url(a.out)):
        print("data_gen: error: --storage-option applies only to --out s3://bucket/prefix",
              file=sys.stderr)
        return 2
    if a.shard_size is not None and (a.bad_inputs or a.layout != "wds"):
        what = "--bad-inputs" if a.bad_inputs else f"--format {a.layout}"
        print(f"data_gen: error: --shard-size applies only to --format wds (tar shards), not "
              f"{what}; add --format wds or drop --shard-size", file=sys.stderr)
        return 2
    t = time.perf_counter()
    earlier = None if a.bad_inputs or is_url(a.out) else read_manifest(a.out)
    try:
        if a.bad_inputs:
            from .bad_inputs import make_bad_inputs

            m = make_bad_inputs(a.bad_inputs, seed=a.seed, force=a.force)
        else:
            cfg = GenConfig(
                out=a.out, num_images=a.num_images, classes=a.classes, seed=a.seed,
                width_range=a.width_range, quality_range=a.quality_range, workers=a.workers,
                force=a.force, mix_formats=a.mix_formats, layout=a.layout, target=a.target,
                **({} if a.shard_size is None else {"shard_size": a.shard_size}),
            )
            progress = False if a.quiet else None
            if is_url(a.out):
                m = generate_and_upload(cfg, parse_options(a.storage_option), progress)
            else:
                m = generate(cfg, progress=progress)
    except (ValueError, OSError, ImportError) as e:  # user errors, unwritable folders: one line
        print(f"data_gen: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("data_gen: interrupted; the same command resumes where it stopped", file=sys.stderr)
        return 130
    if a.bad_inputs:
        for rel, f in m["files"].items():
            if f["kind"] != "generated JPEG":
                print(f"{f['expect']:5s}  {rel:32s} {f['kind']}")
        return 0
    dt = time.perf_counter() - t
    root = {"root": m["root"]} if "root" in m else {}
    if earlier is not None and earlier.get("args") != json.loads(json.dumps(m.get("args"))):
        n = (earlier.get("stats") or {}).get("num_images", "?")
        root["replaced"] = (f"the earlier data_gen output of {n} images there, made with other "
                            "arguments")
    print(json.dumps({"out": a.out, **root, "seconds": round(dt, 2), **m["stats"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
