-- proxaudit metrics store: the macros and views over the tables of store.sql, the public interface. Every
-- statement is CREATE OR REPLACE: the writer runs this file on every write, and readers run it in a
-- connection of their own (`evaluator.store.reader`), so a query always runs this SQL, never a store's own.
--
-- Grains: `metric_moments` holds exact moments per (run, step, staleness, method, metric); the sketches per
-- (run, step) and per (run, staleness). A figure over any selection is a ratio of exact sums. The macros
-- take a step range and a staleness range (inclusive; the defaults take everything), and `by_step` and
-- `by_staleness` (true: one row per step or staleness value; else that column is NULL).

-- The representative value of a sketch bucket: the midpoint of its relative-width-1/64 interval.
-- bucket = sign(x) * ((bits(|x|) >> 46) - 62911), from the float64 bits of |x| (11 exponent + 6 mantissa
-- bits); bucket 0 holds |x| < 2^-40. Must agree with evaluator.formulas.sketch.bucket_value (a test checks).
CREATE OR REPLACE MACRO proxaudit_bucket_value(b) AS
    CASE WHEN b = 0 THEN 0.0
         ELSE sign(b) * pow(2.0, ((abs(b) + 62911) >> 6) - 1023) * (1.0 + (((abs(b) + 62911) & 63) + 0.5) / 64.0)
    END;

-- A q-quantile of a merged sketch: the representative value of the first bucket, in value order, whose
-- cumulative count exceeds the rank q * (n - 1), clamped to the exact [min, max] (DDSketch's rule;
-- evaluator.formulas.sketch.sketch_quantile is the numpy twin). NULL for the 0/1 metrics (no sketch).
CREATE OR REPLACE MACRO proxaudit_quantile(first_bucket, lo, hi) AS
    CASE WHEN first_bucket IS NOT NULL  -- greatest() and least() would skip a null
         THEN least(greatest(proxaudit_bucket_value(first_bucket), lo), hi) END;

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
       proxaudit_quantile(q.b50, m.min, m.max) AS p50,
       proxaudit_quantile(q.b90, m.min, m.max) AS p90,
       proxaudit_quantile(q.b99, m.min, m.max) AS p99
FROM moments m LEFT JOIN first_buckets q
     ON q.run_id = m.run_id AND q.staleness IS NOT DISTINCT FROM m.staleness
    AND q.method = m.method AND q.metric = m.metric;

CREATE OR REPLACE VIEW run_summary AS
SELECT * EXCLUDE (staleness) FROM summary_over() ORDER BY run_id, method, metric;

CREATE OR REPLACE VIEW staleness_summary AS
SELECT run_id, staleness, method, metric, n, mean, min, max, p50, p90, p99 FROM summary_over(by_staleness := true)
ORDER BY run_id, staleness, method, metric;

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
       proxaudit_quantile(q.b50, m.min, m.max) AS p50,
       proxaudit_quantile(q.b90, m.min, m.max) AS p90,
       proxaudit_quantile(q.b99, m.min, m.max) AS p99
FROM moments m LEFT JOIN first_buckets q USING (run_id, step, method, metric)
ORDER BY run_id, step, method, metric;

-- Exact moments by step and staleness together (for heat maps); no quantiles at this grain.
CREATE OR REPLACE VIEW step_staleness_summary AS
SELECT run_id, step, staleness, method, metric,
       sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
FROM metric_moments GROUP BY run_id, step, staleness, method, metric
ORDER BY run_id, step, staleness, method, metric;

-- The decision figures (DOMAIN.md 3b) of every estimator over a step and a staleness range, from the exact
-- sums: n = tokens with the ground truth; gradient_mass_error = sum grad_weight_abs_error / the ground
-- truth's sum grad_weight on the same cells; the flip and active rates are means of the 0/1 metrics;
-- true_*_rate are the ground truth's own clip and bound rates.
CREATE OR REPLACE MACRO decision_over(first_step := -9223372036854775808, last_step := 9223372036854775807,
    lo := -2147483648, hi := 2147483647, by_step := false, by_staleness := false) AS TABLE
