"""The losses the trainers ship today (issue 36): each W(x) of `evaluator.formulas.gradients.decide`
against autograd through a plain torch loss written from the trainer's own source, and the clip decisions
against the trainer's own clip statistic (issue 31: GSPO and CISPO count a clip only on the tokens the
rejection keeps, as AReaL's `clip_mask`).

Sources, read at: AReaL cbff54d `areal/utils/functional/functional.py` (ppo_actor_loss_fn,
_compute_sequence_level_ratio_and_advantages, cispo_loss_fn) and `areal/trainer/ppo/actor.py`
(_apply_m2po_masking, _get_m2po_loss_mask); verl 1dda039 `verl/trainer/ppo/core_algos.py`
(compute_policy_loss_dppo_tv, compute_policy_loss_dppo_kl, compute_policy_loss_geo_mean,
compute_policy_loss_dro); prime-rl 559b447 `src/prime_rl/trainer/rl/loss.py` (default_loss_fn,
ipo_loss_fn); slime 624b824 `slime/utils/ppo_utils.py` (compute_opsm_mask, compute_policy_loss)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evaluator.formulas.gradients import Sequences, decide, weight
from evaluator.formulas.loss import Loss, Rule
from tests.test_gradients import correction, tokens

F64 = torch.float64


def extreme(seed: int):
    """`tokens` with a few log-ratios t - x beyond verl's [-20, 20] clamp, both ways."""
    x, b, t, advantage, seq = tokens(seed)
    x[[2, 9]], t[[2, 9]] = -31.0, -4.0  # t - x = 27
    x[[15]], t[[15]] = -1.0, -26.0  # t - x = -25
    b[[2, 9, 15]] = x[[2, 9, 15]] - 0.1
    return x, b, t, advantage, seq


def per_sequence(code: np.ndarray):
    return [torch.as_tensor(np.flatnonzero(code == s)) for s in np.unique(code)]


