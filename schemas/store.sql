-- proxaudit metrics store (DuckDB), store schema version 1. Idempotent: run on every open for writing.
--
-- Tables are internal; the views at the end are the public interface (DOMAIN.md section 7).
-- Every row carries the file_id of the Parquet file it came from, so a file is ingested in one
-- transaction and all its summaries merge with those of other files by plain sums.

CREATE TABLE IF NOT EXISTS store_meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

CREATE TABLE IF NOT EXISTS ingested_file (
    file_id     INTEGER PRIMARY KEY,
    digest      VARCHAR NOT NULL UNIQUE,   -- BLAKE2b of the file bytes: the same bytes never count twice
    path        VARCHAR NOT NULL,          -- absolute path when ingested (the token inspector reads it)
    n_rows      BIGINT NOT NULL,
    n_tokens    BIGINT NOT NULL,           -- rows with loss_mask true
    ingested_at TIMESTAMP NOT NULL
);

-- Which runs, steps and staleness values each file holds, with token counts (loss_mask true).
CREATE TABLE IF NOT EXISTS file_tokens (
    file_id   INTEGER NOT NULL,
    run_id    VARCHAR NOT NULL,
    step      BIGINT NOT NULL,
    staleness INTEGER NOT NULL,
    n_tokens  BIGINT NOT NULL,
    n_prox    BIGINT NOT NULL                -- of which have prox_logp (the ground truth)
);

-- Exact moments at the finest grain: (run, step, staleness, method, metric).
CREATE TABLE IF NOT EXISTS metric_moments (
    file_id   INTEGER NOT NULL,
    run_id    VARCHAR NOT NULL,
    step      BIGINT NOT NULL,
    staleness INTEGER NOT NULL,
    method    VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    n         BIGINT NOT NULL,
    sum       DOUBLE NOT NULL,
    min       DOUBLE NOT NULL,
    max       DOUBLE NOT NULL
);

-- Mergeable quantile sketches: log-bucket histograms (see evaluator/sketch.py for the bucket code)
-- by step and by staleness. Run-level quantiles merge the staleness sketches.
CREATE TABLE IF NOT EXISTS sketch_by_step (
    file_id INTEGER NOT NULL,
    run_id  VARCHAR NOT NULL,
    step    BIGINT NOT NULL,
    method  VARCHAR NOT NULL,
    metric  VARCHAR NOT NULL,
    bucket  INTEGER NOT NULL,
    count   BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS sketch_by_staleness (
    file_id   INTEGER NOT NULL,
    run_id    VARCHAR NOT NULL,
    staleness INTEGER NOT NULL,
    method    VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    bucket    INTEGER NOT NULL,
    count     BIGINT NOT NULL
);

-- The representative value of a sketch bucket: the midpoint of its relative-width-1/64 interval.
-- bucket = sign(x) * ((bits(|x|) >> 46) - 62911), from the float64 bits of |x| (11 exponent + 6 mantissa
-- bits); bucket 0 holds |x| < 2^-40. Must agree with evaluator.sketch.bucket_value (a test checks).
CREATE OR REPLACE MACRO proxaudit_bucket_value(b) AS
    CASE WHEN b = 0 THEN 0.0
         ELSE sign(b) * pow(2.0, ((abs(b) + 62911) >> 6) - 1023) * (1.0 + (((abs(b) + 62911) & 63) + 0.5) / 64.0)
    END;

CREATE OR REPLACE VIEW run_summary AS
WITH moments AS (
    SELECT run_id, method, metric, sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
    FROM metric_moments GROUP BY run_id, method, metric
), buckets AS (
    SELECT run_id, method, metric, bucket, sum(count) AS c
    FROM sketch_by_staleness GROUP BY run_id, method, metric, bucket
), ranked AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, method, metric ORDER BY bucket
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
    FROM buckets
), quantiles AS (
    SELECT r.run_id, r.method, r.metric,
           min(r.bucket) FILTER (WHERE r.cum > 0.50 * (m.n - 1)) AS b50,
           min(r.bucket) FILTER (WHERE r.cum > 0.90 * (m.n - 1)) AS b90,
           min(r.bucket) FILTER (WHERE r.cum > 0.99 * (m.n - 1)) AS b99
    FROM ranked r JOIN moments m USING (run_id, method, metric)
    GROUP BY r.run_id, r.method, r.metric
)
SELECT m.run_id, m.method, m.metric, m.n, m.mean, m.min, m.max,
       least(greatest(proxaudit_bucket_value(q.b50), m.min), m.max) AS p50,
       least(greatest(proxaudit_bucket_value(q.b90), m.min), m.max) AS p90,
       least(greatest(proxaudit_bucket_value(q.b99), m.min), m.max) AS p99
