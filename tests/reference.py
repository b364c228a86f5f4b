"""DOMAIN.md sections 2, 3 and 3b in plain numpy over the token logs, with none of proxaudit's code: the
expectations that the end-to-end tests hold the store's views, the exports and the dashboard to. Also the
sketch's promise (docs/metrics.md, "Quantile accuracy") and the safe staleness by its definition."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

QUANTILE_PERCENT = {"p50": 50, "p90": 90, "p99": 99}
BINARY = ("clip_active", "clip_flip", "bound_active", "bound_flip")


def loss_tokens(files: Iterable[Path]) -> pd.DataFrame:
    """The loss tokens of `files`, with `prev_version` (AReaL's shipped pairing: the version of the row
    before in the sequence, -1 at pos 0) and `staleness`."""
    df = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    df = df.sort_values(["run_id", "seq_id", "minibatch", "pos"])
    df["prev_version"] = df.groupby(["run_id", "seq_id", "minibatch"])["behave_version"].shift(1).fillna(-1)
    df = df[df["loss_mask"]].reset_index(drop=True)
    df["staleness"] = df["step"] - df["behave_version"]
    return df


def estimates(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Every method's estimate of log pi_prox (section 2), written out with numpy."""
    b, t, g = (df[c].to_numpy(np.float64) for c in ("behave_logp", "theta_logp", "prox_logp"))
    step, vb = df["step"].to_numpy(np.float64), df["behave_version"].to_numpy(np.float64)
    mb = df["minibatch"].to_numpy(np.float64) / df["n_minibatches"].to_numpy(np.float64)
    prev = df["prev_version"].to_numpy(np.float64)

    def alpha(v_prox, v_theta, vb=vb):
        span = v_theta - vb
        return np.where(span > 0, np.clip((v_prox - vb) / np.where(span > 0, span, 1.0), 0, 1), 0.0)

    def exact_at_ends(alpha, values):  # both estimators are exact at alpha 0 and 1
        return np.where(alpha == 0, b, np.where(alpha == 1, t, values))

    def pair(a):  # loglinear and linear at alpha `a` (log-probs >> -700 in these logs)
        return exact_at_ends(a, b + a * (t - b)), exact_at_ends(
            a, np.log((1 - a) * np.exp(b) + a * np.exp(t))
        )

    areal, exact = alpha(step - 1, step), alpha(step, step + mb)
    shipped = np.where(prev >= 0, alpha(step - 1, step, vb=prev), 0.0)
    out = {"ground_truth": g}
    for suffix, a in (("", areal), ("_shipped", shipped), ("_exact", exact)):
        out[f"loglinear{suffix}"], out[f"linear{suffix}"] = pair(a)
    out["rollout"] = b
    out["reuse_train_logp"] = t
    if "proximal_t_logp" in df:
        out["proximal_t"] = df["proximal_t_logp"].to_numpy(np.float64)
    return out


