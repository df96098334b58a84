"""Set Transformer blocks, the generated shape classes and the point-cloud study (sinkflow.studies.point_clouds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from sinkflow.studies.data import SHAPES
from sinkflow.studies.intervals import t_interval
from sinkflow.studies.point_clouds import (
    ISAB,
    PMA,
    SAB,
    SHAPE_CLASSES,
    SetTransformer,
    point_cloud_study,
    shape_classes,
)

NORMS = [("softmax", 1), ("sinkhorn", 7)]


def _cloud(b=3, n=40, seed=0):
    return torch.randn(b, n, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _model(normalization, n_iter, inducing=4, seed=0):
    torch.manual_seed(seed)
    return SetTransformer(n_classes=5, dim=16, heads=2, inducing=inducing, normalization=normalization,
                          n_iter=n_iter).double().eval()


# --- the generated data -------------------------------------------------------------------------------------

def test_generator_is_seeded_and_balanced():
    a, b, c = shape_classes(5, 32, seed=3), shape_classes(5, 32, seed=3), shape_classes(5, 32, seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.allclose(a.inputs, c.inputs)
    assert a.labels.bincount(minlength=8).tolist() == [5] * len(SHAPE_CLASSES)
    x = a.inputs.double()
    assert x.mean(1).abs().max() < 1e-6  # centred
    assert torch.allclose((x**2).sum(-1).mean(-1), torch.ones(len(x), dtype=torch.float64), atol=1e-5)  # unit RMS


def test_sphere_oracle_radius_without_noise_or_stretch():
    """A sphere with no noise and no stretch, centred and scaled to unit RMS radius: every radius is 1 exactly
    (up to the centring of a finite sample, which moves the centre by O(1/sqrt(n)))."""
    d = shape_classes(4, 2000, ("sphere",), noise=0.0, scale=(1.0, 1.0), seed=0)
    r = d.inputs.double().norm(dim=-1)
    assert (r - 1).abs().max() < 0.1 and r.std(1).max() < 0.05


def test_pyramid_points_lie_on_its_surface_with_area_weights():
    """Base z = -1 inside the square, lateral faces max(|x|, |y|) = (1 - z) / 2; the base holds 4 / (4 + 4 sqrt 5)
    of the area, so of the points (binomial 5-sigma tolerance)."""
    x = SHAPES["pyramid"](np.random.default_rng(0), 20000)
    on_base = np.isclose(x[:, 2], -1.0, atol=1e-12)
    assert np.all(np.abs(x[on_base, :2]) <= 1)
    lateral = x[~on_base]
    assert np.allclose(np.abs(lateral[:, :2]).max(1), (1 - lateral[:, 2]) / 2, atol=1e-12)
    p = 4 / (4 + 4 * math.sqrt(5))
    assert abs(on_base.mean() - p) < 5 * math.sqrt(p * (1 - p) / len(x))


def _features(inputs: torch.Tensor) -> np.ndarray:
    """Rotation-invariant features: sorted covariance eigenvalues and radial moments of each cloud."""
    x = inputs.double().numpy()
    eig = np.sort(np.linalg.eigvalsh(np.einsum("npi,npj->nij", x, x) / x.shape[1]), 1)
    r = np.linalg.norm(x, axis=-1)
    return np.concatenate([eig, r.std(1, keepdims=True), np.abs(r - np.median(r, 1, keepdims=True)).mean(1)[:, None],
                           np.quantile(r, [0.05, 0.5], axis=1).T], 1)


def test_shapes_differ_a_simple_feature_separates_them_but_not_perfectly():
    """Nearest class centroid on standardized rotation-invariant features, fitted on one seed, tested on another:
    well above chance (1/8) and below 100% (the task is not trivial)."""
    tr, te = shape_classes(40, 256, seed=1), shape_classes(40, 256, seed=2)
    f_tr, f_te = _features(tr.inputs), _features(te.inputs)
    mu, sd = f_tr.mean(0), f_tr.std(0)
    centroids = np.stack([((f_tr - mu) / sd)[tr.labels.numpy() == k].mean(0) for k in range(8)])
    pred = np.linalg.norm(((f_te - mu) / sd)[:, None] - centroids[None], axis=-1).argmin(1)
    accuracy = (pred == te.labels.numpy()).mean()
    assert 0.5 < accuracy < 0.99


# --- the blocks ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("normalization,n_iter", NORMS)
@pytest.mark.parametrize("inducing", [0, 4])
def test_set_transformer_is_permutation_invariant(normalization, n_iter, inducing):
    model, x = _model(normalization, n_iter, inducing), _cloud()
    perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(1))
    assert torch.allclose(model(x), model(x[:, perm]), atol=1e-10, rtol=0)


@pytest.mark.parametrize("normalization,n_iter", NORMS)
def test_sab_and_isab_are_permutation_equivariant(normalization, n_iter):
    torch.manual_seed(0)
    x = _cloud(n=25)
    perm = torch.randperm(25, generator=torch.Generator().manual_seed(2))
    for block in (SAB(3, 16, 2, normalization, n_iter), ISAB(3, 16, 2, 5, normalization, n_iter)):
        block = block.double()
        assert torch.allclose(block(x)[:, perm], block(x[:, perm]), atol=1e-10, rtol=0)


@pytest.mark.parametrize("normalization,n_iter", NORMS)
@pytest.mark.parametrize("inducing", [0, 4])
def test_padded_clouds_give_the_unpadded_logits(normalization, n_iter, inducing):
    """Clouds of 30 and 22 points padded to 30 with garbage: the padding mask makes each cloud's logits those of
    the cloud alone (padded keys get no weight, padded queries leave Sinkhorn's column constraint)."""
    model, x = _model(normalization, n_iter, inducing), _cloud(2, 30)
    padded = x.clone()
    padded[1, 22:] = 100.0
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[1, 22:] = True
    out = model(padded, key_padding_mask=mask)
    assert torch.allclose(out[0], model(x[:1])[0], atol=1e-10, rtol=0)
    assert torch.allclose(out[1], model(x[1:, :22])[0], atol=1e-10, rtol=0)


def test_sinkhorn_pooling_with_one_seed_is_mean_pooling_of_the_values():
    """One query: Sinkhorn's column step gives every key the same weight, so PMA is out_proj(mean_j v_j)."""
    torch.manual_seed(0)
    pma, x = PMA(8, heads=2, seeds=1, normalization="sinkhorn", n_iter=7).double(), _cloud(2, 11, seed=3)
    x = x.repeat(1, 1, 3)[..., :8]
    attn = pma.mab.attn
    w_v, b_v = attn.in_proj_weight[16:], attn.in_proj_bias[16:]
    q = pma.mab.fc_q(pma.seeds.expand(2, -1, -1).double())
    h = pma.mab.ln0(q + attn.out_proj((x @ w_v.T + b_v).mean(1, keepdim=True)))
    expected = pma.mab.ln1(h + torch.relu(pma.mab.fc_o(h)))
    assert torch.allclose(pma(x), expected, atol=1e-10, rtol=0)


def test_bad_configuration():
    with pytest.raises(ValueError, match="depth"):
        SetTransformer(depth=0)
    with pytest.raises(ValueError, match="size"):
        point_cloud_study((0,), size="huge")
    with pytest.raises(ValueError, match="overrides"):
        point_cloud_study((0,), n_heads=3)


# --- the interval and the study --------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_t_interval_matches_scipy(level):
    x = np.random.default_rng(0).normal(0.3, 0.1, size=7)
    mean, lo, hi = t_interval(x, level)
    ref = stats.t.interval(level, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert math.isclose(mean, x.mean(), rel_tol=1e-12)
    assert np.allclose((lo, hi), ref, rtol=1e-12, atol=0)


def test_t_interval_edge_cases():
    assert all(math.isnan(v) for v in t_interval([0.5])[1:])
    assert np.allclose(t_interval([0.2, 0.2, 0.2]), 0.2, rtol=0, atol=1e-15)  # no spread: the interval is a point
    for bad in ([], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="finite"):
            t_interval(bad)
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], 1.0)