FROM moments m JOIN quantiles q USING (run_id, method, metric);

CREATE OR REPLACE VIEW staleness_summary AS
WITH moments AS (
    SELECT run_id, staleness, method, metric,
           sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
    FROM metric_moments GROUP BY run_id, staleness, method, metric
), buckets AS (
    SELECT run_id, staleness, method, metric, bucket, sum(count) AS c
    FROM sketch_by_staleness GROUP BY run_id, staleness, method, metric, bucket
), ranked AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, staleness, method, metric ORDER BY bucket
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
    FROM buckets
), quantiles AS (
    SELECT r.run_id, r.staleness, r.method, r.metric,
           min(r.bucket) FILTER (WHERE r.cum > 0.50 * (m.n - 1)) AS b50,
           min(r.bucket) FILTER (WHERE r.cum > 0.90 * (m.n - 1)) AS b90,
           min(r.bucket) FILTER (WHERE r.cum > 0.99 * (m.n - 1)) AS b99
    FROM ranked r JOIN moments m USING (run_id, staleness, method, metric)
    GROUP BY r.run_id, r.staleness, r.method, r.metric
)
SELECT m.run_id, m.staleness, m.method, m.metric, m.n, m.mean, m.min, m.max,
       least(greatest(proxaudit_bucket_value(q.b50), m.min), m.max) AS p50,
       least(greatest(proxaudit_bucket_value(q.b90), m.min), m.max) AS p90,
       least(greatest(proxaudit_bucket_value(q.b99), m.min), m.max) AS p99
FROM moments m JOIN quantiles q USING (run_id, staleness, method, metric);

CREATE OR REPLACE VIEW step_summary AS
WITH moments AS (
    SELECT run_id, step, method, metric,
           sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
    FROM metric_moments GROUP BY run_id, step, method, metric
), buckets AS (
    SELECT run_id, step, method, metric, bucket, sum(count) AS c
    FROM sketch_by_step GROUP BY run_id, step, method, metric, bucket
), ranked AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, step, method, metric ORDER BY bucket
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum
    FROM buckets
), quantiles AS (
    SELECT r.run_id, r.step, r.method, r.metric,
           min(r.bucket) FILTER (WHERE r.cum > 0.50 * (m.n - 1)) AS b50,
           min(r.bucket) FILTER (WHERE r.cum > 0.90 * (m.n - 1)) AS b90,
           min(r.bucket) FILTER (WHERE r.cum > 0.99 * (m.n - 1)) AS b99
    FROM ranked r JOIN moments m USING (run_id, step, method, metric)
    GROUP BY r.run_id, r.step, r.method, r.metric
)
SELECT m.run_id, m.step, m.method, m.metric, m.n, m.mean, m.min, m.max,
       least(greatest(proxaudit_bucket_value(q.b50), m.min), m.max) AS p50,
       least(greatest(proxaudit_bucket_value(q.b90), m.min), m.max) AS p90,
       least(greatest(proxaudit_bucket_value(q.b99), m.min), m.max) AS p99
FROM moments m JOIN quantiles q USING (run_id, step, method, metric);

-- Exact moments by step and staleness together (for heat maps); no quantiles at this grain.
CREATE OR REPLACE VIEW step_staleness_summary AS
SELECT run_id, step, staleness, method, metric,
       sum(n)::BIGINT AS n, sum(sum) / sum(n) AS mean, min(min) AS min, max(max) AS max
FROM metric_moments GROUP BY run_id, step, staleness, method, metric;
