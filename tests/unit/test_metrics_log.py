"""The run's metrics log under odd output paths."""

from __future__ import annotations

import logging
import os

import pytest

from rppo_td.train import _outputs
from rppo_td.train._outputs import MetricsLog


def test_a_path_that_is_not_utf8_keeps_metrics_csv_and_skips_tensorboard(tmp_path, caplog):
    # TensorBoard encodes its directory as UTF-8: a Latin-1 name ended the run after
    # metrics.csv was made, leaving a directory the next fresh run took for a run
    directory = tmp_path / os.fsdecode(b"lat\xfcn")
    directory.mkdir()
    with caplog.at_level(logging.WARNING):
        log = MetricsLog(directory)
    log.write({"update": 1, "env_steps": 8})
    log.close()
    assert "not a UTF-8 path" in caplog.text
    assert (directory / "metrics.csv").read_text().splitlines()[1].startswith("1,8")
    assert not list(directory.glob("events.out.tfevents*"))


def test_a_utf8_path_gets_tensorboard_events(tmp_path):
    directory = tmp_path / "rüns ü"
    directory.mkdir()
    log = MetricsLog(directory)
    log.write({"update": 1, "env_steps": 8, "loss": 0.5})
    log.close()
    assert list(directory.glob("events.out.tfevents*"))


def test_tensorboards_writer_is_closed_when_metrics_csv_cannot_be_opened(tmp_path, monkeypatch):
    # the writer's thread and events file outlived the failed start otherwise
    closed = []

    class Writer:
        def close(self):
            closed.append(True)

    monkeypatch.setattr(_outputs, "_tensorboard", lambda directory, purge_step: Writer())
    (tmp_path / "metrics.csv").mkdir()  # a folder in its place: opening it fails
    with pytest.raises(IsADirectoryError):
        MetricsLog(tmp_path)
    assert closed == [True]
