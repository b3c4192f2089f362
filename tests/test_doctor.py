import pytest

from compare import doctor
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
    assert "/dev/shm" in out and "pinned memory" in out and rc == 0
    import torch

    from compare.args import AUTO

    main(["--workers", "1"])  # no --batch-size: the suite's default on this machine
    want = AUTO["batch_size"][0 if torch.cuda.is_available() else 1]
    assert capsys.readouterr().out.startswith(f"gpu-feed doctor: batch {want}, ")


def test_settings_no_loader_accepts_fail_and_name_the_option():
    lines = check(-4, -1, 0, 224, shm_free=8 * GiB, cores=16, cuda=H200, dali="2.4")
    assert {s for s, _, _ in lines} == {"FAIL"}
    msgs = [m for _, _, m in lines]
    assert msgs == ["--batch-size: batch_size=-4 must be an int >= 1",
                    "--workers: num_workers=-1 must be an int >= 0",
                    "--prefetch: prefetch_factor=0 must be an int >= 1"]


def test_doctor_cli_exits_1_on_a_fail(capsys):
    assert main(["--workers", "-1"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] workers" in out and "--workers" in out and "/dev/shm" not in out


def test_doctor_cli_exits_1_on_a_fail_with_strict_too(capsys):
    assert main(["--batch-size", "0", "--strict"]) == 1
    assert "[FAIL] batch size" in capsys.readouterr().out


def _machine(monkeypatch, cuda, dali, shm_free=128 * GiB, cores=16):
    """Pin the facts ``main`` reads, so its exit status does not depend on this host."""
    from pipelines.torch_backend import shm

    monkeypatch.setattr(doctor, "facts", lambda: (cores, cuda, dali))
    monkeypatch.setattr(shm, "shm_free_bytes", lambda: shm_free)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_doctor_cli_exits_0_here_with_default_settings(capsys, monkeypatch):
    """This host as it is (no GPU in CI): whatever it warns about, nothing fails."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpu-feed doctor:") and "[OK  ] workers" in out
    assert "[FAIL]" not in out


def test_no_cuda_and_no_dali_warn_but_exit_0(capsys, monkeypatch):
    _machine(monkeypatch, cuda={"available": False}, dali=None)
    assert main(["--workers", "14", "--local-ranks", "1"]) == 0
    out = capsys.readouterr().out
    assert "[WARN] CUDA" in out and "[WARN] DALI" in out and "[FAIL]" not in out


@pytest.mark.parametrize("machine", [
    {"cuda": {"available": False}, "dali": "2.4"},  # only the CUDA warning
    {"cuda": H200, "dali": None},  # only the DALI warning
    {"cuda": H200, "dali": "2.4", "cores": 4},  # only the workers warning
])
def test_strict_exits_1_on_any_warn(capsys, monkeypatch, machine):
    _machine(monkeypatch, **machine)
    args = ["--workers", "14", "--local-ranks", "1"]
    assert main(args) == 0
    warns = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[WARN]")]
    assert len(warns) == 1
    assert main([*args, "--strict"]) == 1


def test_strict_exits_1_on_oversubscribed_workers_here(capsys, monkeypatch):
    """10000 workers outnumber any host's cores: a WARN, not a FAIL."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert main(["--workers", "10000"]) == 0
    out = capsys.readouterr().out
    assert "[WARN] workers" in out and "[FAIL]" not in out
    assert main(["--workers", "10000", "--strict"]) == 1


def test_strict_exits_0_without_a_warn(capsys, monkeypatch):
    _machine(monkeypatch, cuda=H200, dali="2.4")
    assert main(["--workers", "14", "--local-ranks", "1", "--strict"]) == 0
    out = capsys.readouterr().out
    assert "[OK  ] CUDA" in out and "[INFO]" in out and "[WARN]" not in out


def test_malformed_local_world_size_exits_1_naming_it(capsys, monkeypatch):
    _machine(monkeypatch, cuda=H200, dali="2.4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    assert main(["--workers", "14"]) == 1
    assert "LOCAL_WORLD_SIZE='two'" in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit status:" in out and "--strict" in out
    assert "0 nothing failed" in out and "1 a failure: a [FAIL] line" in out
    assert "2 a usage error" in out


def test_usage_errors_keep_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--workers", "many"])
    assert e.value.code == 2 and "--workers" in capsys.readouterr().err
