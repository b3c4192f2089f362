"""Progress bars: drawn on a terminal, quiet in logs, forced by GPU_FEED_PROGRESS."""
from __future__ import annotations

import io

from compare import progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_quiet_when_stdout_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv("GPU_FEED_PROGRESS", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    b = progress.bar(3, "x")
    b.update(3)
    b.close()
    assert not progress.shown() and type(b).__name__ == "_Quiet"
    assert capsys.readouterr().err == ""


def test_drawn_on_a_terminal_and_the_variable_wins(monkeypatch, capsys):
    monkeypatch.delenv("GPU_FEED_PROGRESS", raising=False)
    monkeypatch.setattr("sys.stdout", _Tty())
    assert progress.shown()
    b = progress.bar(4, "epoch 0", "step")
    b.update(4)
    b.close()
    assert "epoch 0" in capsys.readouterr().err
    monkeypatch.setenv("GPU_FEED_PROGRESS", "0")
    assert not progress.shown()
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.setenv("GPU_FEED_PROGRESS", "1")
    assert progress.shown()


def test_generating_the_default_dataset_is_quiet_in_a_log(monkeypatch, capsys, tmp_path):
    """Regression: the suite's default dataset drew data_gen's bar into a redirected log."""
    from data_gen.generate import GenConfig, ensure_dataset

    monkeypatch.delenv("GPU_FEED_PROGRESS", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    cfg = dict(num_images=3, classes=1, seed=0, width_range=(48, 64), workers=1)
    ensure_dataset(GenConfig(out=str(tmp_path / "a"), **cfg))
    assert "data_gen" not in capsys.readouterr().err
    monkeypatch.setenv("GPU_FEED_PROGRESS", "1")
    ensure_dataset(GenConfig(out=str(tmp_path / "b"), **cfg))
    assert "data_gen" in capsys.readouterr().err
