"""Progress bars appear on a terminal and stay out of logs, pipes and captured output."""

import io

import numpy as np

import sinkflow
from sinkflow._progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_is_drawn_on_a_terminal_only():
    tty, log, off = Terminal(), io.StringIO(), Terminal()
    for stream, enabled in ((tty, True), (log, True), (off, False)):
        assert list(progress_bar(range(3), file=stream, desc="steps", enabled=enabled)) == [0, 1, 2]
    assert "steps" in tty.getvalue() and "\r" in tty.getvalue()
    assert log.getvalue() == "" and off.getvalue() == ""


def test_simulation_with_progress_writes_nothing_to_a_captured_stderr(capsys):
    x0 = sinkflow.random_particles(6, 2, seed=0)
    sinkflow.simulate(x0, "softmax", W_Q=np.eye(2), W_V=np.eye(2), h=0.1, steps=3, progress=True)
    assert "flow" not in capsys.readouterr().err


def test_by_default_only_a_long_loop_shows_its_bar(monkeypatch):
    import sinkflow._progress as progress

    short, long = Terminal(), Terminal()
    assert list(progress_bar(range(3), file=short, desc="steps", enabled=None)) == [0, 1, 2]
    monkeypatch.setattr(progress, "LONG_RUN_SECONDS", 0.0)  # every loop is long
    assert list(progress_bar(range(3), file=long, desc="steps", enabled=None)) == [0, 1, 2]
    assert short.getvalue() == "" and "steps" in long.getvalue()
