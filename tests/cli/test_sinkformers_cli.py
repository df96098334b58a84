"""``sinkflow sinkformers``: arguments, the study table, and a run that writes its JSON report."""

import importlib
import json

from sinkflow.cli import build_parser, sinkformers


def test_arguments_and_study_targets():
    args = build_parser(["sinkformers"]).parse_args(["sinkformers", "patch-size", "point-cloud", "--full",
                                                     "--seeds", "3"])
    assert args.studies == ["patch-size", "point-cloud"] and args.full and args.seeds == 3
    for target, _ in sinkformers.STUDIES.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_run_writes_the_report(tmp_path, monkeypatch):
    """A stand-in report function (the real ones take minutes): the file name, the seeds and the mode passed."""
    calls = []

    def fake(seeds, **kw):
        calls.append((seeds, kw))
        return {"study": "point_cloud", "wall_time": 0.0, "seeds": list(seeds)}

    import sinkflow.studies.point_clouds as pc

    monkeypatch.setattr(pc, "point_cloud_report", fake)
    args = build_parser(["sinkformers"]).parse_args(["sinkformers", "point-cloud", "--seeds", "2", "--out",
                                                     str(tmp_path)])
    assert sinkformers.run(args) == 0
    assert calls == [((0, 1), {"size": "quick"})]
    assert json.loads((tmp_path / "point_cloud_quick.json").read_text())["seeds"] == [0, 1]