def reference_values(
    files: Iterable[Path], *, eps_low: float = 0.2, eps_high: float = 0.2, bound: float = 5.0,
    bound_action: str = "mask",
) -> pd.DataFrame:  # fmt: skip
    """One row per (token, method, metric) value: run_id, step, staleness, method, metric, value. A row
    whose advantage is null counts as no advantage: |A| = 1 and a two-sided clip (section 3b)."""
    df = loss_tokens(files)
    b, t, g = (df[c].to_numpy(np.float64) for c in ("behave_logp", "theta_logp", "prox_logp"))
    A = df["advantage"].to_numpy(np.float64) if "advantage" in df else np.full(len(df), np.nan)
    no_a = np.isnan(A)

    def clip(x):  # PPO's clip turns the gradient off
        ratio = np.exp(t - x)
        one_sided = ((A > 0) & (ratio > 1 + eps_high)) | ((A < 0) & (ratio < 1 - eps_low))
        return np.where(no_a, (ratio > 1 + eps_high) | (ratio < 1 - eps_low), one_sided)

    def over(x):  # the behaviour weight above U
        return np.exp(x - b) > bound

    def W(x):  # the gradient coefficient, by the bound action
        size = np.where(no_a, 1.0, np.abs(A))
        if bound_action == "mask":
            return size * np.exp(t - b) * (1 - clip(x)) * (1 - over(x))
        return size * np.minimum(np.exp(x - b), bound) * np.exp(t - x) * (1 - clip(x))

    parts = []
    for method, a in estimates(df).items():
        covered, truth = ~np.isnan(a), ~np.isnan(a) & ~np.isnan(g)
        bw, tbw, iw, tiw = np.exp(a - b), np.exp(g - b), np.exp(t - a), np.exp(t - g)
        metrics = {
            "approx_logp": (a, covered),
            "abs_error": (np.abs(a - g), truth),
            "rel_error": (np.abs(a - g) / (np.abs(g) + 1e-8), truth),
            "squared_error": ((a - g) ** 2, truth),
            "behave_imp_weight": (bw, covered),
            "behave_imp_weight_abs_error": (np.abs(bw - tbw), truth),
            "behave_imp_weight_rel_error": (np.abs(bw - tbw) / (tbw + 1e-8), truth),
            "importance_weight": (iw, covered),
            "importance_weight_abs_error": (np.abs(iw - tiw), truth),
            "importance_weight_rel_error": (np.abs(iw - tiw) / (tiw + 1e-8), truth),
            "behave_approx_kl": (a - b, covered),
            "clip_active": (clip(a).astype(float), truth),
            "bound_active": (over(a).astype(float), truth),
            "grad_weight": (W(a), truth),
        }
        if method == "ground_truth":
            metrics["drift"] = (np.abs(g - b), truth)
            metrics["prob_drift"] = (np.abs(np.exp(g) - np.exp(b)), truth)
            metrics["exp_abs_drift"] = (np.exp(np.abs(g - b)), truth)
        else:
            metrics["clip_flip"] = ((clip(a) != clip(g)).astype(float), truth)
            metrics["bound_flip"] = ((over(a) != over(g)).astype(float), truth)
            metrics["grad_weight_abs_error"] = (np.abs(W(a) - W(g)), truth)
            metrics["true_grad_weight"] = (W(g), truth)
        d = np.clip(a - b, -20, 20)  # verl's diagnostics: its safety bound, T = 2
        metrics |= {
            "is_weight": (np.exp(d), covered),
            "is_weight_truncated": (np.minimum(np.exp(d), 2.0), covered),
            "prob_diff": (np.abs(np.exp(a) - np.exp(b)), covered),
            "is_seq_weight_truncated": (sequence_weight_on_tokens(df, a, b), covered),
            "is_weight_high": ((np.exp(d) > 2).astype(float), covered),
            "is_weight_low": ((np.exp(d) < 0.5).astype(float), covered),
            "approx_prob": (np.exp(a), covered),
            "behave_prob": (np.exp(b), covered),
            "prob_product": (np.exp(a) * np.exp(b), covered),
        }
        for metric, (values, mask) in metrics.items():
            part = df.loc[mask, ["run_id", "step", "staleness"]].copy()
            part["method"], part["metric"], part["value"] = method, metric, values[mask]
            parts.append(part)
        parts.append(sequence_values(df, method, a, b))
    return pd.concat(parts, ignore_index=True)


