-- proxaudit metrics store: the macros and views over the tables of store.sql, the public interface. Every
-- statement is CREATE OR REPLACE: the writer runs this file on every write, and readers run it in a
-- connection of their own (`evaluator.store.reader`), so a query always runs this SQL, never a store's own.
--
-- Grains: `metric_moments` holds exact moments per (run, step, staleness, method, metric); the sketches per
-- (run, step) and per (run, staleness). A figure over any selection is a ratio of exact sums. The macros
-- take a step range and a staleness range (inclusive; the defaults take everything), and `by_step` and
-- `by_staleness` (true: one row per step or staleness value; else that column is NULL).

-- The representative value of a sketch bucket: the midpoint of its interval. A fine bucket
-- f = (bits(|x|) >> 46) - 62911 (float64 bits of |x|: 11 exponent + 6 mantissa bits) spans a relative width
-- of 1/64; from 2^8 on (fine bucket 3073) eight make one: bucket = sign(x) * (3073 + ((f - 3073) >> 3)).
-- Bucket 0 holds |x| < 2^-40. Must agree with evaluator.formulas.sketch.bucket_value (a test checks).
CREATE OR REPLACE MACRO proxaudit_first_fine(b) AS
    CASE WHEN abs(b) < 3073 THEN abs(b) ELSE 3073 + ((abs(b) - 3073) << 3) END + 62911;
CREATE OR REPLACE MACRO proxaudit_bucket_value(b) AS
    CASE WHEN b = 0 THEN 0.0
         ELSE sign(b) * pow(2.0, (proxaudit_first_fine(b) >> 6) - 1023)
              * (1.0 + ((proxaudit_first_fine(b) & 63) + CASE WHEN abs(b) < 3073 THEN 0.5 ELSE 4.0 END) / 64.0)
    END;

-- A q-quantile of a merged sketch: the representative value of the first bucket, in value order, whose
-- cumulative count exceeds the rank q * (n - 1), clamped to the exact [min, max] (DDSketch's rule;
-- evaluator.formulas.sketch.sketch_quantile is the numpy twin). A 0/1 metric keeps no sketch: its
-- quantile follows from its mean (n (1 - mean) zeros, then ones). NULL for other metrics without one.
CREATE OR REPLACE MACRO proxaudit_quantile(first_bucket, lo, hi, is_binary, n, mean, q) AS
    CASE WHEN first_bucket IS NOT NULL  -- greatest() and least() would skip a null
         THEN least(greatest(proxaudit_bucket_value(first_bucket), lo), hi)
         WHEN is_binary THEN CASE WHEN round(n * (1 - mean)) > q * (n - 1) THEN 0.0 ELSE 1.0 END END;

-- n, mean, min, max and p50/p90/p99 of every (run, method, metric) over a staleness range, merging the
-- staleness sketches (all steps).
CREATE OR REPLACE MACRO summary_over(lo := -2147483648, hi := 2147483647, by_staleness := false) AS TABLE
WITH moments AS (
    SELECT run_id, CASE WHEN by_staleness THEN staleness END AS staleness, method, metric,
           sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
    FROM metric_moments WHERE staleness BETWEEN lo AND hi GROUP BY ALL
), ranked AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, staleness, method, metric ORDER BY bucket
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
    FROM (SELECT run_id, CASE WHEN by_staleness THEN staleness END AS staleness, method, metric, bucket,
                 sum(count) AS c
          FROM sketch_by_staleness WHERE staleness BETWEEN lo AND hi GROUP BY ALL)
), first_buckets AS (
    SELECT r.run_id, r.staleness, r.method, r.metric,
           min(r.bucket) FILTER (WHERE r.cum > 0.50 * (m.n - 1)) AS b50,
           min(r.bucket) FILTER (WHERE r.cum > 0.90 * (m.n - 1)) AS b90,
           min(r.bucket) FILTER (WHERE r.cum > 0.99 * (m.n - 1)) AS b99
    FROM ranked r JOIN moments m ON m.run_id = r.run_id AND m.staleness IS NOT DISTINCT FROM r.staleness
                                AND m.method = r.method AND m.metric = r.metric
    GROUP BY ALL
)
SELECT m.run_id, m.staleness, m.method, m.metric, m.n, m.mean, m.min, m.max,
       proxaudit_quantile(q.b50, m.min, m.max, d.is_binary, m.n, m.mean, 0.50) AS p50,
       proxaudit_quantile(q.b90, m.min, m.max, d.is_binary, m.n, m.mean, 0.90) AS p90,
       proxaudit_quantile(q.b99, m.min, m.max, d.is_binary, m.n, m.mean, 0.99) AS p99
FROM moments m LEFT JOIN first_buckets q
     ON q.run_id = m.run_id AND q.staleness IS NOT DISTINCT FROM m.staleness
    AND q.method = m.method AND q.metric = m.metric
LEFT JOIN metric_definition d ON d.metric = m.metric;

-- ... with the 95% interval of the error metrics' means (a bootstrap over steps: table mean_interval).
CREATE OR REPLACE VIEW run_summary AS
SELECT s.* EXCLUDE (staleness), i.lower AS mean_lower, i.upper AS mean_upper
FROM summary_over() s
LEFT JOIN mean_interval i ON i.run_id = s.run_id AND i.staleness IS NULL AND i.method = s.method
                         AND i.metric = s.metric
ORDER BY s.run_id, s.method, s.metric;

CREATE OR REPLACE VIEW staleness_summary AS
SELECT s.run_id, s.staleness, s.method, s.metric, s.n, s.mean, s.min, s.max, s.p50, s.p90, s.p99,
       i.lower AS mean_lower, i.upper AS mean_upper
FROM summary_over(by_staleness := true) s
LEFT JOIN mean_interval i ON i.run_id = s.run_id AND i.staleness = s.staleness AND i.method = s.method
                         AND i.metric = s.metric
ORDER BY s.run_id, s.staleness, s.method, s.metric;

