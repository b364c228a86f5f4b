"""Each loss family's gradient weight W(x) (`evaluator.formulas.gradients.decide`) against autograd through a
plain torch implementation of that loss, written from the trainers' docs (AReaL's ppo_actor_loss_fn with
rejection sampling, GSPO, SAPO, CISPO; verl's rollout correction; slime's TIS): W must equal
|d loss / d theta_logp| times the loss's token count, on random tokens that include sequences of one token
and sequences every token of which is rejected."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evaluator.formulas.gradients import Sequences, decide, weight
from evaluator.formulas.loss import Loss, Rule

F64 = torch.float64  # every tensor here is float64 (no global default: other tests train in float32)


def tokens(seed: int, lengths=(1, 3, 7, 12, 2, 9), spread: float = 0.35):
    """Random loss tokens in sequences of the given lengths: x = log pi_prox, b = behave, t = theta; the
    log-ratios cross PPO's band and the rules' bounds. Sequence 4 is made far off-policy (rejected)."""
    rng = np.random.default_rng(seed)
    code = np.repeat(np.arange(len(lengths)), lengths)
    n = len(code)
    x = -rng.gamma(1.5, 1.0, n)
    b = x - rng.normal(0, spread, n)
    b[code == 4] = x[code == 4] - 3.0  # exp(x - b) = 20: rejected by every upper bound used here
    b[[5, 13, 20]] = x[[5, 13, 20]] - 2.0  # single tokens of longer sequences past a bound of 5
    t = x + rng.normal(0, spread, n)
    t[code == 3] += 0.5 + rng.normal(0, 0.8, (code == 3).sum())  # far from prox: clips and dual clips
    advantage = np.repeat(rng.normal(0, 1, len(lengths)), lengths) + rng.normal(0, 0.3, n)
    return x, b, t, advantage, Sequences(code, len(lengths))


def statistic(name: str, d: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The rules' statistics, as AReaL's apply_rejection_sampling and verl's helper define them."""
    if name == "ratio":
        return torch.exp(d)
    if name == "kl_k1":
        return d
    if name == "kl_k2":
        return d**2 / 2
    if name == "kl_k3":  # AReaL's code: exp(b - x) - 1 - (b - x)
        return torch.exp(-d) - 1 + d
    if name == "kl_k3_reverse":  # verl: exp(x - b) - 1 - (x - b)
        return torch.exp(d) - 1 - d
    p, q = (torch.clamp(torch.exp(v), 1e-8, 1 - 1e-8) for v in (x, b))

    def kl(u, v):
        return u * torch.log(u / v) + (1 - u) * torch.log((1 - u) / (1 - v))

    return torch.maximum(kl(p, q), kl(q, p))