WITH sums AS (
    SELECT run_id, CASE WHEN by_step THEN step END AS step, CASE WHEN by_staleness THEN staleness END AS staleness,
           method, coalesce(sum(n) FILTER (WHERE metric = 'grad_weight_abs_error'),
                    sum(n) FILTER (WHERE metric = 'grad_weight'))::BIGINT AS n,
           sum(sum) FILTER (WHERE metric = 'grad_weight') AS grad_weight,
           sum(sum) FILTER (WHERE metric = 'grad_weight_abs_error') AS grad_weight_abs_error,
           sum(sum) FILTER (WHERE metric = 'clip_flip') / sum(n) FILTER (WHERE metric = 'clip_flip')
               AS clip_flip_rate,
           sum(sum) FILTER (WHERE metric = 'bound_flip') / sum(n) FILTER (WHERE metric = 'bound_flip')
               AS bound_flip_rate,
           sum(sum) FILTER (WHERE metric = 'clip_active') / sum(n) FILTER (WHERE metric = 'clip_active')
               AS clip_active_rate,
           sum(sum) FILTER (WHERE metric = 'bound_active') / sum(n) FILTER (WHERE metric = 'bound_active')
               AS bound_active_rate
    FROM metric_moments
    WHERE metric IN ('grad_weight', 'grad_weight_abs_error', 'clip_flip', 'bound_flip', 'clip_active',
                     'bound_active')
      AND step BETWEEN first_step AND last_step AND staleness BETWEEN lo AND hi
    GROUP BY ALL
)
SELECT e.run_id, e.step, e.staleness, e.method, e.n,
       e.grad_weight_abs_error / nullif(t.grad_weight, 0) AS gradient_mass_error,
       e.clip_flip_rate, e.bound_flip_rate, e.clip_active_rate, e.bound_active_rate,
       t.clip_active_rate AS true_clip_active_rate, t.bound_active_rate AS true_bound_active_rate
FROM sums e JOIN sums t
  ON t.run_id = e.run_id AND t.step IS NOT DISTINCT FROM e.step AND t.staleness IS NOT DISTINCT FROM e.staleness
 AND t.method = 'ground_truth'
WHERE e.method <> 'ground_truth';

CREATE OR REPLACE VIEW decision_summary AS
SELECT * EXCLUDE (step, staleness) FROM decision_over() ORDER BY run_id, method;

CREATE OR REPLACE VIEW decision_staleness_summary AS
SELECT * EXCLUDE (step) FROM decision_over(by_staleness := true) ORDER BY run_id, staleness, method;

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

-- The safe staleness (DOMAIN.md 3b) for a tolerance: the largest staleness s such that every staleness
-- <= s with at least min_tokens tokens has gradient_mass_error <= max_gradient_mass_error and
-- clip_flip_rate <= max_clip_flip_rate; -1 when staleness 0 already fails; with no failure, the largest
-- staleness measured with enough tokens; NULL when no staleness has enough tokens.
CREATE OR REPLACE MACRO safe_staleness(max_gradient_mass_error := 0.01, max_clip_flip_rate := 0.01,
                                       min_tokens := 1000) AS TABLE
WITH levels AS (
    SELECT run_id, method, staleness, n >= min_tokens AS enough,
           coalesce(gradient_mass_error <= max_gradient_mass_error AND clip_flip_rate <= max_clip_flip_rate,
                    false) AS ok
    FROM decision_staleness_summary
)
SELECT run_id, method,
       CASE WHEN NOT bool_or(enough) THEN NULL
            ELSE coalesce(min(staleness) FILTER (WHERE enough AND NOT ok) - 1,
                          max(staleness) FILTER (WHERE enough)) END::INTEGER AS safe_staleness,
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

-- The data-driven warnings stored with each run (evaluator/validate/findings.py), newest first.
CREATE OR REPLACE VIEW run_findings AS
SELECT run_id, rule, column_name, n_rows, message, found_at FROM run_finding ORDER BY run_id, found_at DESC, rule;