-- The same per step, merging the step sketches (all staleness values).
CREATE OR REPLACE VIEW step_summary AS
WITH moments AS (
    SELECT run_id, step, method, metric,
           sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
    FROM metric_moments GROUP BY ALL
), ranked AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, step, method, metric ORDER BY bucket
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
    FROM (SELECT run_id, step, method, metric, bucket, sum(count) AS c FROM sketch_by_step GROUP BY ALL)
), first_buckets AS (
    SELECT r.run_id, r.step, r.method, r.metric,
           min(r.bucket) FILTER (WHERE r.cum > 0.50 * (m.n - 1)) AS b50,
           min(r.bucket) FILTER (WHERE r.cum > 0.90 * (m.n - 1)) AS b90,
           min(r.bucket) FILTER (WHERE r.cum > 0.99 * (m.n - 1)) AS b99
    FROM ranked r JOIN moments m USING (run_id, step, method, metric)
    GROUP BY ALL
)
SELECT m.run_id, m.step, m.method, m.metric, m.n, m.mean, m.min, m.max,
       proxaudit_quantile(q.b50, m.min, m.max, d.is_binary, m.n, m.mean, 0.50) AS p50,
       proxaudit_quantile(q.b90, m.min, m.max, d.is_binary, m.n, m.mean, 0.90) AS p90,
       proxaudit_quantile(q.b99, m.min, m.max, d.is_binary, m.n, m.mean, 0.99) AS p99
FROM moments m LEFT JOIN first_buckets q USING (run_id, step, method, metric)
LEFT JOIN metric_definition d ON d.metric = m.metric
ORDER BY run_id, step, method, metric;

-- Exact moments by step and staleness together (for heat maps); no quantiles at this grain.
CREATE OR REPLACE VIEW step_staleness_summary AS
SELECT run_id, step, staleness, method, metric,
       sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
FROM metric_moments GROUP BY run_id, step, staleness, method, metric
ORDER BY run_id, step, staleness, method, metric;

-- The decision figures of every estimator under the store's loss, over a step and a staleness range, from
-- the exact sums: n = tokens with the ground truth; gradient_mass_error = sum grad_weight_abs_error / sum
-- true_grad_weight (the truth's W on the same tokens); the flip and active rates are means of the 0/1
-- metrics (NULL where the loss has no such decision); true_*_rate are the ground truth's own rates.
-- The sequence_* rates count sequences (n_sequences), a sequence at the staleness of its stalest token.
CREATE OR REPLACE MACRO decision_over(first_step := -9223372036854775808, last_step := 9223372036854775807,
    lo := -2147483648, hi := 2147483647, by_step := false, by_staleness := false) AS TABLE
WITH sums AS (
    SELECT run_id, CASE WHEN by_step THEN step END AS step, CASE WHEN by_staleness THEN staleness END AS staleness,
           method,
           coalesce(sum(n) FILTER (WHERE metric = 'grad_weight_abs_error'),
                    sum(n) FILTER (WHERE metric = 'grad_weight'))::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'grad_weight_abs_error') AS grad_weight_abs_error,
           sum(sum) FILTER (WHERE metric = 'true_grad_weight') AS true_grad_weight,
           coalesce(sum(n) FILTER (WHERE metric = 'sequence_clip_active'),
                    sum(n) FILTER (WHERE metric = 'sequence_bound_active')) AS n_sequences,
           sum(sum) FILTER (WHERE metric = 'clip_flip') / sum(n) FILTER (WHERE metric = 'clip_flip') AS clip_flip_rate,
           sum(sum) FILTER (WHERE metric = 'bound_flip') / sum(n) FILTER (WHERE metric = 'bound_flip') AS bound_flip_rate,
           sum(sum) FILTER (WHERE metric = 'clip_active') / sum(n) FILTER (WHERE metric = 'clip_active')
               AS clip_active_rate,
           sum(sum) FILTER (WHERE metric = 'bound_active') / sum(n) FILTER (WHERE metric = 'bound_active')
               AS bound_active_rate,
           sum(sum) FILTER (WHERE metric = 'dual_clip_flip') / sum(n) FILTER (WHERE metric = 'dual_clip_flip')
               AS dual_clip_flip_rate,
           sum(sum) FILTER (WHERE metric = 'bound_lower_flip') / sum(n) FILTER (WHERE metric = 'bound_lower_flip')
               AS bound_lower_flip_rate,
           sum(sum) FILTER (WHERE metric = 'sequence_clip_flip') / sum(n) FILTER (WHERE metric = 'sequence_clip_flip')
               AS sequence_clip_flip_rate,
           sum(sum) FILTER (WHERE metric = 'sequence_bound_flip')
               / sum(n) FILTER (WHERE metric = 'sequence_bound_flip') AS sequence_bound_flip_rate
    FROM metric_moments
    WHERE metric IN ('grad_weight', 'grad_weight_abs_error', 'true_grad_weight', 'clip_flip', 'bound_flip',
                     'clip_active', 'bound_active', 'dual_clip_flip', 'bound_lower_flip', 'sequence_clip_flip',
                     'sequence_bound_flip', 'sequence_clip_active', 'sequence_bound_active')
      AND step BETWEEN first_step AND last_step AND staleness BETWEEN lo AND hi
    GROUP BY ALL
)
SELECT e.run_id, e.step, e.staleness, e.method, e.n,
       e.grad_weight_abs_error / nullif(e.true_grad_weight, 0) AS gradient_mass_error,
       e.clip_flip_rate, e.bound_flip_rate, e.clip_active_rate, e.bound_active_rate,
       t.clip_active_rate AS true_clip_active_rate, t.bound_active_rate AS true_bound_active_rate,
       e.dual_clip_flip_rate, e.bound_lower_flip_rate,
       e.n_sequences::BIGINT AS n_sequences, e.sequence_clip_flip_rate, e.sequence_bound_flip_rate,
       e.grad_weight_abs_error, e.true_grad_weight
