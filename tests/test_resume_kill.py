"""``python -m tools.resume_test``: a real SIGKILL of ``examples/train.py`` mid-epoch, resumed,
joined = uninterrupted."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.resume_test import join, main

REPO = Path(__file__).resolve().parent.parent


# pageable shares pinned's resume path (torch_backend.base), resumed in-process on every backend by
# tests/test_resume.py: a real SIGKILL is run on one torch backend and on dali
@pytest.mark.parametrize("backend", ["dali", "pinned"])
def test_a_killed_run_resumes_into_the_uninterrupted_sequence(backend, tiny_root):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "tools.resume_test", "--backend", backend,
                        "--data", str(tiny_root), "--batch-size", "4", "--workers", "1",
                        "--epochs", "2"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "killed by SIGKILL after step" in r.stdout and "identical" in r.stdout


def test_join_takes_the_killed_run_up_to_the_resumed_position():
    killed = [(0, 0, "1"), (0, 1, "2"), (1, 0, "3"), (1, 1, "4")]  # (1, 1) logged, not saved
    resumed = [(1, 1, "4"), (1, 2, "5")]
    assert join(killed, resumed) == [(0, 0, "1"), (0, 1, "2"), (1, 0, "3"), (1, 1, "4"),
                                     (1, 2, "5")]
    assert join(killed, []) == killed


def test_resume_test_needs_two_epochs_and_no_checkpoint_of_its_own(tiny_root, capsys):
    assert main(["--backend", "pageable", "--data", str(tiny_root), "--epochs", "1"]) == 2
    assert "--epochs >= 2" in capsys.readouterr().err
    assert main(["--backend", "pageable", "--data", str(tiny_root), "--epochs", "2",
                 "--checkpoint", "x.pt"]) == 2
    assert "makes its own checkpoint" in capsys.readouterr().err
