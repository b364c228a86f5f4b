-- proxaudit metrics store (a DuckLake), store schema version 8: the tables. Idempotent. Tables are internal;
-- the views of views.sql (and schemas/store.py) are the public interface. A DuckLake has no primary keys
-- or unique constraints: the writer keeps each rule below in a transaction that re-checks it and
-- retries when another writer committed first (evaluator/store/writer.py). A file is ingested in one
-- transaction (one snapshot); every row of it carries its file_id, and its summaries merge with those of
-- other files by plain sums. What is judged on a whole run (findings, checks, intervals) is computed from
-- the stored per-file rows (evaluator/store/derived.py), so it depends on the set of files stored alone.

CREATE TABLE IF NOT EXISTS store_meta (
    key   VARCHAR NOT NULL,                -- one row per key
    value VARCHAR NOT NULL
);

CREATE TABLE IF NOT EXISTS ingested_file (
    file_id     BIGINT NOT NULL,           -- the first 60 bits of the digest: the same in every store
    digest      VARCHAR NOT NULL,          -- BLAKE2b of the file bytes, once per store: never counted twice
    path        VARCHAR NOT NULL,          -- absolute path or object-storage URI (the token inspector reads it)
    n_rows      BIGINT NOT NULL,
    n_tokens    BIGINT NOT NULL,           -- rows with loss_mask true
    ingested_at TIMESTAMP NOT NULL
);

-- The identity of each file's tokens (DOMAIN.md section 6): one row per sequence with its pos range.
-- A file that repeats a token of another file is refused, so a token is stored at most once.
CREATE TABLE IF NOT EXISTS file_sequences (
    file_id   BIGINT NOT NULL,
    run_id    VARCHAR NOT NULL,
    seq_id    BIGINT NOT NULL,
    minibatch INTEGER NOT NULL,
    pos_min   INTEGER NOT NULL,
    pos_max   INTEGER NOT NULL
);

-- Which runs, steps and staleness values each file holds, with token counts (loss_mask true).
CREATE TABLE IF NOT EXISTS file_tokens (
    file_id   BIGINT NOT NULL,
    run_id    VARCHAR NOT NULL,
    step      BIGINT NOT NULL,
    staleness INTEGER NOT NULL,
    n_tokens  BIGINT NOT NULL,
    n_prox    BIGINT NOT NULL                -- of which have prox_logp (the ground truth)
);

-- Exact moments at the finest grain: (run, step, staleness, method, metric). The sum of squares makes
-- std, ESS and chi2 exact for any selection.
CREATE TABLE IF NOT EXISTS metric_moments (
    file_id   BIGINT NOT NULL,
    run_id    VARCHAR NOT NULL,
    step      BIGINT NOT NULL,
    staleness INTEGER NOT NULL,
    method    VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    n         BIGINT NOT NULL,
    sum       DOUBLE NOT NULL,
    sum_sq    DOUBLE NOT NULL,
    min       DOUBLE NOT NULL,
    max       DOUBLE NOT NULL
);