FROM sums e JOIN sums t
  ON t.run_id = e.run_id AND t.step IS NOT DISTINCT FROM e.step AND t.staleness IS NOT DISTINCT FROM e.staleness
 AND t.method = 'ground_truth'
WHERE e.method <> 'ground_truth';

-- Engine mismatch floor (DOMAIN.md 3b): per run and staleness, the mean true drift, verl's probability gap
-- |exp(g) - exp(b)| and NeMo-RL's exp(|g - b|); floor_share = the staleness-0 drift (pure inference engine
-- vs trainer mismatch) over this staleness's drift: how much of the drift the floor explains.
CREATE OR REPLACE VIEW mismatch_summary AS
WITH by_staleness AS (
    SELECT run_id, staleness,
           sum(n) FILTER (WHERE metric = 'drift')::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'drift') / sum(n) FILTER (WHERE metric = 'drift') AS drift,
           sum(sum) FILTER (WHERE metric = 'prob_drift') / sum(n) FILTER (WHERE metric = 'prob_drift')
               AS prob_drift,
           sum(sum) FILTER (WHERE metric = 'exp_abs_drift') / sum(n) FILTER (WHERE metric = 'exp_abs_drift')
               AS exp_abs_drift
    FROM metric_moments
    WHERE method = 'ground_truth' AND metric IN ('drift', 'prob_drift', 'exp_abs_drift')
    GROUP BY run_id, staleness
)
SELECT s.run_id, s.staleness, s.n, s.drift, s.prob_drift, s.exp_abs_drift,
       least(f.drift / nullif(s.drift, 0), 1.0) AS floor_share
FROM by_staleness s LEFT JOIN by_staleness f ON f.run_id = s.run_id AND f.staleness = 0
ORDER BY s.run_id, s.staleness;

-- The decision figures' 95% intervals by a bootstrap over steps (table decision_interval, recomputed
-- at every publish), one row per (run, staleness or NULL for every staleness, method).
CREATE OR REPLACE VIEW decision_interval_wide AS
SELECT run_id, staleness, method, max(n_steps) AS n_steps,
       max(lower) FILTER (WHERE figure = 'gradient_mass_error') AS gradient_mass_error_lower,
       max(upper) FILTER (WHERE figure = 'gradient_mass_error') AS gradient_mass_error_upper,
       max(lower) FILTER (WHERE figure = 'clip_flip_rate') AS clip_flip_rate_lower,
       max(upper) FILTER (WHERE figure = 'clip_flip_rate') AS clip_flip_rate_upper,
       max(lower) FILTER (WHERE figure = 'bound_flip_rate') AS bound_flip_rate_lower,
       max(upper) FILTER (WHERE figure = 'bound_flip_rate') AS bound_flip_rate_upper,
       max(lower) FILTER (WHERE figure = 'dual_clip_flip_rate') AS dual_clip_flip_rate_lower,
       max(upper) FILTER (WHERE figure = 'dual_clip_flip_rate') AS dual_clip_flip_rate_upper,
       max(lower) FILTER (WHERE figure = 'bound_lower_flip_rate') AS bound_lower_flip_rate_lower,
       max(upper) FILTER (WHERE figure = 'bound_lower_flip_rate') AS bound_lower_flip_rate_upper,
       max(lower) FILTER (WHERE figure = 'sequence_clip_flip_rate') AS sequence_clip_flip_rate_lower,
       max(upper) FILTER (WHERE figure = 'sequence_clip_flip_rate') AS sequence_clip_flip_rate_upper,
       max(lower) FILTER (WHERE figure = 'sequence_bound_flip_rate') AS sequence_bound_flip_rate_lower,
       max(upper) FILTER (WHERE figure = 'sequence_bound_flip_rate') AS sequence_bound_flip_rate_upper,
       max(excess_lower) FILTER (WHERE figure = 'gradient_mass_error') AS excess_gradient_mass_error_lower,
       max(excess_upper) FILTER (WHERE figure = 'gradient_mass_error') AS excess_gradient_mass_error_upper,
       max(excess_lower) FILTER (WHERE figure = 'clip_flip_rate') AS excess_clip_flip_rate_lower,
       max(excess_upper) FILTER (WHERE figure = 'clip_flip_rate') AS excess_clip_flip_rate_upper,
       max(excess_lower) FILTER (WHERE figure = 'bound_flip_rate') AS excess_bound_flip_rate_lower,
       max(excess_upper) FILTER (WHERE figure = 'bound_flip_rate') AS excess_bound_flip_rate_upper
FROM decision_interval GROUP BY run_id, staleness, method;

-- The engine floor of each run: at staleness 0 every estimator built from behave_logp is behave_logp, so
-- `rollout`'s decision figures there measure the inference engine against the trainer, not the
-- approximation. With the drift at staleness 0 against verl's reference lines (mean prob_drift: below
-- 0.005 normal, above 0.01 a precision problem) and NeMo-RL's (mean exp_abs_drift above 1.05 flagged).
CREATE OR REPLACE VIEW engine_floor AS
SELECT d.run_id, d.n, i.n_steps,
       d.gradient_mass_error, i.gradient_mass_error_lower, i.gradient_mass_error_upper,
       d.clip_flip_rate, i.clip_flip_rate_lower, i.clip_flip_rate_upper,
       d.bound_flip_rate, i.bound_flip_rate_lower, i.bound_flip_rate_upper,
       m.prob_drift, pd.lower AS prob_drift_lower, pd.upper AS prob_drift_upper,
       m.exp_abs_drift, ed.lower AS exp_abs_drift_lower, ed.upper AS exp_abs_drift_upper
FROM decision_over(lo := 0, hi := 0) d
LEFT JOIN decision_interval_wide i ON i.run_id = d.run_id AND i.staleness = 0 AND i.method = d.method
LEFT JOIN mismatch_summary m ON m.run_id = d.run_id AND m.staleness = 0
LEFT JOIN mean_interval pd ON pd.run_id = d.run_id AND pd.staleness = 0 AND pd.method = 'ground_truth'
                          AND pd.metric = 'prob_drift'
