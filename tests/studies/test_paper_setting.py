"""The paper-setting CPU path (sinkflow.studies.paper): the official model's masks and pooling, its
optimizer schedule, the instability ratio against a plain re-implementation, the decomposition
variants against closed forms, the cost rows, and the --paper CLI and docs page."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sinkflow.studies.pages import reproducing_page
from sinkflow.studies.paper import (
    OFFICIAL,
    PaperSetting,
    _register_decomposition_variants,
    cost_rows,
    instability_rows,
    paper_batches,
    paper_model,
    paper_optimizer,
    run_paper_setting,
)
from sinkflow.studies.paper_report import paper_setting_markdown

TINY = PaperSetting("listops", batch_size=2, max_length=24)


@pytest.mark.parametrize("attention", ["softmax", "gaussian", "sinkhorn"])
def test_padding_is_invisible_to_real_tokens(attention):
    """Official masks: more padding changes neither the real tokens' features nor (up to the n of the mean) the
    logits."""
    torch.manual_seed(0)
    model = paper_model(replace_len(24), attention).eval()
    short = torch.tensor([[3, 5, 7, 11, 0, 0]])
    long = torch.tensor([[3, 5, 7, 11] + [0] * 20])
    with torch.no_grad():
        f_short, f_long = model.features(short), model.features(long)
        assert torch.allclose(f_short[:, :4], f_long[:, :4], atol=1e-5)
        assert float(f_long[:, 4:].abs().max()) == 0.0
        pooled = f_long.sum(1) / 24  # official pooling: mean over all positions, padding as zeros
        assert torch.allclose(model(long), model.head[1](pooled), atol=1e-6)


def replace_len(n):
    from dataclasses import replace
    return replace(TINY, max_length=n)


def test_official_initialization_and_head():
    torch.manual_seed(0)
    model = paper_model(PaperSetting("pathfinder"), "softmax")
    assert abs(float(model.tokens.weight.detach().std()) - 0.02) < 0.002
    assert model.pad_id == 0  # the official mask is token != 0 on every task (Pathfinder: black pixels)
    assert model.pos.shape[1] == 1024
    assert isinstance(model.head[1][1], torch.nn.ReLU)


def test_onecycle_warmup_matches_closed_form():
    """torch's OneCycleLR as the official code calls it: lr/25 at step 0, linear to lr at the end of the warm-up."""
    setting = PaperSetting("listops")
    model = torch.nn.Linear(2, 2)
    opt, sched = paper_optimizer(model, setting)
    lr, warm = OFFICIAL["listops"]["lr"], OFFICIAL["listops"]["warmup"]
    lrs = []
    for _ in range(21):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [lr / 25 + (lr - lr / 25) * t / (warm - 1) for t in range(21)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-6)
    assert opt.param_groups[0]["eps"] == 1e-6


def _plain_taus(setting, attention, seed, steps):
    """Appendix F written out: the features before and after each AdamW step, over the flat weight change."""
    torch.manual_seed(seed)
    model = paper_model(setting, attention)
    opt, sched = paper_optimizer(model, setting)
    taus = []
    for x, y in paper_batches(setting, steps, seed):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        model.eval()
        with torch.no_grad():
            f0, w0 = model.features(x), torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        opt.step()
        with torch.no_grad():
            f1, w1 = model.features(x), torch.cat([p.detach().flatten() for p in model.parameters()])
        taus.append(float(((f1 - f0) ** 2).sum() / ((w1 - w0) ** 2).sum()))
        sched.step()
    return taus


def test_instability_ratio_matches_plain_reimplementation():
    rows = instability_rows(TINY, ["gaussian"], seeds=[0, 1], steps=3)
    soft, gauss = rows
    assert soft["ratios"] == [1.0, 1.0]
    for i, seed in enumerate([0, 1]):
        ref = np.mean(np.divide(_plain_taus(TINY, "gaussian", seed, 3), _plain_taus(TINY, "softmax", seed, 3)))
        assert math.isclose(gauss["ratios"][i], ref, rel_tol=1e-4)
    assert gauss["ratio"]["min"] <= gauss["ratio"]["median"] <= gauss["ratio"]["max"]


