"""``python -m tools.resume_test --backend dali --data DIR [examples/train.py options]``: a real
pre-emption, and the proof that ``examples/train.py`` resumes from it.

Three runs of the same ``examples/train.py`` command, in child processes, with every batch's
(epoch, position, dataset indices) logged:

1. uninterrupted, to the end;
2. with a checkpoint after every step, killed by ``SIGKILL`` (from itself, after logging its
   step and before checkpointing it: the worst moment) in the middle of the second epoch;
3. the same command with ``--resume``, from the checkpoint the killed run left.

The joined sequence is run 2's batches before the position run 3 resumed at, then run 3's. It
must equal run 1's, batch for batch, and run 3 must have started at the checkpoint's position
(a run that silently restarts from batch 0 would also join into run 1's sequence). Exit status
0 when it does, 1 (with the first difference) when it does not, 2 for a usage error.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

PROG = "python -m tools.resume_test"
TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train.py"

Row = tuple[int, int, str]


def _rows(path: Path) -> list[Row]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):  # "# resumed EPOCH BATCH" (examples/train.py)
            continue
        e, k, idx = line.split(" ", 2)
        out.append((int(e), int(k), idx))
    return out


def _child(args: list[str], log: Path, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(TRAIN), *args, "--log-batches", str(log), *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def resumed_at(path: Path) -> tuple[int, int] | None:
    """``(epoch, batch)`` the run logged to ``path`` said it resumed at, ``None`` when it did
    not say (it started afresh)."""
    for line in path.read_text().splitlines():
        if line.startswith("# resumed "):
            e, k = line.split()[2:4]
            return int(e), int(k)
    return None


def start_error(killed: list[Row], kill_at: int, said: tuple[int, int] | None,
                resumed: list[Row], per_epoch: int) -> str | None:
    """Why the resumed run did not start at the checkpoint's position, or ``None``.

    The killed run checkpointed after every step but its last (step ``kill_at``, logged, then
    killed before its checkpoint), so the resumed run must say it resumed at that step's
    position and its first batch must be that step's batch. A run that silently restarts from
    batch 0 would otherwise join into an "identical" sequence. A position at the end of an
    epoch (``per_epoch`` batches received) is the next epoch's first batch.
    """
    if len(killed) < kill_at:
        return f"the killed run logged {len(killed)} batches, fewer than the {kill_at} it ran"
    want = killed[kill_at - 1][:2]
    if said is not None and said[1] >= per_epoch:  # saved at the epoch's end
        said = (said[0] + 1, 0)
    if said is None:
        return (f"the resumed run did not resume from the checkpoint (it started afresh); it "
                f"should have resumed at epoch {want[0]}, batch {want[1]}")
    if said != want:
        return (f"the resumed run resumed at epoch {said[0]}, batch {said[1]}, not at the "
                f"checkpoint's position, epoch {want[0]}, batch {want[1]}")
    if resumed and resumed[0][:2] != want:
        return (f"the resumed run's first batch is epoch {resumed[0][0]}, batch "
                f"{resumed[0][1]}, not the checkpoint's position, epoch {want[0]}, batch {want[1]}")
    return None


def join(killed: list[Row], resumed: list[Row]) -> list[Row]:
    """``killed`` up to where ``resumed`` starts, then ``resumed``."""
    if not resumed:
        return killed
    at = resumed[0][:2]
    return [r for r in killed if r[:2] < at] + resumed


def fail(msg: str, code: int = 2) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=2, help="at least 2: the kill falls in the second")
    p.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kill-after-steps", type=int, default=None, help=argparse.SUPPRESS)
    a, rest = p.parse_known_args(argv)  # the rest goes to examples/train.py as it is
    from pipelines.placement import placement

    try:
        placement()  # RANK and WORLD_SIZE come as a pair, before any work
    except ValueError as e:
        return fail(str(e))
    return run_test(a, [*rest, "--epochs", str(a.epochs)], PROG)


def run_test(a, args: list[str], prog: str) -> int:
    if a.epochs < 2:
        return fail(f"--epochs >= 2 is needed (got {a.epochs}): the kill falls in the second "
                    "epoch")
    if a.checkpoint or a.resume or a.kill_after_steps is not None:
        return fail("the test makes its own checkpoint; drop --checkpoint and --resume")
    with tempfile.TemporaryDirectory(prefix="gpu-feed-resume-") as tmp:
        t = Path(tmp)
        ref = _child(args, t / "ref.log", [])
        if ref.returncode != 0:
            return fail(f"the uninterrupted run failed: {ref.stderr.strip()[-500:]}", 1)
        want = _rows(t / "ref.log")
        per_epoch = sum(1 for r in want if r[0] == 0)
        kill_at = per_epoch + max(1, per_epoch // 2)  # the middle of the second epoch
        ck = ["--checkpoint", str(t / "ck.pt"), "--checkpoint-every", "1"]
        run = _child(args, t / "killed.log", ck + ["--kill-after-steps", str(kill_at)])
        if run.returncode != -9:
            return fail(f"the run to be killed ended with status {run.returncode}, "
                                  f"not SIGKILL: {run.stderr.strip()[-500:]}", 1)
        killed = _rows(t / "killed.log")
        res = _child(args, t / "resumed.log", ck + ["--resume"])
        if res.returncode != 0:
            return fail(f"the resumed run failed: {res.stderr.strip()[-500:]}", 1)
        resumed = _rows(t / "resumed.log")
        said = resumed_at(t / "resumed.log")
    bad_start = start_error(killed, kill_at, said, resumed, per_epoch)
    if bad_start is not None:
        return fail(bad_start, 1)
    got = join(killed, resumed)
    where = f"killed by SIGKILL after step {kill_at} (epoch 1, batch {kill_at - per_epoch - 1})"
    start = f"epoch {resumed[0][0]}, batch {resumed[0][1]}" if resumed else "the end"
    print(f"{prog}: {len(want)} batches uninterrupted; {where}; resumed at "
          f"{start}; {len(got)} batches joined")
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return fail(f"batch {i} differs: uninterrupted (epoch {w[0]}, batch {w[1]}, "
                                  f"indices {w[2][:60]}) vs resumed (epoch {g[0]}, batch {g[1]}, "
                                  f"indices {g[2][:60]})", 1)
    if len(want) != len(got):
        return fail(f"{len(want)} batches uninterrupted but {len(got)} joined", 1)
    print("identical: every (epoch, batch, indices) of the joined run equals the uninterrupted one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