LEFT JOIN mean_interval ed ON ed.run_id = d.run_id AND ed.staleness = 0 AND ed.method = 'ground_truth'
                          AND ed.metric = 'exp_abs_drift'
WHERE d.method = 'rollout'
ORDER BY d.run_id;

-- decision_over with the intervals and the excess over the engine floor (the figure minus the floor's,
-- its interval on the same bootstrap draws), for every staleness or each. Over every staleness, the excess
-- pools the stale tokens only (staleness >= 1): at staleness 0 every estimate is behave_logp, its excess 0
-- by construction, which would dilute it.
CREATE OR REPLACE MACRO decision_with_intervals(by_staleness := false) AS TABLE
SELECT d.* EXCLUDE (step), i.n_steps,
       i.gradient_mass_error_lower, i.gradient_mass_error_upper,
       i.clip_flip_rate_lower, i.clip_flip_rate_upper,
       i.bound_flip_rate_lower, i.bound_flip_rate_upper,
       i.dual_clip_flip_rate_lower, i.dual_clip_flip_rate_upper,
       i.bound_lower_flip_rate_lower, i.bound_lower_flip_rate_upper,
       i.sequence_clip_flip_rate_lower, i.sequence_clip_flip_rate_upper,
       i.sequence_bound_flip_rate_lower, i.sequence_bound_flip_rate_upper,
       e.gradient_mass_error - f.gradient_mass_error AS excess_gradient_mass_error, i.excess_gradient_mass_error_lower, i.excess_gradient_mass_error_upper,
       e.clip_flip_rate - f.clip_flip_rate AS excess_clip_flip_rate, i.excess_clip_flip_rate_lower, i.excess_clip_flip_rate_upper,
       e.bound_flip_rate - f.bound_flip_rate AS excess_bound_flip_rate, i.excess_bound_flip_rate_lower, i.excess_bound_flip_rate_upper
FROM decision_over(by_staleness := by_staleness) d
LEFT JOIN decision_over(lo := CASE WHEN by_staleness THEN -2147483648 ELSE 1 END, by_staleness := by_staleness) e
       ON e.run_id = d.run_id AND e.staleness IS NOT DISTINCT FROM d.staleness AND e.method = d.method
LEFT JOIN decision_interval_wide i
       ON i.run_id = d.run_id AND i.staleness IS NOT DISTINCT FROM d.staleness AND i.method = d.method
LEFT JOIN engine_floor f ON f.run_id = d.run_id;

CREATE OR REPLACE VIEW decision_summary AS
SELECT * EXCLUDE (staleness) FROM decision_with_intervals() ORDER BY run_id, method;

CREATE OR REPLACE VIEW decision_staleness_summary AS
SELECT * FROM decision_with_intervals(by_staleness := true) ORDER BY run_id, staleness, method;

