"""``--trace`` (compare.probes.trace): the analysis of a marked window's Chrome trace,
and the suite writing one per variant's first repeat and the ceiling's."""
from __future__ import annotations

import gzip
import json

import pytest

from compare.probes import trace
from compare.suite import main as suite

FAST = ["--model", "tinycnn", "--batch-size", "8", "--warmup", "1", "--device", "cpu",
        "--workers", "1"]


def _x(name, cat, ts_ms, dur_ms, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3,
            "pid": 100, "tid": tid, "args": args}


def _window(waits_ms, step_ms=50.0):
    """Marked steps: each wait, then a step of ``step_ms``; returns (events, wait starts)."""
    events, starts, t = [], [], 0.0
    for w in waits_ms:
        events.append(_x(trace.MARK_WAIT, "user_annotation", t, w))
        starts.append(t)
        t += w
        events.append(_x(trace.MARK_STEP, "user_annotation", t, step_ms))
        t += step_ms
    return events, starts


def test_a_stall_is_found_with_what_was_in_flight_during_it():
    events, starts = _window([1.0, 1.2, 60.0, 0.9, 1.1])
    s = starts[2]  # the stall: 60 ms at step 2
    events += [
        # a free of pinned memory on a loader thread spans most of the stall
        _x("cudaFreeHost", "cuda_runtime", s + 2, 50.0, tid=7),
        # a short launch on the main thread during it, and an allocation outside every stall
        _x("cudaLaunchKernel", "cuda_runtime", s + 10, 0.01, tid=1),
        _x("cuMemFree_v2", "cuda_driver", starts[0] + 0.1, 0.2, tid=7),
        # the compute stream busy through the stall, the loader's stream for 5 ms of it
        {**_x("conv", "kernel", s - 5, 65.0), "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7}},
        {**_x("Memcpy HtoD", "gpu_memcpy", s + 52, 5.0), "pid": 0, "tid": 21,
         "args": {"device": 0, "stream": 21}},
        _x("Stream Sync", "cuda_sync", s + 1, 55.0, tid=7),
        _x("aten::conv2d", "cpu_op", s, 1.0),  # not a CUDA call
    ]
    out = trace.analyse({"traceEvents": events})
    assert out["steps"] == 5 and out["waits_ms"][2] == 60.0
    assert out["wait_ms"]["stall_limit"] == pytest.approx(max(trace.STALL_FLOOR_MS, 3 * 1.1))
    assert [st["step"] for st in out["stalls"]] == [2]
    stall = out["stalls"][0]
    assert stall["in_flight"] == [{"name": "cudaFreeHost", "overlap_ms": 50.0},
                                  {"name": "cudaLaunchKernel", "overlap_ms": 0.01}]
    assert out["cuda_activity"] is True
    d = trace.digest(out, "t/u.summary.json")
    assert d["stalls"] == 1 and d["stall_ms"] == 60.0
    assert d["in_stalls"][0] == ["cudaFreeHost", 50.0]
    assert trace.describe(d) == ("5 steps, 1 stall (60.0 ms); in flight during the stalls: "
                                 "cudaFreeHost: 50.0 ms; cudaLaunchKernel: 0.0 ms "
                                 "(`t/u.summary.json`)")


def test_steady_waits_have_no_stall_and_a_trace_without_marks_is_refused():
    events, _ = _window([2.0, 2.5, 3.0, 2.2])
    out = trace.analyse({"traceEvents": events})
    assert out["stalls"] == [] and out["cuda_activity"] is False
    assert trace.describe(trace.digest(out, "f")) == \
        "4 steps, no stall; no CUDA activity recorded (`f`)"
    with pytest.raises(ValueError, match="no 'gpu_feed/wait' range"):
        trace.analyse({"traceEvents": [_x("cudaFree", "cuda_runtime", 0, 1)]})


def test_marks_on_the_host_clock_become_ranges_at_the_traces_times():
    """The marks are ns since the epoch; a trace's times are µs after its base."""
    base = 1_700_000_000_000_000_000
    marks = [(base + 1_000, base + 3_000, base + 4_000), (base + 4_000, base + 60_000,
                                                          base + 61_000)]
    t = trace.with_marks({"baseTimeNanoseconds": base, "traceEvents": []}, marks)
    spans = [(e["name"], e["ts"], e["dur"]) for e in t["traceEvents"]]
    assert spans == [(trace.MARK_WAIT, 1.0, 2.0), (trace.MARK_STEP, 3.0, 1.0),
                     (trace.MARK_WAIT, 4.0, 56.0), (trace.MARK_STEP, 60.0, 1.0)]
    assert trace.analyse(t)["waits_ms"] == [0.002, 0.056]


def test_slug_names_a_unit_file():
    assert trace.slug("dali hw_decoder_load=1 #1") == "dali-hw_decoder_load-1-1"
    assert trace.slug("  ") == "unit"


@pytest.mark.parametrize("how", ["--isolate", "--no-isolate"])
def test_the_suite_traces_each_variants_first_repeat_and_the_ceiling(tiny_root, tmp_path, how):
    out = tmp_path / "t"
    # isolated units are each a process: one backend there keeps the test short
    backends = "pinned" if how == "--isolate" else "pageable,pinned"
    assert suite(["--data", str(tiny_root), "--out", str(out), *FAST, how, "--backends",
                  backends, "--steps", "3", "--repeats", "2", "--trace", "--details"]) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["setup"]["trace"] is True
    for v in r["variants"] + [r["ceiling"]]:
        first, second = v["repeats"]
        assert "trace" not in second
        d = first["trace"]
        summary = json.loads((out / d["file"]).read_text())
        assert summary["steps"] == d["steps"] == first["steps"]  # the same window length
        assert len(summary["waits_ms"]) == summary["steps"]
        name = d["file"].removesuffix(".summary.json")
        with gzip.open(out / f"{name}.trace.json.gz", "rt") as f:
            kept = json.load(f)["traceEvents"]
        cats = {e.get("cat") for e in kept}
        assert "user_annotation" in cats and "cpu_op" not in cats  # slimmed
    text = (out / "summary.md").read_text()
    assert "**Traces**" in text and "- pinned: " in text and "- ceiling: " in text
    if how == "--isolate":
        return  # without --trace, isolated or not, the same code writes the results
    plain = tmp_path / "plain"  # without --trace: no trace field, no section, no folder
    assert suite(["--data", str(tiny_root), "--out", str(plain), *FAST, how, "--backends",
                  "pageable", "--steps", "3", "--repeats", "1"]) == 0
    r = json.loads((plain / "results.json").read_text())
    assert r["setup"]["trace"] is False and not (plain / "trace").exists()
    assert all("trace" not in rep for v in r["variants"] + [r["ceiling"]] for rep in v["repeats"])
    assert "**Traces**" not in (plain / "summary.md").read_text()


@pytest.mark.cuda
def test_on_a_gpu_the_trace_holds_the_steps_kernels_and_cuda_calls(gpu_root, tmp_path):
    """On a GPU the traced window's CUDA activity is recorded: the step's kernels on its
    stream, and the runtime calls that launched them."""
    out = tmp_path / "g"
    assert suite(["--data", str(gpu_root), "--out", str(out), "--model", "resnet18",
                  "--batch-size", "32", "--warmup", "2", "--workers", "4", "--no-isolate",
                  "--backends", "pinned", "--steps", "6", "--repeats", "1", "--trace"]) == 0
    r = json.loads((out / "results.json").read_text())
    d = r["variants"][0]["repeats"][0]["trace"]
    summary = json.loads((out / d["file"]).read_text())
    assert d["cuda_activity"] is True and summary["steps"] == r["variants"][0]["repeats"][0][
        "steps"]
    name = d["file"].removesuffix(".summary.json")
    with gzip.open(out / f"{name}.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    assert any(e.get("name", "").startswith(("cudaLaunchKernel", "cuLaunch")) for e in events)


def test_a_trace_that_cannot_be_written_is_said_and_the_run_kept(tmp_path, monkeypatch):
    """The trace is extra: an export that fails gives its error in the summary and the report
    line, and the run's own result comes back; an error of the run itself is raised."""
    from torch.profiler import profile

    def broken(self, path):
        raise OSError("disk full")

    monkeypatch.setattr(profile, "export_chrome_trace", broken)
    got, summary = trace.record(lambda: "measured", tmp_path / "u")
    assert got == "measured" and summary["error"].endswith("OSError: disk full")
    d = trace.digest(summary, "f")
    assert trace.describe(d) == ("no trace: the trace could not be written or read: "
                                 "OSError: disk full")
    with pytest.raises(RuntimeError, match="loader broke"):
        trace.record(lambda: (_ for _ in ()).throw(RuntimeError("loader broke")),
                     tmp_path / "v")
