"""``sinkflow validate listops pathfinder --learn``: the CPU setting that learns is wired (its sizes,
the official mask, the report's majority baseline against a count of the labels made here, the
per-run machine rows) and the docs page renders its rows before the quick ones. No long training:
one tiny epoch per run."""

import json
from collections import Counter

import pytest
import torch

from sinkflow.studies.lra import lra_data
from sinkflow.studies.pages import reproducing_page
from sinkflow.studies.paper import PaperLRAClassifier
from sinkflow.studies.paper_report import LEARN_TARGET, learn_markdown
from sinkflow.studies.validation import TASKS, majority_baseline, run_validation

TINY = dict(n_samples=40, epochs=1, batch_size=8, dim=8, landmarks=4)


@pytest.mark.parametrize("task", ["listops", "pathfinder"])
def test_learn_sizes_are_the_documented_ones(task):
    learn, quick = TASKS[task].learn, TASKS[task].quick
    assert learn is not None and learn.mask and not quick.mask  # the official padding mask, quick mode unchanged
    data = dict(learn.data)
    if task == "listops":
        assert learn.seq_len == data["max_length"] - 1
    else:
        assert learn.seq_len == data["resolution"] ** 2
    train, test = TASKS[task].data(learn, 0)
    assert train.inputs.shape[1] == learn.seq_len and len(train) + len(test) == learn.n_samples
    torch.manual_seed(0)
    model = TASKS[task].model(learn, train, "softmax", 1)
    assert isinstance(model, PaperLRAClassifier) and model.pad_id == 0
    if learn.embed_std is not None:  # the official N(0, 0.02^2) embeddings (torch's default: N(0, 1) tokens)
        for weights in (model.tokens.weight, model.pos):
            assert float(weights.detach().std()) == pytest.approx(learn.embed_std, rel=0.2)
    assert TASKS["digits"].learn is None


def test_majority_baseline_counts_the_labels():
    train, test = [2, 2, 1, 0, 2, 1], [1, 1, 2, 0]
    assert majority_baseline(train, test) == {"class": 2, "accuracy": 0.25, "test_majority": 0.5}
    with pytest.raises(ValueError):
        majority_baseline([], [1])