-- Each trainer's own train/inference mismatch figure, by its own definition, computed on the log at staleness
-- 0 (behave and prox one version: the engine against the trainer) from the ground truth g = prox_logp and
-- b = behave_logp, with the line the trainer publishes (NULL: none) and whether the figure is within it,
-- beside proxaudit's engine floor. The sources (file, function or doc) are in the `source` column.
CREATE OR REPLACE VIEW trainer_mismatch AS
WITH floor AS (
    SELECT run_id,
           sum(n) FILTER (WHERE metric = 'drift')::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'drift') / sum(n) FILTER (WHERE metric = 'drift') AS drift,
           sum(sum) FILTER (WHERE metric = 'exp_abs_drift') / sum(n) FILTER (WHERE metric = 'exp_abs_drift') AS exp_abs_drift,
           sum(sum) FILTER (WHERE metric = 'prob_drift') / sum(n) FILTER (WHERE metric = 'prob_drift') AS prob_drift,
           sum(sum) FILTER (WHERE metric = 'behave_approx_kl') / sum(n) FILTER (WHERE metric = 'behave_approx_kl') AS r,
           sum(sum) FILTER (WHERE metric = 'behave_imp_weight') / sum(n) FILTER (WHERE metric = 'behave_imp_weight') AS w,
           sum(sum) FILTER (WHERE metric = 'approx_logp') / sum(n) FILTER (WHERE metric = 'approx_logp') AS logp,
           sum(sum) FILTER (WHERE metric = 'seq_drift') / sum(n) FILTER (WHERE metric = 'seq_drift') AS seq_drift,
           sum(sum) FILTER (WHERE metric = 'seq_log_ppl_diff') / sum(n) FILTER (WHERE metric = 'seq_log_ppl_diff')
               AS log_ppl_diff
    FROM metric_moments
    WHERE method = 'ground_truth' AND staleness = 0
      AND metric IN ('drift', 'exp_abs_drift', 'prob_drift', 'behave_approx_kl', 'behave_imp_weight', 'approx_logp',
                     'seq_drift', 'seq_log_ppl_diff')
    GROUP BY run_id
), lines(position, trainer, metric, line, definition, source) AS (VALUES
    (1, 'NeMo-RL', 'token_mult_prob_error', 1.05, 'mean exp(|g - b|) over tokens',
     'nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn; docs/guides/dtensor-tp-accuracy.md: above 1.05 investigate'),
    (2, 'NeMo-RL', 'gen_kl_error', 0.001, 'mean exp(g - b) - 1 - (g - b) over tokens (k3)',
     'nemo_rl/algorithms/loss/loss_functions.py, utils.py calculate_kl; docs/guides/grpo.md: below 1e-3 acceptable'),
    (3, 'prime-rl', 'mismatch_kl', NULL, 'mean exp(g - b) - (g - b) - 1 over tokens',
     'src/prime_rl/trainer/rl/loss.py compute_importance_ratio_and_mismatch_kl, train.py mismatch_kl/all/mean'),
    (4, 'prime-rl', 'kl_ent_ratio', NULL, 'mismatch_kl / entropy, the entropy estimated as mean(-g) over the sampled tokens',
     'src/prime_rl/trainer/rl/train.py kl_ent_ratio/mean'),
    (5, 'slime', 'train_rollout_logprob_abs_diff', 0.1, 'mean over sequences of mean |g - b|',
     'slime/backends/megatron_utils/loss.py; model.py asserts it under --ci-test, arguments.py --ci-train-rollout-logprob-abs-diff-threshold 0.1'),
    (6, 'Miles', 'train_rollout_logprob_abs_diff', NULL, 'mean over sequences of mean |g - b|',
     'miles/backends/training_utils/loss_hub/losses.py (its CI gates it against its own history)'),
    (7, 'Miles', 'rollout/log_probs - rollout/rollout_log_probs', 0.03, '|mean over sequences of mean (g - b)|',
     'miles/backends/training_utils/log_utils.py: isclose(..., abs_tol=0.03) under --ci-test'),
    (8, 'SkyRL', 'rollout_train_logprobs_abs_diff_mean', NULL, 'mean |b - g| over tokens',
     'skyrl/train/trainer.py policy/rollout_train_logprobs_abs_diff_mean'),
    (9, 'OpenRLHF', 'vllm_kl', NULL, 'mean (b - g) over tokens', 'openrlhf/models/loss.py PolicyLoss vllm_kl'),
    (10, 'AReaL', 'logp_abs_diff', NULL, 'mean |b - g| over tokens (AReaL: against theta; prox at minibatch 0)',
     'areal/trainer/ppo/actor.py grpo_loss_fn logp_abs_diff'),
    (11, 'verl', 'training/rollout_probs_diff_mean', 0.01, 'mean |exp(g) - exp(b)| over tokens',
     'verl/utils/debug/metrics.py calculate_debug_metrics; verl FAQ: below 0.005 normal, above 0.01 a precision problem'),
    (12, 'proxaudit', 'floor_gradient_mass_error', 0.01, 'rollout''s gradient mass error at staleness 0 (view engine_floor)',
     'the default tolerance of the gate')
)
SELECT f.run_id, l.trainer, l.metric,
       CASE l.position
           WHEN 1 THEN f.exp_abs_drift WHEN 2 THEN f.w - 1 - f.r WHEN 3 THEN f.w - 1 - f.r
           WHEN 4 THEN (f.w - 1 - f.r) / nullif(0 - f.logp, 0) WHEN 5 THEN f.seq_drift WHEN 6 THEN f.seq_drift
           WHEN 7 THEN abs(f.log_ppl_diff) WHEN 8 THEN f.drift WHEN 9 THEN 0 - f.r WHEN 10 THEN f.drift
           WHEN 11 THEN f.prob_drift WHEN 12 THEN e.gradient_mass_error
       END AS value,
       l.line::DOUBLE AS line, (value <= l.line) AS within_line, f.n, l.definition, l.source
FROM floor f CROSS JOIN lines l LEFT JOIN engine_floor e ON e.run_id = f.run_id
WHERE f.n > 0
ORDER BY f.run_id, l.trainer <> 'proxaudit', l.trainer, l.metric;

-- Weight diagnostics (DOMAIN.md 3b) of every method, the ground truth too, over a step and a staleness
-- range, from the exact sums of w = behave_imp_weight and r = behave_approx_kl = log w:
-- ess_fraction = (sum w)^2 / (n sum w^2), chi2 = n sum w^2 / (sum w)^2 - 1, and the KL estimators' means
-- k1 = -r, k2 = r^2 / 2, k3 = w - 1 - r.
CREATE OR REPLACE MACRO weight_over(first_step := -9223372036854775808, last_step := 9223372036854775807,
    lo := -2147483648, hi := 2147483647, by_step := false, by_staleness := false) AS TABLE
WITH sums AS (
    SELECT run_id, CASE WHEN by_step THEN step END AS step, CASE WHEN by_staleness THEN staleness END AS staleness,
           method, sum(n) FILTER (WHERE metric = 'behave_imp_weight')::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'behave_imp_weight') AS w,
           sum(sum_sq) FILTER (WHERE metric = 'behave_imp_weight') AS w2,
           sum(sum) FILTER (WHERE metric = 'behave_approx_kl') AS r,
           sum(sum_sq) FILTER (WHERE metric = 'behave_approx_kl') AS r2
    FROM metric_moments
    WHERE metric IN ('behave_imp_weight', 'behave_approx_kl')
      AND step BETWEEN first_step AND last_step AND staleness BETWEEN lo AND hi
    GROUP BY ALL
)
SELECT run_id, step, staleness, method, n,
       w * w / nullif(n * w2, 0) AS ess_fraction,
       n * w2 / nullif(w * w, 0) - 1 AS chi2,
       (0 - r) / n AS kl_k1,  -- not -r: a -0.0 when r is 0
       r2 / (2 * n) AS kl_k2,
       (w - r) / n - 1 AS kl_k3
FROM sums;

CREATE OR REPLACE VIEW weight_summary AS
SELECT * EXCLUDE (step, staleness) FROM weight_over() ORDER BY run_id, method;

CREATE OR REPLACE VIEW weight_staleness_summary AS
SELECT * EXCLUDE (step) FROM weight_over(by_staleness := true) ORDER BY run_id, staleness, method;

