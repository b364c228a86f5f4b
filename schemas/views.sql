-- proxaudit metrics store: the macros and views over the tables of store.sql (the public interface, with
-- the views that schemas/store.py builds). Each statement is CREATE OR REPLACE: the store gets them on every
-- write, and readers define them as temporary objects, so a query always runs this SQL.

-- The representative value of a sketch bucket: the midpoint of its relative-width-1/64 interval.
-- bucket = sign(x) * ((bits(|x|) >> 46) - 62911), from the float64 bits of |x| (11 exponent + 6 mantissa
-- bits); bucket 0 holds |x| < 2^-40. Must agree with evaluator.formulas.sketch.bucket_value (a test checks).
CREATE OR REPLACE MACRO proxaudit_bucket_value(b) AS
    CASE WHEN b = 0 THEN 0.0
         ELSE sign(b) * pow(2.0, ((abs(b) + 62911) >> 6) - 1023) * (1.0 + (((abs(b) + 62911) & 63) + 0.5) / 64.0)
    END;

-- The public views run_summary, staleness_summary and step_summary are built from one query
-- (schemas/store.py: summary_sql), run after this file.

-- Exact moments by step and staleness together (for heat maps); no quantiles at this grain.
CREATE OR REPLACE VIEW step_staleness_summary AS
SELECT run_id, step, staleness, method, metric,
       sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
FROM metric_moments GROUP BY run_id, step, staleness, method, metric;

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
);

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
FROM by_staleness s LEFT JOIN by_staleness f ON f.run_id = s.run_id AND f.staleness = 0;

-- The data-driven warnings stored with each run (evaluator/validate/findings.py), newest first.
CREATE OR REPLACE VIEW run_findings AS
SELECT run_id, rule, column_name, n_rows, message, found_at FROM run_finding ORDER BY run_id, found_at DESC, rule;
