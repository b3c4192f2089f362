"""``--wait-sites`` (compare.waitsites NOTE [wait sites]): where the loop's thread waits."""
from __future__ import annotations

import json
import threading
import time

from compare.diff import main as diff
from compare.suite import main as suite
from compare.waitsites import WaitSites, merge


def _parked(stop: threading.Event) -> None:
    stop.wait()


def test_samples_only_while_waiting_and_names_the_waiting_function():
    stop = threading.Event()
    t = threading.Thread(target=_parked, args=(stop,))
    t.start()
    sites = WaitSites(thread_id=t.ident, interval=0.001).start()
    time.sleep(0.05)  # not waiting: nothing counted
    assert not sites.counts
    sites.waiting = True
    time.sleep(0.1)
    sites.waiting = False
    got = sites.stop()
    stop.set()
    t.join()
    assert got and abs(sum(got.values()) - 1) < 0.01
    top = next(iter(got))
    # threading.Event.wait is the standard library's, so the site starts at _parked
    assert top.startswith("tests/test_waitsites.py:") and "_parked" in top.split(" < ")[0]
    assert "threading.py" not in top


def test_no_samples_give_none_and_merge_averages_the_windows():
    assert WaitSites().start().stop() is None
    assert merge([{"a": 1.0}, None, {"a": 0.5, "b": 0.5}]) == {"a": 0.75, "b": 0.25}
    assert merge([None, None]) == {}


def test_the_suite_records_and_lists_where_each_row_waited(tiny_root, tmp_path, capsys):
    out = tmp_path / "ws"
    args = ["--data", str(tiny_root), "--out", str(out), "--model", "tinycnn", "--batch-size",
            "8", "--warmup", "1", "--device", "cpu", "--workers", "1", "--backends", "pageable",
            "--steps", "6", "--repeats", "1", "--isolate"]
    assert suite(args + ["--wait-sites"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["setup"]["wait_sites"] is True
    sites = res["variants"][0]["repeats"][0]["wait_sites"]
    # a DataLoader with one worker is slower than a tiny CNN: the loop waits in its __next__
    assert sites and any("dataloader.py" in s for s in sites)
    assert "**Where the loop waited for data**" in (out / "summary.md").read_text()
    assert suite(args + ["--out", str(tmp_path / "plain")]) == 0
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert plain["variants"][0]["repeats"][0]["wait_sites"] is None
    assert "Where the loop waited" not in (tmp_path / "plain" / "summary.md").read_text()
    capsys.readouterr()
    diff([str(tmp_path / "plain"), str(out)])
    assert "wait sampling: off in A, on (--wait-sites) in B" in capsys.readouterr().out
