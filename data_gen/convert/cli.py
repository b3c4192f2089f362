"""``python -m data_gen convert SRC --out DST [--max-side 512] [--quality 90] ...``."""
from __future__ import annotations

import argparse
import json
import sys

from .run import ConvertConfig, convert


def _target(s: str) -> object:
    return s if s in ("class", "multilabel", "none") else tuple(s.split(","))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_gen convert",
        description="Convert a dataset of large photos once into tar shards of photos with a "
                    "maximum side, which the loaders read as any dataset (--data DST).")
    p.add_argument("src", help="any dataset root the loader reads: a folder, a file list, tar "
                               "shards (a .tar, a pattern, a folder of them) or remote shards")
    p.add_argument("--out", required=True,
                   help="output folder: new, empty, or an interrupted run's (it resumes)")
    p.add_argument("--max-side", type=int, default=512, metavar="PX",
                   help="longer side of a converted photo; smaller ones keep their bytes "
                        "(default: 512)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default: 90)")
    p.add_argument("--shard-size", type=int, default=1000, metavar="K",
                   help="samples per output shard (default: 1000)")
    p.add_argument("--seed", type=int, default=0,
                   help="the order of a folder's or list's samples in the shards (default: 0)")
    p.add_argument("--target", type=_target, default="class",
                   help="class, multilabel, none, or comma-separated column names: the labels "
                        "read and kept, as LoaderConfig.target (default: class)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="for s3:// sources, a keyword argument of s3fs.S3FileSystem")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    try:
        from ..upload import parse_options

        cfg = ConvertConfig(src=a.src, out=a.out, max_side=a.max_side, quality=a.quality,
                            shard_size=a.shard_size, seed=a.seed, target=a.target,
                            workers=a.workers, storage_options=parse_options(a.storage_option))
        m = convert(cfg, progress=False if a.quiet else None)
    except (ValueError, TypeError, OSError, ImportError) as e:  # user errors: one line
        print(f"data_gen convert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("data_gen convert: interrupted; the same command resumes where it stopped",
              file=sys.stderr)
        return 130
    s = m["summary"]
    for rel, why in s["failed_files"]:
        print(f"data_gen convert: could not convert {rel!r}: {why}", file=sys.stderr)
    print(json.dumps({"out": a.out, **{k: v for k, v in s.items() if k != "failed_files"}},
                     indent=1))
    return 0