-- verl's rollout-correction diagnostics (the `rollout_corr/...` keys of verl-project/verl 1dda039
-- `rollout_corr_helper.py`: compute_is_metrics, compute_rs_metrics, compute_offpolicy_metrics; and the
-- `training/rollout_probs_diff_*` and `rollout_actor_probs_pearson_corr` of `verl/utils/debug/metrics.py`) of
-- every method's estimate a, the ground truth's too, against behave_logp, over a step and a staleness range,
-- as if the selection were one verl batch: d = clamp(a - b, -20, 20), T = 2 (verl's rollout_is_threshold
-- default, TIS), sequences counted as in decision_over. One row per `rollout_is` mode: the `rollout_is_*`
-- columns are that mode's (token: each token's weight min(exp(d), T); sequence: the sequence's
-- min(exp(clamp(sum (a - b), -20, 20)), T) on each of its tokens); the other columns are the same in both.
-- seq_is_ess_fraction, seq_geo_weight_mean and seq_geo_ess_fraction are proxaudit's (verl logs no such ESS).
CREATE OR REPLACE MACRO proxaudit_sample_std(n, s, q) AS  -- torch's std: unbiased, 0 for one value
    CASE WHEN n > 1 THEN sqrt(greatest(q - s * s / n, 0) / (n - 1)) WHEN n = 1 THEN 0.0 END;

CREATE OR REPLACE MACRO rollout_corr_over(first_step := -9223372036854775808, last_step := 9223372036854775807,
    lo := -2147483648, hi := 2147483647, by_step := false, by_staleness := false) AS TABLE
