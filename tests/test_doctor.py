from compare.doctor import check, main

GiB = 2**30
H200 = {"available": True, "name": "NVIDIA H200", "cc": (9, 0), "runtime": "13.0", "driver": "580"}


def _status(lines, topic):
    return [s for s, t, _ in lines if t == topic]


def test_small_dev_shm_is_flagged_with_the_fallback():
    lines = check(256, 14, 2, 224, shm_free=64 * 2**20, cores=16, cuda=H200, dali="2.4")
    shm = [(s, m) for s, t, m in lines if t == "/dev/shm"]
    assert all(s == "WARN" for s, _ in shm) and "--shm-size" in shm[0][1]
    assert "num_workers=0" in shm[0][1]  # a 154 MiB float32 batch cannot fit in 64 MB


def test_healthy_h200_box():
    lines = check(256, 14, 2, 224, shm_free=128 * GiB, cores=16, cuda=H200, dali="2.4")
    assert "WARN" not in {s for s, _, _ in lines}
    assert _status(lines, "JPEG hardware decoder") == ["OK"]


def test_oversubscribed_workers_and_missing_dali_and_gpu():
    lines = check(32, 8, 2, 224, shm_free=8 * GiB, cores=2, cuda={"available": False}, dali=None)
    assert _status(lines, "workers") == ["WARN"]
    assert _status(lines, "DALI") == ["WARN"] and _status(lines, "CUDA") == ["WARN"]


def test_doctor_cli_prints_a_report(capsys):
    rc = main(["--batch-size", "8", "--workers", "1"])
    out = capsys.readouterr().out
    assert "/dev/shm" in out and "pinned memory" in out and rc in (0, 1)


def test_settings_no_loader_accepts_fail_and_name_the_option():
    lines = check(-4, -1, 0, 224, shm_free=8 * GiB, cores=16, cuda=H200, dali="2.4")
    assert {s for s, _, _ in lines} == {"FAIL"}
    msgs = [m for _, _, m in lines]
    assert msgs == ["--batch-size: batch_size=-4 must be an int >= 1",
                    "--workers: num_workers=-1 must be an int >= 0",
                    "--prefetch: prefetch_factor=0 must be an int >= 1"]


def test_doctor_cli_exits_2_on_a_fail(capsys):
    assert main(["--workers", "-1"]) == 2
    out = capsys.readouterr().out
    assert "[FAIL] workers" in out and "--workers" in out and "/dev/shm" not in out