def test_decomposition_variants_closed_form():
    """Gaussian scores with SoftMax rows; the kernel over the number of admissible keys."""
    from sinkflow.attention._variants import _REGISTRY

    _register_decomposition_variants()
    C = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 5, 7, dtype=torch.bool)
    mask[1, :, 4:] = False
    rows = _REGISTRY["gaussian_rows"].normalize(C, n_iter=1, mask=mask)
    rows = getattr(rows, "attention", rows)
    ref = torch.softmax(C.masked_fill(~mask, -torch.inf), -1)
    assert torch.allclose(rows, ref, atol=1e-6)
    over = _REGISTRY["gaussian_over_n"].normalize(C, n_iter=1, mask=mask)
    over = getattr(over, "attention", over)
    ref = C.exp() * mask / mask.sum(-1, keepdim=True)
    assert torch.allclose(over, ref, atol=1e-6)


def test_cost_rows_record_machine_and_ratios():
    rows = cost_rows(TINY, ["softmax", "gaussian"], seeds=[0, 1], steps=1)
    assert len(rows) == 4
    for r in rows:
        assert r["threads"] == torch.get_num_threads() and len(r["loadavg"]) == 3 and r["cpu"]
        assert r["batch_size"] == 2 and r["seq_len"] == 24 and r["step_time"] > 0 and r["memory"] > 0
    report = run_paper_setting("listops", ["softmax", "gaussian"], [0, 1], cost_batch=1, cost_steps=1,
                               instability_attentions=["softmax", "gaussian"], instability_batch=1, steps=1,
                               max_length=16)
    summary = {s["attention"]: s for s in report["cost"]["summary"]}
    med = {a: np.median([r["memory"] for r in report["cost"]["rows"] if r["attention"] == a]) for a in summary}
    assert math.isclose(summary["gaussian"]["memory_ratio"], med["gaussian"] / med["softmax"], rel_tol=1e-12)
    json.dumps(report)  # JSON-ready
    assert "load" in paper_setting_markdown(report)


def test_paper_rows_come_before_quick_rows():
    quick = json.loads(open("docs/data/listops_quick.json").read())
    report = run_paper_setting("listops", ["softmax"], [0], cost_batch=1, cost_steps=1,
                               instability_attentions=["softmax"], instability_batch=1, steps=1, max_length=12)
    page = reproducing_page([quick, report])
    assert page.index("## listops: paper setting, CPU") < page.index("## listops: quick")


def test_cli_paper_refuses_other_tasks_and_cuda(tmp_path, capsys):
    from sinkflow.cli import main

    assert main(["validate", "digits", "--paper", "--out", str(tmp_path)]) == 2
    assert main(["validate", "listops", "--paper", "--device", "cuda", "--out", str(tmp_path)]) in (2,)


def test_residual_share_matches_direct_computation():
    from sinkflow.studies.paper import residual_share

    setting = replace_len(24)
    torch.manual_seed(3)
    model = paper_model(setting, "gaussian").eval()
    x, _ = paper_batches(setting, 1, 3)[0]
    pad = x == 0
    with torch.no_grad():
        stream = model.tokens(x) + model.pos[:, : x.shape[1]]
        h = model.blocks[0].norm(stream)
        branch = model.blocks[0].attn(h, h, h, key_padding_mask=pad, need_weights=False, query_padding_mask=pad)[0]
    ref = float(branch[~pad].norm() / stream[~pad].norm())
    assert math.isclose(residual_share(setting, "gaussian", seed=3), ref, rel_tol=1e-5)


def test_instability_page_from_reports():
    from sinkflow.studies.paper_report import _inside, instability_page

    quick = json.loads(open("docs/data/listops_quick.json").read())
    report = run_paper_setting("listops", ["softmax", "gaussian"], [0], cost_batch=1, cost_steps=1,
                               instability_attentions=["softmax", "gaussian"], instability_batch=1, steps=1,
                               max_length=12, decomposition_length=12, decomposition_batch=2)
    page = instability_page([report, quick])
    ratio = report["instability"]["rows"][1]["ratio"]
    expected = ("below every seed" if 0.77 < ratio["min"] else
                "above every seed" if 0.77 > ratio["max"] else "inside the seeds' range")
    assert expected in page and _inside(ratio, 0.77) == expected
    q = next(r for r in quick["summary"] if r["attention"] == "gaussian")["update_instability_ratio_to_softmax"]
    assert f"| {q:.2f} | 0.77 |" in page  # the quick setting's ratio beside ours
    assert "The initialization decides it" in page and "residual_shares" in page