def sequence_weight_on_tokens(df: pd.DataFrame, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """verl's truncated sequence weight min(exp(clip(sum (a - b), -20, 20)), 2) on each token, the sum over
    the tokens of its sequence that have the estimate (NaN on the others)."""
    raw = pd.Series(a - b).groupby([df["run_id"], df["seq_id"], df["minibatch"]]).transform("sum")
    return np.where(np.isnan(a), np.nan, np.minimum(np.exp(np.clip(raw.to_numpy(), -20, 20)), 2.0))


def sequence_values(df: pd.DataFrame, method: str, a: np.ndarray, b: np.ndarray) -> pd.DataFrame:
    """verl's per-response diagnostics, one row per (sequence, metric), for the sequences whose every loss
    token has the estimate; a sequence counts at its step and the staleness of its stalest token."""
    frame = df[["run_id", "seq_id", "minibatch", "step"]].copy()
    frame["staleness"] = df["step"] - df["behave_version"]
    frame["d"], frame["raw"], frame["missing"] = np.clip(a - b, -20, 20), a - b, np.isnan(a)
    frame["k1"], frame["k2"] = -frame["d"], frame["d"] ** 2 / 2
    frame["k3"] = np.exp(frame["d"]) - 1 - frame["d"]
    frame["outside"] = np.abs(frame["d"]) > np.log(2)
    frame["w"], frame["neg_a"], frame["neg_b"], frame["abs"] = np.exp(frame["d"]), -a, -b, np.abs(a - b)
    frame["truncated"] = np.minimum(frame["w"], 2.0)
    by = frame.groupby(["run_id", "seq_id", "minibatch"])
    k_stats = {f"{k}_{agg}": (k, agg) for k in ("k1", "k2", "k3") for agg in ("sum", "mean", "max")}
    seq = by.agg(
        step=("step", "first"), staleness=("staleness", "max"), missing=("missing", "any"),
        raw_sum=("raw", "sum"), raw_mean=("raw", "mean"), outside=("outside", "any"), w_mean=("w", "mean"),
        truncated_mean=("truncated", "mean"), neg_a=("neg_a", "mean"), neg_b=("neg_b", "mean"),
        abs_mean=("abs", "mean"), **k_stats,
    )  # fmt: skip
    seq = seq[~seq["missing"]].reset_index()
    values = {
        "seq_is_weight": np.exp(np.clip(seq["raw_sum"], -20, 20)),
        "seq_geo_weight": np.exp(seq["raw_mean"]),
        "seq_is_weight_low": (seq["raw_sum"] < -np.log(2)).astype(float),
        "seq_token_outside": seq["outside"].astype(float),
        "seq_log_ppl_diff": -seq["raw_mean"],
        "seq_log_ppl_abs_diff": np.abs(seq["raw_mean"]),
        "seq_ppl_ratio": np.exp(-seq["raw_mean"]),
        "seq_is_weight_high": (seq["raw_sum"] > np.log(2)).astype(float),
        "seq_log_ratio": seq["raw_sum"],
        "seq_is_weight_truncated": np.minimum(np.exp(np.clip(seq["raw_sum"], -20, 20)), 2.0),
        "seq_token_weight_mean": seq["truncated_mean"],
        "seq_token_weight_high": (seq["w_mean"] > 2).astype(float),
        "seq_token_weight_low": (seq["w_mean"] < 0.5).astype(float),
        "seq_log_ppl": seq["neg_a"],
        "seq_ppl": np.exp(seq["neg_a"]),
        "seq_behave_log_ppl": seq["neg_b"],
        "seq_behave_ppl": np.exp(seq["neg_b"]),
        **({"seq_drift": seq["abs_mean"]} if method == "ground_truth" else {}),
        **{
            f"seq_{k}": seq[k]
            for k in ("k1_sum", "k1_mean", "k2_sum", "k2_mean", "k2_max", "k3_sum", "k3_mean", "k3_max")
        },  # fmt: skip
    }
    return pd.concat(
        [seq[["run_id", "step", "staleness"]].assign(method=method, metric=name, value=np.asarray(v, float))
         for name, v in values.items()],
        ignore_index=True,
    )  # fmt: skip


def decision_figures(values: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per keys and estimator: n, gradient_mass_error and the flip and active rates, from the values."""
    sums = values.groupby([*keys, "method", "metric"])["value"].agg(["size", "sum"]).unstack("metric")
    est = sums.drop(index="ground_truth", level="method")
    out = pd.DataFrame(index=est.index)
    out["n"] = est[("size", "grad_weight")]
    mass = est[("sum", "true_grad_weight")].to_numpy()  # the truth's W on the estimate's own tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        out["gradient_mass_error"] = np.where(mass != 0, est[("sum", "grad_weight_abs_error")] / mass, np.nan)
    for flag in BINARY:
        out[f"{flag}_rate"] = est[("sum", flag)] / est[("size", flag)]
    return out


def promised_value(values: np.ndarray, stat: str) -> float:
    """The value whose rank is that of the exact quantile: the sorted value at rank floor(q (n - 1)),
    computed in integers (q in hundredths, as the views compare decimals)."""
    ordered = np.sort(np.asarray(values, np.float64))
    return float(ordered[(QUANTILE_PERCENT[stat] * (len(ordered) - 1)) // 100])


def within_promise(got: float, promised: float) -> bool:
    """docs/metrics.md: a quantile is within 1/128 relative of `promised` below 2^8, within 1/16 from 2^8
    on; below 2^-40 (the zero bucket) within 2^-40."""
    if abs(promised) < 2.0**-40:
        return abs(got - promised) <= 2.0**-40
    share = 1 / 128 if abs(promised) < 256 else 1 / 16
    return abs(got - promised) <= abs(promised) * share * (1 + 1e-12)


def safe_staleness(levels: pd.DataFrame, max_gme: float, max_flip: float, min_tokens: int) -> int | None:
    """The safe staleness by its definition, from per-staleness rows (staleness, n, gradient_mass_error,
    clip_flip_rate): the largest s in [-1, the largest judged staleness] such that every staleness <= s
    with at least `min_tokens` tokens meets the tolerance (no true gradient mass: nothing to move, it
    meets it); None when no staleness has enough tokens."""
    judged = levels[levels["n"] >= min_tokens]
    if judged.empty:
        return None
    gme, flips = judged["gradient_mass_error"].fillna(0), judged["clip_flip_rate"].fillna(0)
    ok = (gme <= max_gme) & (flips <= max_flip)
    candidates = range(-1, int(judged["staleness"].max()) + 1)
    return max(s for s in candidates if ok[judged["staleness"] <= s].all())


BOOTSTRAP_SEED, REPLICATES = 20261123, 1000
"""The bootstrap's fixed seed and replicates (docs/metrics.md; tests/test_gate_levels.py checks they are
proxaudit's): a run of n steps draws `multinomial(n, 1/n)` counts from `default_rng([seed, n])`."""
FIGURE_SUMS = {
    "gradient_mass_error": (("grad_weight_abs_error", "s"), ("true_grad_weight", "s")),
    "clip_flip_rate": (("clip_flip", "s"), ("clip_flip", "n")),
    "bound_flip_rate": (("bound_flip", "s"), ("bound_flip", "n")),
}
"""A decision figure as a ratio of per-step sums (`s`) or counts (`n`) of the store's metrics."""


def stored_excess(
    db: Path, run: str, method: str, levels: list[int], figure: str = "gradient_mass_error"
) -> dict[int, tuple[float, float, float]]:
    """(excess, lower, upper) of a decision figure at each staleness of `levels`, from the store's per-step
    sums: the figure minus the engine floor's (`rollout` at staleness 0), its percentile bootstrap over the
    run's steps at 1 - 0.05 / len(levels) on REPLICATES * len(levels) draws, the floor on the same draws."""
    from evaluator.store import connect_store

    (num, num_stat), (den, den_stat) = FIGURE_SUMS[figure]
    with connect_store(db) as con:
        frame = con.execute(
            "SELECT step, staleness, method, metric, sum(sum) AS s, sum(n)::DOUBLE AS n FROM metric_moments "
            "WHERE run_id = ? AND metric IN (?, ?) GROUP BY ALL", [run, num, den]
        ).df()  # fmt: skip
        sql = "SELECT DISTINCT step FROM metric_moments WHERE run_id = ? ORDER BY 1"
        steps = con.execute(sql, [run]).df()["step"].to_numpy()
    family = len(levels)
    rng = np.random.default_rng([BOOTSTRAP_SEED, len(steps)])
    draws = rng.multinomial(len(steps), np.full(len(steps), 1 / len(steps)), size=REPLICATES * family)

    def sums(who: str, s: int, metric: str, stat: str) -> np.ndarray:
        part = frame[(frame["method"] == who) & (frame["staleness"] == s) & (frame["metric"] == metric)]
        return part.groupby("step")[stat].sum().reindex(steps, fill_value=0.0).to_numpy()

    def ratio(who: str, s: int) -> tuple[float, np.ndarray]:
        top, bottom = sums(who, s, num, num_stat), sums(who, s, den, den_stat)
        with np.errstate(divide="ignore", invalid="ignore"):
            return top.sum() / bottom.sum(), (draws @ top) / (draws @ bottom)

    floor, floor_replicates = ratio("rollout", 0)
    tail = 0.05 / family / 2 * 100
    out = {}
    for s in levels:
        point, replicates = ratio(method, s)
        out[s] = (point - floor, *np.nanpercentile(replicates - floor_replicates, [tail, 100 - tail]))
    return out


def expected_decision(db: Path, files: Iterable[Path], run: str, bound: float = 0.01) -> dict:
    """The default thresholds' decision on `run` by its rule: S = the largest staleness with 1,000 loss
    tokens with prox_logp in the logs; at each staleness 1..S, each excess (gradient mass, clip and bound
    flips) fails when its family-wise interval is wholly above `bound`, passes when wholly within it;
    k = the last staleness before the first one that does not pass."""
    tokens = loss_tokens(files)
    with_truth = tokens[tokens["prox_logp"].notna()]["staleness"].value_counts()
    top = int(with_truth[with_truth >= 1000].index.max())
    levels = list(range(1, top + 1))
    figures = {f: stored_excess(db, run, "loglinear_shipped", levels, f) for f in FIGURE_SUMS}
    status, first_failing, first_undecided = {}, None, None
    for s in levels:
        thin = with_truth.get(s, 0) < 1000  # too few tokens to judge: undecided
        judged = {f: "fail" if lo > bound else "pass" if hi <= bound else "undecided"
                  for f, (_, lo, hi) in ((f, figures[f][s]) for f in FIGURE_SUMS)}  # fmt: skip
        outcomes = dict.fromkeys(judged, "undecided") if thin else judged
        status[s] = (
            "fail" if "fail" in outcomes.values() else max(outcomes.values(), key=["pass", "undecided"].index)
        )
        for f in FIGURE_SUMS:
            if outcomes[f] == "fail" and first_failing is None:
                first_failing = (s, f, figures[f][s])
            if outcomes[f] == "undecided" and first_undecided is None:
                first_undecided = (s, f, figures[f][s])
    k = next((s - 1 for s in levels if status[s] != "pass"), top)
    if first_failing is not None:
        action, reason = ("ship_up_to" if k >= 1 else "do_not_ship"), first_failing
    else:
        action, reason = ("undecided" if first_undecided else "ship"), first_undecided
    return {"action": action, "k": k, "S": top, "reason": reason}