WITH m AS (
    SELECT run_id, CASE WHEN by_step THEN step END AS step, CASE WHEN by_staleness THEN staleness END AS staleness,
           method, metric, sum(n) AS n, sum(sum) AS s, sum(sum_sq) AS q, max(max) AS mx, min(min) AS mn
    FROM metric_moments
    WHERE (metric LIKE 'seq\_%' ESCAPE '\' OR metric IN ('is_weight', 'is_weight_truncated', 'is_weight_high',
                 'is_weight_low', 'is_seq_weight_truncated', 'approx_prob', 'behave_prob', 'prob_product',
                 'prob_diff', 'behave_approx_kl', 'behave_imp_weight'))
      AND method IS NOT NULL AND step BETWEEN first_step AND last_step AND staleness BETWEEN lo AND hi
    GROUP BY ALL
), f AS (
    SELECT run_id, step, staleness, method,
           sum(n) FILTER (WHERE metric = 'is_weight')::BIGINT AS n,
           sum(n) FILTER (WHERE metric = 'seq_is_weight')::BIGINT AS ns,
           sum(s) FILTER (WHERE metric = 'is_weight_high') AS high, sum(s) FILTER (WHERE metric = 'is_weight_low') AS low,
           sum(q) FILTER (WHERE metric = 'is_weight') AS w2,
           sum(s) FILTER (WHERE metric = 'is_weight_truncated') AS tv, sum(q) FILTER (WHERE metric = 'is_weight_truncated') AS tv2,
           max(mx) FILTER (WHERE metric = 'is_weight_truncated') AS tv_max,
           min(mn) FILTER (WHERE metric = 'is_weight_truncated') AS tv_min,
           sum(s) FILTER (WHERE metric = 'is_seq_weight_truncated') AS sv,
           sum(q) FILTER (WHERE metric = 'is_seq_weight_truncated') AS sv2,
           sum(s) FILTER (WHERE metric = 'seq_token_weight_mean') AS tm, sum(q) FILTER (WHERE metric = 'seq_token_weight_mean') AS tm2,
           max(mx) FILTER (WHERE metric = 'seq_token_weight_mean') AS tm_max,
           min(mn) FILTER (WHERE metric = 'seq_token_weight_mean') AS tm_min,
           sum(s) FILTER (WHERE metric = 'seq_token_weight_high') AS tm_high,
           sum(s) FILTER (WHERE metric = 'seq_token_weight_low') AS tm_low,
           sum(s) FILTER (WHERE metric = 'seq_is_weight_truncated') AS st, sum(q) FILTER (WHERE metric = 'seq_is_weight_truncated') AS st2,
           max(mx) FILTER (WHERE metric = 'seq_is_weight_truncated') AS st_max,
           min(mn) FILTER (WHERE metric = 'seq_is_weight_truncated') AS st_min,
           max(mx) FILTER (WHERE metric = 'seq_log_ratio') AS lr_max, min(mn) FILTER (WHERE metric = 'seq_log_ratio') AS lr_min,
           sum(s) FILTER (WHERE metric = 'seq_is_weight_high') AS seq_high,
           sum(s) FILTER (WHERE metric = 'seq_is_weight_low') AS seq_low,
           sum(s) FILTER (WHERE metric = 'seq_ppl') AS ppl, sum(s) FILTER (WHERE metric = 'seq_log_ppl') AS log_ppl,
           sum(s) FILTER (WHERE metric = 'seq_behave_ppl') AS behave_ppl,
           sum(s) FILTER (WHERE metric = 'seq_behave_log_ppl') AS behave_log_ppl,
           sum(s) FILTER (WHERE metric = 'behave_approx_kl') AS r, sum(s) FILTER (WHERE metric = 'behave_imp_weight') AS iw,
           sum(s) FILTER (WHERE metric = 'approx_prob') AS pa, sum(q) FILTER (WHERE metric = 'approx_prob') AS pa2,
           sum(s) FILTER (WHERE metric = 'behave_prob') AS pb, sum(q) FILTER (WHERE metric = 'behave_prob') AS pb2,
           sum(s) FILTER (WHERE metric = 'prob_product') AS pab,
           sum(s) FILTER (WHERE metric = 'prob_diff') AS pd, sum(q) FILTER (WHERE metric = 'prob_diff') AS pd2,
           max(mx) FILTER (WHERE metric = 'prob_diff') AS pd_max,
           sum(s) FILTER (WHERE metric = 'seq_is_weight') AS sw, sum(q) FILTER (WHERE metric = 'seq_is_weight') AS sw2,
           sum(s) FILTER (WHERE metric = 'seq_geo_weight') AS gw, sum(q) FILTER (WHERE metric = 'seq_geo_weight') AS gw2,
           sum(s) FILTER (WHERE metric = 'seq_token_outside') AS seq_outside,
           sum(s) FILTER (WHERE metric = 'seq_log_ppl_diff') AS ppl_diff,
           max(mx) FILTER (WHERE metric = 'seq_log_ppl_diff') AS ppl_diff_max,
           min(mn) FILTER (WHERE metric = 'seq_log_ppl_diff') AS ppl_diff_min,
           sum(s) FILTER (WHERE metric = 'seq_log_ppl_abs_diff') AS ppl_abs_diff,
           sum(s) FILTER (WHERE metric = 'seq_ppl_ratio') AS ppl_ratio
    FROM m GROUP BY run_id, step, staleness, method
), rs AS (  -- compute_rs_metrics' statistics of each sequence-level option that need no threshold
    PIVOT (SELECT run_id, step, staleness, method,
                  'rollout_rs_seq_' || split_part(metric, '_', 3) || '_' || split_part(metric, '_', 2) AS option,
                  s / n AS seq_mean, proxaudit_sample_std(n, s, q) AS seq_std, mx AS seq_max, mn AS seq_min,
                  greatest(abs(mx), abs(mn)) AS seq_max_deviation, mx AS max, mn AS min
           FROM m WHERE regexp_matches(metric, '^seq_k[123]_(sum|mean|max)$'))
    ON option IN ('rollout_rs_seq_sum_k1', 'rollout_rs_seq_mean_k1', 'rollout_rs_seq_sum_k2', 'rollout_rs_seq_mean_k2', 'rollout_rs_seq_max_k2', 'rollout_rs_seq_sum_k3', 'rollout_rs_seq_mean_k3', 'rollout_rs_seq_max_k3')
    USING first(seq_mean) AS seq_mean, first(seq_std) AS seq_std, first(seq_max) AS seq_max,
          first(seq_min) AS seq_min, first(seq_max_deviation) AS seq_max_deviation, first(max) AS max,
          first(min) AS min
    GROUP BY run_id, step, staleness, method
), modes AS (  -- each mode's weights: v per token, u per sequence (the mean of its tokens' v)
    SELECT f.*, mode.rollout_is,
           if(token, tv, sv) AS v, if(token, tv2, sv2) AS v2, if(token, tm, st) AS u, if(token, tm2, st2) AS u2,
           if(token, tv_max, exp(least(lr_max, 20))) AS v_max, if(token, tv_min, exp(lr_min)) AS v_min,
           if(token, tm_max, st_max) AS u_max, if(token, tm_min, st_min) AS u_min,
           if(token, high / n, seq_high / ns) AS v_high, if(token, low / n, seq_low / ns) AS v_low,
           if(token, tm_high, seq_high) / ns AS u_high, if(token, tm_low, seq_low) / ns AS u_low
    FROM f CROSS JOIN (SELECT unnest(['token', 'sequence']) AS rollout_is) mode,
         LATERAL (SELECT mode.rollout_is = 'token' AS token)
)
SELECT o.run_id, o.step, o.staleness, o.method, o.rollout_is, o.n, o.ns AS n_sequences,
       v / o.n AS rollout_is_mean, sqrt(greatest(v2 / o.n - (v / o.n) * (v / o.n), 0)) AS rollout_is_std,
       (v / o.n + 1e-8) * (v / o.n + 1e-8) / nullif(v2 / o.n, 0) AS rollout_is_eff_sample_size,
       v_max AS rollout_is_max, v_min AS rollout_is_min,
       v_high AS rollout_is_ratio_fraction_high, v_low AS rollout_is_ratio_fraction_low,
       u / ns AS rollout_is_seq_mean, proxaudit_sample_std(ns, u, u2) AS rollout_is_seq_std,
       u_max AS rollout_is_seq_max, u_min AS rollout_is_seq_min,
       greatest(u_max - 1, 1 - u_min) AS rollout_is_seq_max_deviation,
       u_high AS rollout_is_seq_fraction_high, u_low AS rollout_is_seq_fraction_low,
       if(o.rollout_is = 'token', v / o.n, u / ns) AS rollout_is_batch_norm_factor,
       ppl / ns AS training_ppl, log_ppl / ns AS training_log_ppl,
       behave_ppl / ns AS rollout_ppl, behave_log_ppl / ns AS rollout_log_ppl,
       (0 - r) / o.n AS kl, (iw - r) / o.n - 1 AS k3_kl,
       ppl_diff / ns AS log_ppl_diff, ppl_abs_diff / ns AS log_ppl_abs_diff,
       ppl_diff_max AS log_ppl_diff_max, ppl_diff_min AS log_ppl_diff_min, ppl_ratio / ns AS ppl_ratio,
       w2 / o.n - 1 AS chi2_token, sw2 / ns - 1 AS chi2_seq,
       sw * sw / nullif(ns * sw2, 0) AS seq_is_ess_fraction,
       gw / ns AS seq_geo_weight_mean, gw * gw / nullif(ns * gw2, 0) AS seq_geo_ess_fraction,
       seq_outside / ns AS rollout_rs_token_k1_seq_masked_fraction,
       pd / o.n AS rollout_probs_diff_mean, pd_max AS rollout_probs_diff_max,
       proxaudit_sample_std(o.n, pd, pd2) AS rollout_probs_diff_std,
       (o.n * pab - pa * pb) / nullif(sqrt((o.n * pa2 - pa * pa) * (o.n * pb2 - pb * pb)), 0)
           AS rollout_actor_probs_pearson_corr,
       rs.* EXCLUDE (run_id, step, staleness, method)
FROM modes o
LEFT JOIN rs ON rs.run_id = o.run_id AND rs.step IS NOT DISTINCT FROM o.step
            AND rs.staleness IS NOT DISTINCT FROM o.staleness AND rs.method = o.method;

CREATE OR REPLACE VIEW rollout_corr_summary AS
SELECT * EXCLUDE (step, staleness) FROM rollout_corr_over() ORDER BY run_id, method, rollout_is DESC;