-- Mergeable quantile sketches: log-bucket histograms (see evaluator/formulas/sketch.py for the bucket code)
-- by step and by staleness, per file. Run-level quantiles merge the staleness sketches.
CREATE TABLE IF NOT EXISTS sketch_by_step (
    file_id BIGINT NOT NULL,
    run_id  VARCHAR NOT NULL,
    step    BIGINT NOT NULL,
    method  VARCHAR NOT NULL,
    metric  VARCHAR NOT NULL,
    bucket  INTEGER NOT NULL,
    count   BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS sketch_by_staleness (
    file_id   BIGINT NOT NULL,
    run_id    VARCHAR NOT NULL,
    staleness INTEGER NOT NULL,
    method    VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    bucket    INTEGER NOT NULL,
    count     BIGINT NOT NULL
);

-- The data-driven warnings about each run (evaluator/validate/findings.py; an error skips the run's files instead),
-- judged on the evidence of every stored file of the run (file_evidence): one row per run and rule. A run the gate judges has a warning count (0 when it has no row here).
CREATE TABLE IF NOT EXISTS run_finding (
    run_id      VARCHAR NOT NULL,
    rule        VARCHAR NOT NULL,
    column_name VARCHAR,
    n_rows      BIGINT NOT NULL,           -- the tokens the evidence is about
    message     VARCHAR NOT NULL,          -- what was seen, example tokens and what to check in the trainer
    found_at    TIMESTAMP NOT NULL,
    figure      DOUBLE,                    -- the figure the threshold judged
    threshold   VARCHAR NOT NULL,          -- the threshold it crossed, e.g. '>= 95% of the stale tokens'
    examples    VARCHAR NOT NULL,          -- a few tokens carrying the signal, 'step 3 seq_id 7 minibatch 0 pos 2; ...'
    advice      VARCHAR NOT NULL           -- what to check in the trainer, one line
);

-- What each check of the findings made of each run, on the evidence of every stored file of the run: passed, found
-- (its finding is in run_finding, or was an error), or undecided, with why (a column absent, one
-- minibatch, too few tokens). The dashboard's Overview lists the undecided ones.
CREATE TABLE IF NOT EXISTS run_check (
    run_id     VARCHAR NOT NULL,
    check_name VARCHAR NOT NULL,
    status     VARCHAR NOT NULL,           -- passed, found or undecided
    why        VARCHAR NOT NULL,           -- the rule found, or why the data cannot decide
    checked_at TIMESTAMP NOT NULL
);

-- Every metric's definition (schemas/store.py METRIC_TABLE), written by each replay: what a store's
-- metrics mean, and which are 0/1 (their quantiles follow from their mean).
CREATE TABLE IF NOT EXISTS metric_definition (
    metric      VARCHAR NOT NULL,
    formula     VARCHAR NOT NULL,
    needs_truth BOOLEAN NOT NULL,
    methods     VARCHAR NOT NULL,          -- all, estimators or ground_truth
    per         VARCHAR NOT NULL,          -- token, or sequence (n counts sequences)
    is_binary   BOOLEAN NOT NULL
);

-- 95% intervals of the decision figures and of their excess over the engine floor (rollout at staleness
-- 0), by a bootstrap over steps (evaluator/formulas/bootstrap.py) of the stored per-step sums, for each
-- run (staleness NULL) and each (run, staleness); the views join them.
CREATE TABLE IF NOT EXISTS decision_interval (
    run_id       VARCHAR NOT NULL,
    staleness    INTEGER,
    method       VARCHAR NOT NULL,
    n_steps      INTEGER NOT NULL,
    figure       VARCHAR NOT NULL,
    lower        DOUBLE,
    upper        DOUBLE,
    excess_lower DOUBLE,
    excess_upper DOUBLE
);

-- ... and of the error metrics' means.
CREATE TABLE IF NOT EXISTS mean_interval (
    run_id    VARCHAR NOT NULL,
    staleness INTEGER,
    method    VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    lower     DOUBLE,
    upper     DOUBLE
);

-- Each file's evidence for the findings (evaluator/validate/evidence.py: every table of `Evidence` and its
-- examples), as Arrow IPC streams: the findings of a run are judged on the evidence of all its files added
-- up, whatever tables the evidence has.
CREATE TABLE IF NOT EXISTS file_evidence (
    file_id BIGINT NOT NULL,
    name    VARCHAR NOT NULL,                -- the table of the evidence, or 'examples'
    ipc     BLOB NOT NULL
);

-- The files each run's derived rows (run_finding, run_check, decision_interval, mean_interval) were
-- computed from: their number, the xor of their file_ids, and the trainer's maximum staleness the
-- findings judged (-1: none given). A run whose files differ is recomputed by the next writer.
CREATE TABLE IF NOT EXISTS run_state (
    run_id        VARCHAR NOT NULL,
    n_files       BIGINT NOT NULL,
    files_xor     BIGINT NOT NULL,
    max_staleness INTEGER NOT NULL
);

-- One row that every ingest updates: two writers ingesting at once conflict on it, and the one that
-- commits second re-checks its file against the first's (a catalog that does not already serialise
-- writers, such as PostgreSQL, detects the conflict only on a row both changed).
CREATE TABLE IF NOT EXISTS ingest_ticket (
    n BIGINT NOT NULL
);

-- The what-if table (replay --loss a,b,c): each run judged under each loss of the list, as a separate replay
-- of the call's files under that loss and the gate's default thresholds would judge it, at the staleness
-- the gate judges (evaluator/verdict/what_if.py). The store's own figures stay those of its loss (own: the
-- row of that loss, judged on the store). One row per (run, loss, gated method); a replay with a list
-- replaces the rows of the runs it judged. Figures pooled over every staleness, with their 95% intervals.
CREATE TABLE IF NOT EXISTS what_if (
    run_id                            VARCHAR NOT NULL,
    loss                              VARCHAR NOT NULL,  -- as given to --loss: a preset name or a TOML file
    own                               BOOLEAN NOT NULL,  -- the store's own loss (the first of the list)
    description                       VARCHAR NOT NULL,  -- the loss in words
    method                            VARCHAR NOT NULL,  -- the gated method
    action                            VARCHAR NOT NULL,  -- ship, ship_up_to, do_not_ship or undecided
    max_staleness                     INTEGER,           -- k: safe up to it (0 for do_not_ship)
    judged_staleness                  INTEGER,           -- S: the staleness judged up to
    staleness_source                  VARCHAR NOT NULL,  -- where S comes from
    reason                            VARCHAR NOT NULL,  -- the figure the decision rests on, in words
    n                                 BIGINT,
    n_steps                           INTEGER,
    gradient_mass_error               DOUBLE,
    gradient_mass_error_lower         DOUBLE,
    gradient_mass_error_upper         DOUBLE,
    clip_flip_rate                    DOUBLE,
    clip_flip_rate_lower              DOUBLE,
    clip_flip_rate_upper              DOUBLE,
    excess_gradient_mass_error        DOUBLE,
    excess_gradient_mass_error_lower  DOUBLE,
    excess_gradient_mass_error_upper  DOUBLE,
    safe_staleness                    INTEGER,
    safe_staleness_lower              INTEGER,
    safe_staleness_upper              INTEGER,
    safe_staleness_beyond_floor       INTEGER,
    safe_staleness_beyond_floor_lower INTEGER,
    safe_staleness_beyond_floor_upper INTEGER,
    sentence                          VARCHAR NOT NULL,  -- the decision in one sentence
    judged_at                         TIMESTAMP NOT NULL     -- key (run_id, loss, method): record_what_if keeps it
);