@pytest.mark.parametrize("normalization,n_iter", NORMS)
def test_one_training_step_reaches_every_parameter_and_descends(normalization, n_iter):
    """One backward pass: finite gradients, nonzero for every parameter (inducing points and pooling seeds
    included); one small Adam step lowers the batch's loss (no dropout, so the loss is deterministic)."""
    d = shape_classes(2, 32, seed=0)
    torch.manual_seed(0)
    model = SetTransformer(n_classes=8, dim=16, heads=2, inducing=4, normalization=normalization, n_iter=n_iter,
                           dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss = torch.nn.functional.cross_entropy(model(d.inputs), d.labels)
    opt.zero_grad()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, name
    opt.step()
    with torch.no_grad():
        assert float(torch.nn.functional.cross_entropy(model(d.inputs), d.labels)) < float(loss)


def test_study_pairs_by_seed_one_half_iteration_is_softmax():
    """Sinkhorn with one half-iteration is SoftMax: same data, seed and batches -> identical runs, gap exactly 0."""
    r = point_cloud_study((0, 1), n_iter=1, n_train=2, n_test=2, n_points=16, epochs=2, dim=8, inducing=2, tail=1)
    assert r["accuracy"]["softmax"] == r["accuracy"]["sinkhorn"]
    assert r["difference"] == 0.0 and r["difference_ci95"] == (0.0, 0.0)
    assert len(r["curve"]["softmax"]) == 3 and r["setting"]["n_train"] == 2


# --- the reports' verdicts ---------------------------------------------------------------------------------------

def _study(acc_soft, acc_sink):
    from sinkflow.studies.point_clouds import SHAPE_CLASSES as classes

    diff = np.asarray(acc_sink) - np.asarray(acc_soft)
    return {"study": "point_cloud", "command": "point_cloud_study(...)", "wall_time": 1.0,
            "setting": {"size": "full", "inducing": 16, "dim": 32, "heads": 4, "dropout": 0.5, "n_iter": 7,
                        "classes": list(classes), "n_train": 125, "n_test": 50, "n_points": 64, "lr": 1e-3,
                        "batch_size": 64, "epochs": 8, "tail": 3, "seeds": list(range(len(acc_soft)))},
            "accuracy": {"softmax": acc_soft, "sinkhorn": acc_sink},
            "mean": {"softmax": float(np.mean(acc_soft)), "sinkhorn": float(np.mean(acc_sink))},
            "ci95": {"softmax": t_interval(acc_soft)[1:], "sinkhorn": t_interval(acc_sink)[1:]},
            "difference": float(diff.mean()), "difference_ci95": t_interval(diff)[1:],
            "curve": {"softmax": [0.1] * 9, "sinkhorn": [0.1] * 9}}


def test_point_cloud_verdict_follows_the_interval():
    """Gaps of +1..+3 points: Sinkhorn ahead, the paper's +2.1 inside; gaps around 0: unresolved, the paper's
    gap above the interval. The verdict line is routed through the reproducing page's study hook."""
    from sinkflow.studies.pages import reproducing_page

    soft = [0.50, 0.60, 0.55, 0.52]
    ahead = reproducing_page([_study(soft, [s + d for s, d in zip(soft, (0.01, 0.02, 0.03, 0.02), strict=True)])])
    line = next(row for row in ahead.splitlines() if row.startswith("**Verdict.**"))
    assert "Sinkhorn ahead" in line and "inside our interval" in line and "+2.1 points" in line
    flat = reproducing_page([_study(soft, [s + d for s, d in zip(soft, (0.01, -0.01, 0.005, -0.005), strict=True)])])
    line = next(row for row in flat.splitlines() if row.startswith("**Verdict.**"))
    assert "no difference resolved" in line and "above our interval" in line


def test_patch_trend_verdict_is_paired_by_seed():
    """Gap at patch 1 larger than at patch 4 in every seed by 4-5 points: 'grows as the patch shrinks'."""
    from sinkflow.studies._study_report import _patch_trend

    def row(p, gaps):
        soft = [0.8, 0.7, 0.9, 0.85]
        return {"patch_size": p,
                "accuracy": {"softmax": soft, "sinkhorn": [s + g for s, g in zip(soft, gaps, strict=True)]}}

    grows = _patch_trend([row(1, [0.04, 0.06, 0.05, 0.06]), row(4, [0.0, 0.01, 0.0, 0.02])])
    assert "grows as the patch shrinks" in grows and "+4.5 points" in grows
    assert "not shown" in _patch_trend([row(1, [0.01, -0.01, 0.0, 0.0]), row(4, [0.0, 0.0, 0.01, -0.01])])