@pytest.mark.parametrize("task", ["listops", "pathfinder"])
def test_learn_report_has_the_baseline_and_the_machine_per_run(task):
    rep = run_validation(task, ["softmax", "skyformer"], seeds=[0], learn=True, track_kl=False, size_overrides=TINY)
    assert rep["mode"] == "learn" and rep["complete"] and rep["config"]["size"]["mask"]
    # the baseline, independently: the training split's most common label, scored on the test split
    learn = TASKS[task].learn
    train, test = lra_data(task, TINY["n_samples"], dict(learn.data))
    top = Counter(train.labels.tolist()).most_common()
    top_class = min(c for c, k in top if k == top[0][1])  # argmax: the smallest of tied classes
    expected = sum(int(v) == top_class for v in test.labels.tolist()) / len(test)
    assert rep["baseline"]["class"] == top_class
    assert rep["baseline"]["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert rep["baseline"]["test_majority"] == pytest.approx(max(Counter(test.labels.tolist()).values()) / len(test))
    for run in rep["runs"]:
        m = run["machine"]
        assert run["wall_time"] > 0 and m["threads"] >= 1 and m["cpu"] and len(m["loadavg"]) == 3
    json.dumps(rep)
    lines = learn_markdown(rep)
    assert lines[0].startswith(f"## {task}: CPU, learns (`--learn`), epochs 1, examples 40 (the setting: ")
    assert f"{100 * rep['baseline']['accuracy']:.1f}%" in "\n".join(lines)


def _fake_learn(task, median, baseline):
    stat = {"median": median, "min": median - 0.01, "max": median + 0.01}
    size = {**vars(TASKS[task].learn), "data": [list(p) for p in TASKS[task].learn.data]}
    history = {"test_accuracy": [baseline, median]}
    return {"task": task, "description": "d", "mode": "learn", "complete": True, "total_time": 10.0,
            "config": {"size": size, "seeds": [0], "n_train": 30, "n_test": 10, "device": "cpu"},
            "environment": {"torch": torch.__version__, "threads": 1}, "baseline": {
                "class": 1, "accuracy": baseline, "test_majority": baseline},
            "runs": [{"variant": "softmax", "wall_time": 5.0, "history": history,
                      "machine": {"threads": 1, "cpu": "cpu", "cores": 2, "loadavg": [1.0, 1.0, 1.0]}}],
            "summary": [{"variant": "softmax", "attention": "softmax", "test_accuracy": stat,
                         "step_time": {"median": 0.01}}]}


@pytest.mark.parametrize("task", ["listops", "pathfinder"])
def test_the_bar_needs_the_target_and_the_margin_over_the_baseline(task):
    bar = LEARN_TARGET[task]

    def row(median, base):
        return next(line for line in learn_markdown(_fake_learn(task, median, base)) if line.startswith("| softmax"))

    above = bar["accuracy"] + 0.05
    assert "| yes |" in row(above, above - bar["margin"] - 0.01)
    assert "| no |" in row(above, above - bar["margin"] + 0.01)  # above the target but too close to the baseline
    assert "| no |" in row(bar["accuracy"] - 0.01, 0.0)  # far above the baseline but under the target


def test_page_renders_learn_rows_before_the_quick_rows():
    quick = json.loads(open("docs/data/listops_quick.json").read())
    learn = _fake_learn("listops", 0.4, 0.12)
    page = reproducing_page([quick, learn])
    assert page.index("## listops: CPU, learns (`--learn`)") < page.index("## listops: quick")
    assert "| softmax | 40.0 [39.0, 41.0] | 12.0 | +28.0 | yes |" in page
    assert "Differences from the paper's setting:" in page and "sinkflow validate listops pathfinder --learn" in page


def test_cli_learn_refuses_tasks_without_a_learn_setting(tmp_path):
    from sinkflow.cli import main

    assert main(["validate", "digits", "--learn", "--out", str(tmp_path)]) == 2


def test_cli_learn_runs_one_tiny_step_with_a_data_override(tmp_path, monkeypatch):
    import dataclasses

    from sinkflow.studies import validation

    small = dataclasses.replace(TASKS["pathfinder"].learn, **TINY)
    monkeypatch.setitem(validation.TASKS, "pathfinder", dataclasses.replace(TASKS["pathfinder"], learn=small))
    from sinkflow.cli import main

    assert main(["validate", "pathfinder", "--learn", "--attention", "softmax", "--seeds", "0", "--no-kl",
                 "--no-figures", "--data", "resolution=10", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "pathfinder_learn_resolution10.json").read_text())
    assert rep["mode"] == "learn" and rep["config"]["size"]["seq_len"] == 100 and dict(rep["config"]["size"]["data"])[
        "resolution"] == 10


def test_a_run_off_the_setting_says_what_it_changed():
    rep = _fake_learn("pathfinder", 0.55, 0.5)
    assert learn_markdown(rep)[0] == "## pathfinder: CPU, learns (`--learn`)"
    learn = TASKS["pathfinder"].learn
    rep["config"]["size"]["data"] = [["resolution", 32] if k == "resolution" else [k, v] for k, v in learn.data]
    rep["config"]["size"]["epochs"] = 3
    assert learn_markdown(rep)[0] == (f"## pathfinder: CPU, learns (`--learn`), resolution 32, epochs 3 "
                                      f"(the setting: resolution {dict(learn.data)['resolution']}, epochs "
                                      f"{learn.epochs})")


def test_cli_data_override_names_an_unknown_key(tmp_path):
    from sinkflow.cli import main

    with pytest.raises(SystemExit, match="resolution"):  # the message lists the task's generator parameters
        main(["validate", "pathfinder", "--learn", "--data", "radius=3", "--out", str(tmp_path)])
