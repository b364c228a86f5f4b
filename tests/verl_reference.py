"""verl's rollout-correction diagnostics written out in torch from verl's source, with none of proxaudit's
code: verl-project/verl 1dda039 `verl/trainer/ppo/rollout_corr_helper.py` (compute_rollout_correction_weights
and compute_is_metrics at rollout_is_threshold 2.0, TIS; compute_offpolicy_metrics; compute_rs_metrics of
the sequence-level options, the statistics that need no threshold) and `verl/utils/debug/metrics.py`
(calculate_debug_metrics). Inputs are verl's padded batch: `old` (the training log-probs, here an estimate of
prox), `rollout` (behave_logp), `mask` (1 on response tokens), float64 `[batch, length]`. verl's masked_mean
divides by the count + 1e-8; this reference, like proxaudit, by the count (they differ by 1e-8 / count
relative).
`tests/verl_check.py` runs verl's own functions on the same batches."""

from __future__ import annotations

import math

import torch

BOUND = 20.0
T = 2.0
SEQUENCE_OPTIONS = [(k, agg) for k in (1, 2, 3) for agg in ("sum", "mean", "max") if (k, agg) != (1, "max")]


def masked_mean(x, mask, axis=None):
    if axis is None:
        return (x * mask).sum() / mask.sum()
    return (x * mask).sum(axis) / mask.sum(axis)


def is_metrics(log_ratio, mask, mode: str) -> dict[str, float]:
    """compute_rollout_correction_weights then compute_is_metrics (threshold 2.0, no lower bound: TIS)."""
    if mode == "token":
        raw = torch.exp(torch.clamp(log_ratio, -BOUND, BOUND)) * mask
        for_metrics = log_ratio
    else:
        for_metrics = (log_ratio * mask).sum(-1, keepdim=True)
        raw = torch.exp(torch.clamp(for_metrics, -BOUND, BOUND)).expand_as(log_ratio) * mask
    weights = raw.clamp(max=T)
    out = {}
    if mode == "sequence":
        out["max"] = math.exp(min(for_metrics.max().item(), BOUND))
        out["min"] = math.exp(for_metrics.min().item())
        out["ratio_fraction_high"] = (for_metrics > math.log(T)).double().mean().item()
        out["ratio_fraction_low"] = (for_metrics < math.log(1 / T)).double().mean().item()
    else:
        out["ratio_fraction_high"] = masked_mean((raw > T).double(), mask).item()
        out["ratio_fraction_low"] = masked_mean((raw < 1 / T).double(), mask).item()
        out["max"] = weights.masked_fill(mask == 0, -math.inf).max().item()
        out["min"] = weights.masked_fill(mask == 0, math.inf).min().item()
    out["mean"] = masked_mean(weights, mask).item()
    clamped = weights.clamp(min=0.0, max=T)
    mean = masked_mean(clamped, mask)
    out["std"] = math.sqrt(max((masked_mean(clamped**2, mask) - mean**2).item(), 0.0))
    out["eff_sample_size"] = 1.0 / masked_mean((clamped / (mean + 1e-8)) ** 2, mask).item()
    per_seq = masked_mean(weights, mask, -1)
    out["seq_mean"], out["seq_std"] = per_seq.mean().item(), per_seq.std().item()
    out["seq_max"], out["seq_min"] = per_seq.max().item(), per_seq.min().item()
    out["seq_max_deviation"] = (per_seq - 1.0).abs().max().item()
    raw_per_seq = masked_mean(raw, mask, -1)
    out["seq_fraction_high"] = (raw_per_seq > T).double().mean().item()
    out["seq_fraction_low"] = (raw_per_seq < 1 / T).double().mean().item()
    out["batch_norm_factor"] = out["mean"] if mode == "token" else per_seq.mean().item()
    return {f"rollout_is_{k}": v for k, v in out.items()}


def offpolicy_metrics(old, rollout, mask) -> dict[str, float]:
    """compute_offpolicy_metrics."""
    out = {}
    mean_old, mean_rollout = masked_mean(old, mask, -1), masked_mean(rollout, mask, -1)
    out["training_ppl"] = torch.exp(-mean_old).mean().item()
    out["training_log_ppl"] = (-mean_old).mean().item()
    out["kl"] = masked_mean(rollout - old, mask).item()
    log_ratio = old - rollout
    out["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask).item()
    out["rollout_ppl"] = torch.exp(-mean_rollout).mean().item()
    out["rollout_log_ppl"] = (-mean_rollout).mean().item()
    diff = mean_rollout - mean_old
    out["log_ppl_diff"], out["log_ppl_abs_diff"] = diff.mean().item(), diff.abs().mean().item()
    out["log_ppl_diff_max"], out["log_ppl_diff_min"] = diff.max().item(), diff.min().item()
    out["ppl_ratio"] = torch.exp(diff).mean().item()
    rho = torch.exp(torch.clamp(log_ratio, -BOUND, BOUND))
    out["chi2_token"] = (masked_mean(rho**2, mask) - 1.0).item()
    seq_sum = torch.clamp((log_ratio * mask).sum(-1), -BOUND, BOUND)
    out["chi2_seq"] = (torch.exp(2.0 * seq_sum).mean() - 1.0).item()
    return out


def rs_metrics(log_ratio, mask) -> dict[str, float]:
    """compute_rs_metrics' threshold-free statistics of every sequence-level option."""
    safe = torch.clamp(log_ratio, -BOUND, BOUND)
    token_k = {1: -safe, 2: 0.5 * safe**2, 3: torch.exp(safe) - 1.0 - safe}
    out = {}
    for k, agg in SEQUENCE_OPTIONS:
        values = token_k[k]
        if agg == "sum":
            stat = (values * mask).sum(-1)
        elif agg == "mean":
            stat = masked_mean(values, mask, -1)
        else:
            stat = values.masked_fill(mask == 0, -math.inf).max(-1).values
        prefix = f"rollout_rs_seq_{agg}_k{k}"
        out[f"{prefix}_max"], out[f"{prefix}_min"] = stat.max().item(), stat.min().item()
        out[f"{prefix}_seq_mean"], out[f"{prefix}_seq_std"] = stat.mean().item(), stat.std().item()
        out[f"{prefix}_seq_max"], out[f"{prefix}_seq_min"] = stat.max().item(), stat.min().item()
        out[f"{prefix}_seq_max_deviation"] = stat.abs().max().item()
    return out


def debug_metrics(old, rollout, mask) -> dict[str, float]:
    """calculate_debug_metrics: |exp(old) - exp(rollout)| and the Pearson correlation of the probabilities."""
    keep = mask.bool()
    diff = (torch.exp(old) - torch.exp(rollout)).abs()[keep]
    a, b = torch.exp(old)[keep], torch.exp(rollout)[keep]
    corr = ((a - a.mean()) * (b - b.mean())).sum() / torch.sqrt(
        ((a - a.mean()) ** 2).sum() * ((b - b.mean()) ** 2).sum()
    )
    return {
        "rollout_probs_diff_mean": diff.mean().item(),
        "rollout_probs_diff_max": diff.max().item(),
        "rollout_probs_diff_std": diff.std().item(),
        "rollout_actor_probs_pearson_corr": corr.item(),
    }


def rollout_corr(old, rollout, mask, mode: str) -> dict[str, float]:
    """Every verl-named column of proxaudit's rollout_corr views for one batch and one rollout_is mode."""
    return {
        **is_metrics(old - rollout, mask, mode),
        **offpolicy_metrics(old, rollout, mask),
        **rs_metrics(old - rollout, mask),
        **debug_metrics(old, rollout, mask),
    }