def verl_dppo(loss: Loss, t, x, A, w, mask) -> torch.Tensor:
    """compute_policy_loss_dppo_tv / _kl, summed (the token mean's normaliser left out)."""
    ratio = torch.exp(torch.clamp(t - x, -20.0, 20.0))
    truncated = torch.clamp(ratio, max=loss.dual_clip).detach()
    prob, old_prob = torch.exp(t), torch.exp(x)
    if loss.policy == "dppo_tv":
        pos, neg = (prob - old_prob) <= loss.eps_high, (prob - old_prob) >= -loss.eps_low
    else:
        kl = old_prob * (x - t) + (1 - old_prob) * torch.log((1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
        pos = (kl <= loss.eps_high) | (prob <= old_prob)
        neg = (kl <= loss.eps_low) | (prob >= old_prob)
    valid = torch.where(A > 0, pos, neg).detach().to(F64)
    return (-A * truncated * t * valid * w * mask).sum()


def prime_rl(loss: Loss, t, x, A, w, mask) -> torch.Tensor:
    """default_loss_fn (DPPO-Binary-TV + KL) or ipo_loss_fn, with adv_tau 1 (prox in the role of the
    inference log-probs)."""
    log_ratio = t - x
    diff = torch.exp(t) - torch.exp(x)
    if loss.policy == "ipo":
        masked = diff.abs() > loss.eps_high
    else:
        masked = torch.where(A > 0, diff > loss.eps_high, diff < -loss.eps_low)
    keep = mask.bool() & ~masked
    per_token = -(keep * A * torch.exp(log_ratio)) + loss.kl_penalty * mask * log_ratio**2
    return (per_token * w).sum()


def verl_geo_mean(loss: Loss, t, x, A, w, mask, code) -> torch.Tensor:
    """compute_policy_loss_geo_mean per sequence (rows of the padded batch), summed over sequences."""
    total = torch.zeros((), dtype=F64)
    for idx in per_sequence(code):
        lr, a, m = t[idx] - x[idx], A[idx], mask[idx]
        sgn = torch.sign(a)
        clamped = torch.clamp(lr, -loss.eps_low, loss.eps_high)
        lr_min = sgn * torch.min(sgn * lr, sgn * clamped)
        length = m.sum()
        ratio = torch.exp((lr_min * m).sum() / (length + 1e-8))
        advantage = (a * m).sum() / (length + 1e-8)
        seq_weight = torch.exp((torch.log(w[idx] + 1e-10) * m).sum() / (length + 1e-8))
        total = total - advantage * ratio * seq_weight
    return total


def verl_dro(beta: float, t, x, A, w, mask) -> torch.Tensor:
    """compute_policy_loss_dro."""
    return (-(t * A - 0.5 * beta * (t - x) ** 2) * w * mask).sum()


def slime_opsm_ppo(loss: Loss, t, x, A, mask, code) -> torch.Tensor:
    """slime's compute_policy_loss (clip, dual clip) times compute_opsm_mask."""
    ratio = torch.exp(t - x)
    pg = torch.maximum(-ratio * A, -ratio.clamp(1 - loss.eps_low, 1 + loss.eps_high) * A)
    opsm = torch.ones_like(t)
    for idx in per_sequence(code):
        seq_kl = ((x[idx] - t[idx]) * mask[idx]).sum() / torch.clamp_min(mask[idx].sum(), 1)
        opsm[idx] = 1 - ((A[idx] < 0) & (seq_kl > loss.opsm_delta)).to(F64)
    return (pg * opsm * mask).sum()


def autograd(loss_fn, t: np.ndarray, *columns) -> np.ndarray:
    theta = torch.tensor(t, dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss_fn(theta, *columns), theta)
    return np.abs(grad.numpy())


def weights_and_mask(loss: Loss, x, b, code):
    """The behaviour weight after the rules and the kept tokens (tests/test_gradients.py's `correction`)."""
    w, kept = correction(loss, torch.tensor(x, dtype=F64), torch.tensor(b, dtype=F64), code)
    return w.detach(), kept.to(F64)


def decided(loss: Loss, x, b, t, advantage, seq):
    return decide(x, t=t, b=b, advantage=advantage, abs_advantage=np.abs(advantage),
                  off_policy_weight=weight(t - b), seq=seq, loss=loss)  # fmt: skip


TV_RULE = (Rule(upper=2.0, action="clamp"), Rule("sequence", "kl_k1", "mean", lower=-0.3, upper=0.3))
VERL = {
    "verl dppo_tv, no correction": Loss(policy="dppo_tv", eps_low=0.05, eps_high=0.08, dual_clip=20.0,
                                        behave_weight="none", rules=()),
    "verl dppo_tv, truncation 1.1, token TIS + geo RS": Loss(policy="dppo_tv", eps_low=0.05, eps_high=0.05,
                                                             dual_clip=1.1, rules=TV_RULE),
    "verl dppo_kl, no correction": Loss(policy="dppo_kl", eps_low=0.01, eps_high=0.02, dual_clip=20.0,
                                        behave_weight="none", rules=()),
    "verl dppo_kl, sequence IS": Loss(policy="dppo_kl", eps_low=0.01, eps_high=0.01, dual_clip=3.0,
                                      behave_weight="sequence_product",
                                      rules=(Rule("sequence", "ratio", "sum", upper=2.0, action="clamp"),)),
}  # fmt: skip


PRIME = {
    "prime-rl default": Loss(policy="dppo_tv", kl_penalty=1e-3, behave_weight="none", rules=()),
    "prime-rl default, tight mask, large tau": Loss(policy="dppo_tv", eps_low=0.03, eps_high=0.05,
                                                    kl_penalty=0.3, behave_weight="none", rules=()),
    "prime-rl ipo": Loss(policy="ipo", eps_low=0.1, eps_high=0.1, kl_penalty=1e-3, behave_weight="none",
                         rules=()),
}  # fmt: skip


DPPO = {**{k: (v, verl_dppo) for k, v in VERL.items()}, **{k: (v, prime_rl) for k, v in PRIME.items()}}


@pytest.mark.parametrize("make", [tokens, extreme], ids=["random", "extreme"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(DPPO))
def test_dppo_family_is_autograd(name, seed, make):
    """verl's dppo_tv and dppo_kl, prime-rl's default loss and ipo: W is autograd through each source's
    loss (prime-rl: prox in the role of its inference log-probs), and the mask decides both ways."""
    loss, reference = DPPO[name]
    x, b, t, advantage, seq = make(seed)
    t = np.minimum(t, -1e-3)  # a log-prob: the Bernoulli KL's log needs exp(t) < 1
    w, mask = weights_and_mask(loss, x, b, seq.code)
    columns = [torch.tensor(v, dtype=F64) for v in (x, advantage)]
    expected = autograd(lambda th, xx, a: reference(loss, th, xx, a, w, mask), t, *columns)
    got = decided(loss, x, b, t, advantage, seq)
    np.testing.assert_allclose(got.grad_weight, expected, rtol=1e-10, atol=1e-12)
    assert 0 < got.clip.sum() < len(x)


GMPO = {
    "verl geo_mean, clip 0.4, no correction": Loss(policy="gmpo", ratio_level="sequence", eps_low=0.4,
                                                   eps_high=0.4, behave_weight="none", rules=()),
    "verl geo_mean, clip 0.1, token TIS + geo RS": Loss(policy="gmpo", ratio_level="sequence", eps_low=0.1,
                                                        eps_high=0.15, rules=TV_RULE),
    "verl geo_mean, sequence IS": Loss(policy="gmpo", ratio_level="sequence", eps_low=0.2, eps_high=0.2,
                                       behave_weight="sequence_product",
                                       rules=(Rule("sequence", "ratio", "sum", upper=2.0, action="clamp"),)),
}  # fmt: skip


@pytest.mark.parametrize("make", [tokens, extreme], ids=["random", "extreme"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(GMPO))
def test_verl_geo_mean_is_autograd(name, seed, make):
    loss = GMPO[name]
    x, b, t, advantage, seq = make(seed)
    advantage[[4, 11]] = 0.0  # A = 0: no gradient, yet counted in the sequence's length
    w, mask = weights_and_mask(loss, x, b, seq.code)
    columns = [torch.tensor(v, dtype=F64) for v in (x, advantage)]
    expected = autograd(lambda th, xx, a: verl_geo_mean(loss, th, xx, a, w, mask, seq.code), t, *columns)
    got = decided(loss, x, b, t, advantage, seq)
    np.testing.assert_allclose(got.grad_weight, expected, rtol=1e-10, atol=1e-14)
    assert got.clip.any() and not got.clip.all()


@pytest.mark.parametrize("beta", [0.05, 2.0])
@pytest.mark.parametrize("rules", [(), TV_RULE], ids=["none", "tis-rs"])
def test_verl_dro_is_autograd(beta, rules):
    loss = Loss(policy="pg", kl_penalty=beta / 2, behave_weight="token" if rules else "none", rules=rules)
    x, b, t, advantage, seq = extreme(3)
    w, mask = weights_and_mask(loss, x, b, seq.code)
    columns = [torch.tensor(v, dtype=F64) for v in (x, advantage)]
    expected = autograd(lambda th, xx, a: verl_dro(beta, th, xx, a, w, mask), t, *columns)
    got = decided(loss, x, b, t, advantage, seq)
    np.testing.assert_allclose(got.grad_weight, expected, rtol=1e-10, atol=1e-14)
    assert got.clip is None


@pytest.mark.parametrize("delta", [1e-4, 0.05])
def test_slime_opsm_is_autograd(delta):
    loss = Loss(behave_weight="none", rules=(), opsm_delta=delta)
    x, b, t, advantage, seq = tokens(4)
    t[seq.code == 5] -= 0.4  # mean x - t of 0.23: its tokens with A < 0 are dropped
    ones = torch.ones(len(x), dtype=F64)
    columns = [torch.tensor(v, dtype=F64) for v in (x, advantage)]
    expected = autograd(lambda th, xx, a: slime_opsm_ppo(loss, th, xx, a, ones, seq.code), t, *columns)
    got = decided(loss, x, b, t, advantage, seq)
    np.testing.assert_allclose(got.grad_weight, expected, rtol=1e-10, atol=1e-14)
    dropped = got.bound & (got.grad_weight == 0)
    assert dropped.any() and not dropped.all()
    assert (got.clip == decided(Loss(behave_weight="none", rules=()), x, b, t, advantage, seq).clip).all()


def areal_ppo(level: str, t, x, A, loss_mask, w, seq_idx, n_seq: int, eps_low, eps_high, c_clip=None):
    """AReaL's ppo_actor_loss_fn on packed tokens after apply_rejection_sampling: `loss_mask` the
    post-rejection mask, `w` the behaviour weight (1 without rejection sampling); the statistics' mask is
    every loss token. Returns (the summed loss, clip_mask, dual_clip_mask)."""
    if level == "sequence":  # _compute_sequence_level_ratio_and_advantages, 1D branch
        zeros = torch.zeros(n_seq, dtype=F64)
        log_ratio_sum = zeros.scatter_add(0, seq_idx, torch.where(loss_mask, t - x, 0.0))
        advantage_sum = zeros.scatter_add(0, seq_idx, torch.where(loss_mask, A, 0.0))
        count = zeros.scatter_add(0, seq_idx, loss_mask.to(F64)).clamp(min=1)
        ratio = torch.where(loss_mask, torch.exp(log_ratio_sum / count)[seq_idx], 0.0)
        advantage = torch.where(loss_mask, (advantage_sum / count)[seq_idx], 0.0)
    else:
        ratio, advantage = torch.exp(t - x), A
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg_loss1, pg_loss2 = -advantage * ratio, -advantage * clipped
    clip_mask = pg_loss1.detach() < pg_loss2.detach()
    pg_loss = torch.max(pg_loss1, pg_loss2)
    dual_clip_mask = torch.zeros_like(clip_mask)
    if c_clip is not None:
        pg_loss3 = torch.sign(advantage) * c_clip * advantage
        dual_clip_mask = pg_loss3.detach() < pg_loss.detach()
        pg_loss = torch.min(pg_loss, pg_loss3)
    return torch.where(loss_mask, pg_loss * w, 0.0).sum(), clip_mask, dual_clip_mask


def areal_cispo(t, x, A, loss_mask, w, eps_low, eps_high):
    """AReaL's cispo_loss_fn after apply_rejection_sampling: (the summed loss, clip_mask)."""
    ratio = torch.exp((t - x).detach())
    ratio_clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    pg_loss = -ratio_clipped * A * t * w
    return torch.where(loss_mask, pg_loss, 0.0).sum(), (ratio_clipped != ratio).logical_and(loss_mask)


def areal_m2po(x, b, group, threshold) -> np.ndarray:
    """AReaL's _apply_m2po_masking and _get_m2po_loss_mask, one minibatch (group) at a time."""
    keep = np.zeros(len(x), dtype=bool)
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        m2 = torch.tensor((b[idx] - x[idx]) ** 2, dtype=F64)
        sorted_m2, indices = torch.sort(m2, descending=True)
        n = sorted_m2.numel()
        suffix = sorted_m2.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=F64)
        below = torch.where(suffix < threshold)[0]
        k = below[0].item() if len(below) > 0 else n - 1
        mask = torch.ones(n, dtype=torch.bool)
        mask[:k] = False
        keep[idx] = mask[torch.argsort(indices)].numpy()
    return keep


AREAL = {
    "GSPO, token weight masked above 1.3": (Loss(ratio_level="sequence", rules=(Rule(upper=1.3),)), None),
    "GSPO, dual clip, sequence rejection": (
        Loss(
            ratio_level="sequence",
            dual_clip=1.2,
            behave_weight="sequence_mean",
            rules=(Rule("sequence", "ratio", "mean", lower=0.8, upper=1.25),),
        ),
        None,
    ),  # fmt: skip
    "CISPO, band 0.2, token weight masked above 1.3": (Loss(policy="cispo", rules=(Rule(upper=1.3),)), None),
    "PPO, dual clip, M2PO 0.02, one minibatch": (Loss(dual_clip=1.3, m2_threshold=0.02), None),
    "PPO, M2PO 0.02, two minibatches": (Loss(m2_threshold=0.02), np.array([0, 1, 0, 1, 1, 0])),
    "GSPO, M2PO 0.05, no behaviour weight": (
        Loss(ratio_level="sequence", behave_weight="none", rules=(), m2_threshold=0.05),
        None,
    ),  # fmt: skip
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(AREAL))
def test_areal_loss_and_clip_mask(name, seed):
    """W is autograd through AReaL's loss, and the clip and dual-clip decisions are AReaL's clip_mask and
    dual_clip_mask: under GSPO and CISPO false on the rejected tokens, under token PPO counted there, and
    false on every token M2PO drops."""
    loss, groups = AREAL[name]
    x, b, t, advantage, seq = tokens(seed)
    seq = Sequences(seq.code, seq.n, groups)
    m2po = np.ones(len(x), dtype=bool)
    if loss.m2_threshold is not None:
        m2po = areal_m2po(x, b, seq.minibatch(), loss.m2_threshold)
        assert 0 < m2po.sum() < len(x)
    w, kept = weights_and_mask(loss, x[m2po], b[m2po], seq.code[m2po])
    loss_mask, weights = torch.zeros(len(x), dtype=torch.bool), torch.ones(len(x), dtype=F64)
    loss_mask[torch.as_tensor(m2po)], weights[torch.as_tensor(m2po)] = kept.bool(), w
    theta = torch.tensor(t, dtype=F64, requires_grad=True)
    x_, a_ = (torch.tensor(v, dtype=F64) for v in (x, advantage))
    if loss.policy == "cispo":
        total, clip_mask = areal_cispo(theta, x_, a_, loss_mask, weights, loss.eps_low, loss.eps_high)
        dual_mask = None
    else:
        total, clip_mask, dual_mask = areal_ppo(
            loss.ratio_level, theta, x_, a_, loss_mask, weights, torch.as_tensor(seq.code), seq.n,
            loss.eps_low, loss.eps_high, loss.dual_clip,
        )  # fmt: skip
    clip_mask = clip_mask & torch.as_tensor(m2po)  # AReaL's statistics mask is the post-M2PO loss mask
    (grad,) = torch.autograd.grad(total, theta)
    got = decided(loss, x, b, t, advantage, seq)
    np.testing.assert_allclose(got.grad_weight, np.abs(grad.numpy()), rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(got.clip, clip_mask.numpy())
    if loss.dual_clip is not None:
        np.testing.assert_array_equal(got.dual_clip, (dual_mask & torch.as_tensor(m2po)).numpy())
    rejected = ~loss_mask.numpy()
    assert rejected.any() and not rejected.all()
    if loss.ratio_level == "token" and loss.policy == "ppo":  # counted on rejected tokens too
        ratio = np.exp(t - x)[rejected & m2po]
        assert got.clip[rejected & m2po].any() or not ((ratio > 1.2) | (ratio < 0.8)).any()


FIXTURE_U = 1.5
"""rejection_sampling {metric: ratio, upper: 1.5, action: mask}: at AReaL's 5.0 the estimates reject 1
token of the fixtures' first 30 steps, at 1.5 they reject 528."""
FIXTURE_LOSSES = {
    "GSPO": Loss(ratio_level="sequence", rules=(Rule(upper=FIXTURE_U),)),
    "CISPO, band 0.2": Loss(policy="cispo", rules=(Rule(upper=FIXTURE_U),)),
}


@pytest.mark.parametrize("name", list(FIXTURE_LOSSES))
def test_fixture_clip_flip_rates_are_areal_clip_mask_statistics(name, tmp_path):
    """On the SmolLM2 fixture runs, each estimator's clip flip rate in the store equals the rate at which
    AReaL's own clip_mask (AReaL's loss above, run on the fixture tokens with the estimate and with
    prox_logp) differs, per run; and rejection removes tokens there, so the rule matters."""
    from evaluator.replay.pipeline import replay
    from evaluator.store import open_store
    from tests.conftest import FIXTURES
    from tests.reference import estimates, loss_tokens

    loss = FIXTURE_LOSSES[name]
    files = [p for run in ("recompute", "loglinear") for p in sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]]
    replay(files, tmp_path / "m", progress=False, loss=loss)
    with open_store(tmp_path / "m") as con:
        got = con.sql("SELECT run_id, method, clip_flip_rate FROM decision_summary").df()
    df = loss_tokens(files)
    seq_idx = torch.tensor(df.groupby(["run_id", "seq_id", "minibatch"], sort=False).ngroup().to_numpy())
    n_seq = int(seq_idx.max()) + 1
    b, t, A = (torch.tensor(df[c].to_numpy(np.float64)) for c in ("behave_logp", "theta_logp", "advantage"))

    def clip_mask(x: np.ndarray) -> np.ndarray:
        x_ = torch.tensor(x)
        loss_mask = torch.exp(x_ - b) <= FIXTURE_U
        if loss.policy == "cispo":
            return areal_cispo(t, x_, A, loss_mask, torch.exp(x_ - b), 0.2, 0.2)[1].numpy()
        return areal_ppo("sequence", t, x_, A, loss_mask, torch.exp(x_ - b), seq_idx, n_seq, 0.2, 0.2)[
            1
        ].numpy()

    per_method = estimates(df)
    truth = clip_mask(per_method["ground_truth"])
    judged = ~df.groupby(["run_id", "seq_id", "minibatch"])["prox_logp"].transform(lambda g: g.isna().any())
    runs = df["run_id"].to_numpy()[judged]
    checked, rejected = 0, 0
    for method, x in per_method.items():
        if method in ("ground_truth", "proximal_t") or np.isnan(x).any():
            continue
        rejected += int((np.exp(x - b.numpy()) > FIXTURE_U).sum())
        flips = pd_rate(runs, (clip_mask(x) != truth)[judged])
        for run, rate in flips.items():
            row = got[(got["run_id"] == run) & (got["method"] == method)]
            assert row["clip_flip_rate"].item() == pytest.approx(rate, rel=1e-12, abs=1e-15), (run, method)
            checked += 1
    assert checked >= 14 and rejected > 100  # the estimates' rejection removes tokens: the rule matters


def pd_rate(runs: np.ndarray, flags: np.ndarray) -> dict[str, float]:
    return {run: float(flags[runs == run].mean()) for run in np.unique(runs)}