CREATE OR REPLACE VIEW rollout_corr_staleness_summary AS
SELECT * EXCLUDE (step) FROM rollout_corr_over(by_staleness := true) ORDER BY run_id, staleness, method, rollout_is DESC;

-- The safe staleness for a tolerance: the largest staleness s such that every staleness <= s with at
-- least min_tokens tokens has gradient_mass_error <= max_gradient_mass_error and clip_flip_rate <=
-- max_clip_flip_rate; -1 when staleness 0 already fails; with no failure, the largest staleness measured
-- with enough tokens; NULL when no staleness has enough tokens. A staleness with no true gradient mass has
-- nothing to move: it meets the tolerance unless the estimate moves some; a loss without a clip flips none.
-- `_lower`: with 95% confidence (the intervals' upper bounds meet the tolerance); `_upper`: the lower bounds
-- do. `_beyond_floor`: the same on the excess over the engine floor (the approximation's own share).
CREATE OR REPLACE MACRO proxaudit_meets(figure, tolerance, moved) AS
    coalesce(figure <= tolerance, moved = 0, false);

CREATE OR REPLACE MACRO proxaudit_safe_level(first_failing, last_measured, any_measured) AS
    CASE WHEN NOT any_measured THEN NULL ELSE coalesce(first_failing - 1, last_measured) END::INTEGER;

CREATE OR REPLACE MACRO safe_staleness(max_gradient_mass_error := 0.01, max_clip_flip_rate := 0.01,
                                       min_tokens := 1000) AS TABLE
WITH levels AS (
    SELECT run_id, method, staleness, n >= min_tokens AS enough,
           proxaudit_meets(gradient_mass_error, max_gradient_mass_error, grad_weight_abs_error)
           AND coalesce(clip_flip_rate, 0) <= max_clip_flip_rate AS ok,
           proxaudit_meets(gradient_mass_error_upper, max_gradient_mass_error, grad_weight_abs_error)
           AND coalesce(clip_flip_rate_upper, 0) <= max_clip_flip_rate AS ok_upper,
           proxaudit_meets(gradient_mass_error_lower, max_gradient_mass_error, grad_weight_abs_error)
           AND coalesce(clip_flip_rate_lower, 0) <= max_clip_flip_rate AS ok_lower,
           proxaudit_meets(excess_gradient_mass_error, max_gradient_mass_error, grad_weight_abs_error)
           AND coalesce(excess_clip_flip_rate, 0) <= max_clip_flip_rate AS excess_ok,
           proxaudit_meets(excess_gradient_mass_error_upper, max_gradient_mass_error, grad_weight_abs_error)
           AND coalesce(excess_clip_flip_rate_upper, 0) <= max_clip_flip_rate AS excess_ok_upper,
           proxaudit_meets(excess_gradient_mass_error_lower, max_gradient_mass_error, grad_weight_abs_error)
           AND coalesce(excess_clip_flip_rate_lower, 0) <= max_clip_flip_rate AS excess_ok_lower
    FROM decision_staleness_summary
)
SELECT run_id, method,
       proxaudit_safe_level(min(staleness) FILTER (WHERE enough AND NOT ok), max(staleness) FILTER (WHERE enough), bool_or(enough)) AS safe_staleness,
       proxaudit_safe_level(min(staleness) FILTER (WHERE enough AND NOT ok_upper), max(staleness) FILTER (WHERE enough), bool_or(enough)) AS safe_staleness_lower,
       proxaudit_safe_level(min(staleness) FILTER (WHERE enough AND NOT ok_lower), max(staleness) FILTER (WHERE enough), bool_or(enough)) AS safe_staleness_upper,
       proxaudit_safe_level(min(staleness) FILTER (WHERE enough AND NOT excess_ok), max(staleness) FILTER (WHERE enough), bool_or(enough)) AS safe_staleness_beyond_floor,
       proxaudit_safe_level(min(staleness) FILTER (WHERE enough AND NOT excess_ok_upper), max(staleness) FILTER (WHERE enough), bool_or(enough)) AS safe_staleness_beyond_floor_lower,
       proxaudit_safe_level(min(staleness) FILTER (WHERE enough AND NOT excess_ok_lower), max(staleness) FILTER (WHERE enough), bool_or(enough)) AS safe_staleness_beyond_floor_upper,
       count(*) FILTER (WHERE enough)::INTEGER AS measured_levels
FROM levels GROUP BY run_id, method;

-- How much AReaL's shipped version pairing (each token interpolated with the previous token's version)
-- changes the error against each token's own version, per run: compare AReaL's own logged
-- `loglinear/*` metrics with `loglinear_shipped`, never with `loglinear`.
CREATE OR REPLACE VIEW pairing_summary AS
SELECT run_id, interpolation, n, own_abs_error, shipped_abs_error,
       shipped_abs_error / nullif(own_abs_error, 0) AS shipped_over_own
FROM (
    SELECT run_id, regexp_replace(method, '_shipped$', '') AS interpolation,
           sum(n) FILTER (WHERE NOT ends_with(method, '_shipped'))::BIGINT AS n,
           sum(sum) FILTER (WHERE NOT ends_with(method, '_shipped'))
               / sum(n) FILTER (WHERE NOT ends_with(method, '_shipped')) AS own_abs_error,
           sum(sum) FILTER (WHERE ends_with(method, '_shipped'))
               / sum(n) FILTER (WHERE ends_with(method, '_shipped')) AS shipped_abs_error
    FROM metric_moments
    WHERE metric = 'abs_error' AND method IN ('loglinear', 'linear', 'loglinear_shipped', 'linear_shipped')
    GROUP BY ALL
)
ORDER BY run_id, interpolation;

-- The data-driven warnings stored with each run (evaluator/validate/findings.py), newest first.
CREATE OR REPLACE VIEW run_findings AS
SELECT run_id, rule, column_name, n_rows, message, found_at FROM run_finding ORDER BY run_id, found_at DESC, rule;