def correction(loss: Loss, x, b, code) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, kept) by the docs, one sequence at a time: the behaviour weight, then each rule."""
    d = x - b
    n = len(x)
    seqs = [np.flatnonzero(code == s) for s in np.unique(code)]
    if loss.behave_weight == "none":
        w = torch.ones(n, dtype=F64)
    elif loss.behave_weight == "token":
        w = torch.exp(d)
    else:
        w = torch.empty(n, dtype=F64)
        for idx in seqs:
            total = d[idx].sum() if loss.behave_weight == "sequence_product" else d[idx].mean()
            w[idx] = torch.exp(total)
    kept = torch.ones(n, dtype=torch.bool)
    for rule in loss.rules:
        value = statistic(rule.statistic, d, x, b)
        if rule.level == "sequence":
            per = torch.empty(n, dtype=F64)
            for idx in seqs:
                if rule.statistic == "ratio":  # aggregated in log space
                    agg = {
                        "sum": d[idx].sum(),
                        "mean": d[idx].mean(),
                        "max": d[idx].max(),
                        "min": d[idx].min(),
                    }
                    per[idx] = torch.exp(agg[rule.agg])
                else:
                    v = value[idx]
                    per[idx] = {"sum": v.sum(), "mean": v.mean(), "max": v.max(), "min": v.min()}[rule.agg]
            value = per
        inside = torch.ones(n, dtype=torch.bool)
        if rule.lower is not None:
            inside &= value >= rule.lower
        if rule.upper is not None:
            inside &= value <= rule.upper
        if rule.action == "mask":
            kept &= inside
        else:
            lo = -math.inf if rule.lower is None else rule.lower
            hi = math.inf if rule.upper is None else rule.upper
            w = torch.where(inside, w, torch.clamp(w, lo, hi))
    return w, kept


def reference_loss(loss: Loss, t, x, b, advantage, code) -> torch.Tensor:
    """The summed per-token loss of the docs (the normalisation by the token count left out)."""
    w, kept = correction(loss, x, b, code)
    A = advantage
    if loss.ratio_level == "sequence":
        ratio, A = torch.empty(len(t), dtype=F64), A.clone()
        for s in np.unique(code):
            idx = torch.as_tensor(np.flatnonzero(code == s))
            k = idx[kept[idx]]
            if len(k) == 0:
                ratio[idx] = 1.0
                continue
            ratio[idx] = torch.exp((t[k] - x[k]).mean())  # GSPO: gradient flows through every token of s
            A[idx] = A[k].mean()
            w[idx] = w[k].mean()
    else:
        ratio = torch.exp(t - x)
    low, high = 1 - loss.eps_low, 1 + loss.eps_high
    if loss.policy == "ppo":
        per = torch.maximum(-A * ratio, -A * torch.clamp(ratio, low, high))
        if loss.dual_clip is not None:
            per = torch.where(A < 0, torch.minimum(per, -A * loss.dual_clip), per)
    elif loss.policy == "cispo":
        per = -torch.clamp(ratio, low, high).detach() * A * t
    else:
        tau = torch.where(
            A > 0, torch.tensor(loss.sapo_tau_pos, dtype=F64), torch.tensor(loss.sapo_tau_neg, dtype=F64)
        )
        per = -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * A
    return (per * w * kept).sum()


LOSSES = {
    "PPO without a behaviour weight (AReaL's default)": Loss(behave_weight="none", rules=()),
    "PPO, token weight masked above 5": Loss(),
    "PPO, dual clip 1.3, eps_high 0.28": Loss(eps_high=0.28, dual_clip=1.3),
    "PPO, token weight clamped to [0.5, 2]": Loss(rules=(Rule(lower=0.5, upper=2.0, action="clamp"),)),
    "PPO, token kl_k2 mask": Loss(rules=(Rule(statistic="kl_k2", upper=0.02),)),
    "PPO, token kl_k3 mask": Loss(rules=(Rule(statistic="kl_k3", upper=0.03),)),
    "PPO, token kl_k3_reverse mask": Loss(rules=(Rule(statistic="kl_k3_reverse", upper=0.03),)),
    "PPO, token binary_kl mask": Loss(rules=(Rule(statistic="binary_kl", upper=0.02),)),
    "PPO, sequence geometric-mean weight, masked outside [0.8, 1.25]": Loss(
        behave_weight="sequence_mean", rules=(Rule("sequence", "ratio", "mean", lower=0.8, upper=1.25),)
    ),
    "PPO, sequence product weight, clamped to 2 by the product (AReaL agg sum)": Loss(
        behave_weight="sequence_mean", rules=(Rule("sequence", "ratio", "sum", upper=2.0, action="clamp"),)
    ),
    "PPO, verl seq IS (product, truncated at 2)": Loss(
        behave_weight="sequence_product",
        dual_clip=3.0,
        rules=(Rule("sequence", "ratio", "sum", upper=2.0, action="clamp"),),
    ),
    "PPO, verl geo-RS + token TIS": Loss(
        dual_clip=3.0,
        rules=(Rule(upper=2.0, action="clamp"), Rule("sequence", "kl_k1", "mean", lower=-0.3, upper=0.3)),
    ),
    "PPO, sequence kl_k2 max and min-ratio veto": Loss(
        rules=(Rule("sequence", "kl_k2", "max", upper=0.1), Rule("sequence", "ratio", "min", lower=0.3)),
    ),
    "GSPO, token weight masked above 5": Loss(ratio_level="sequence"),
    "GSPO, dual clip, sequence ratio rule": Loss(
        ratio_level="sequence",
        dual_clip=1.5,
        behave_weight="sequence_mean",
        rules=(Rule("sequence", "ratio", "mean", upper=5.0),),
    ),
    "GSPO without a behaviour weight": Loss(ratio_level="sequence", behave_weight="none", rules=()),
    "SAPO, token": Loss(policy="sapo", behave_weight="none", rules=()),
    "SAPO, token, with verl's token IS": Loss(policy="sapo", rules=(Rule(upper=2.0, action="clamp"),)),
    "SAPO, sequence": Loss(policy="sapo", ratio_level="sequence", behave_weight="none", rules=()),
    "CISPO, band [0, 5], no weight": Loss(
        policy="cispo", eps_low=1.0, eps_high=4.0, behave_weight="none", rules=()
    ),
    "CISPO, band [0.8, 1.28], token weight masked above 5": Loss(policy="cispo", eps_high=0.28),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(LOSSES))
def test_w_is_the_autograd_gradient_of_the_loss(name, seed):
    loss = LOSSES[name]
    x, b, t, advantage, seq = tokens(seed)
    theta = torch.tensor(t, dtype=F64, requires_grad=True)
    total = reference_loss(loss, theta, *(torch.tensor(v, dtype=F64) for v in (x, b, advantage)), seq.code)
    (grad,) = torch.autograd.grad(total, theta)
    got = decide(
        x, t=t, b=b, advantage=advantage, abs_advantage=np.abs(advantage), off_policy_weight=weight(t - b),
        seq=seq, loss=loss,
    )  # fmt: skip
    np.testing.assert_allclose(got.grad_weight, np.abs(grad.numpy()), rtol=1e-10, atol=1e-12)
    assert np.isfinite(got.grad_weight).all()


def test_the_cases_exercise_every_decision():
    """The random tokens clip, dual-clip and reject some tokens (else the comparison above proves little)."""
    x, b, t, advantage, seq = tokens(0)
    common = dict(
        t=t, b=b, advantage=advantage, abs_advantage=np.abs(advantage), off_policy_weight=weight(t - b)
    )
    ppo = decide(x, seq=seq, loss=Loss(dual_clip=1.3), **common)
    assert 0 < ppo.clip.sum() < len(x) and ppo.dual_clip.any() and ppo.bound.any() and not ppo.bound.all()
    gspo = decide(x, seq=seq, loss=Loss(ratio_level="sequence"), **common)
    assert gspo.sequence_clip.any() and (gspo.grad_weight[seq.code == 4] == 0).all()


def test_an_estimate_that_flips_nothing_has_exactly_the_true_weight():
    """Token PPO with a token behaviour weight: prox cancels, bit for bit, where no decision flips."""
    x, b, t, advantage, seq = tokens(3)
    common = dict(
        t=t, b=b, advantage=advantage, abs_advantage=np.abs(advantage), off_policy_weight=weight(t - b)
    )
    truth = decide(x, seq=seq, loss=Loss(), **common)
    nudged = decide(x + 1e-9, seq=seq, loss=Loss(), **common)
    same = (truth.clip == nudged.clip) & (truth.bound == nudged.bound)
    assert same.sum() > 0.9 * len(x)
    np.testing.assert_array_equal(truth.grad_weight[same], nudged.grad_weight[same])


def test_a_sequence_level_loss_needs_the_sequences():
    x, b, t, advantage, _ = tokens(0)
    with pytest.raises(ValueError, match="per sequence"):
        decide(x, t=t, b=b, advantage=advantage, abs_advantage=1.0, off_policy_weight=weight(t - b),
               seq=None, loss=Loss(ratio_level="sequence"))  # fmt: skip
