"""verl's rollout_corr diagnostics in the store (issue 36 item 2): every verl-named column of
`rollout_corr_summary`, in the row of each `rollout_is` mode, equals verl's computation (written from its
source in `tests/verl_reference.py`) on the fixture runs' tokens taken as one verl batch per run and
method."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evaluator.store import open_store
from schemas.store import ROLLOUT_CORR_COLUMNS
from tests.conftest import FIXTURES
from tests.reference import estimates, loss_tokens
from tests.verl_reference import rollout_corr

PROXAUDIT_OWN = ("seq_is_ess_fraction", "seq_geo_weight_mean", "seq_geo_ess_fraction")
"""proxaudit's ESS of the sequence weights, and the share of sequences with a token outside [1/T, T]
(verl's token_k1 option at threshold 0.5_2.0): not compared here."""
NOT_VERL = (
    "method",
    "rollout_is",
    "n",
    "n_sequences",
    "rollout_rs_token_k1_seq_masked_fraction",
    *PROXAUDIT_OWN,
)


def padded(df, values: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the estimate, behave_logp, the response mask) as verl's padded [sequences, length] batch."""
    keys = df.groupby(["seq_id", "minibatch"], sort=False).ngroup().to_numpy()
    position = df.groupby(["seq_id", "minibatch"], sort=False).cumcount().to_numpy()
    shape = (keys.max() + 1, position.max() + 1)
    old, rollout, mask = (torch.zeros(shape, dtype=torch.float64) for _ in range(3))
    old[keys, position] = torch.tensor(values)
    rollout[keys, position] = torch.tensor(df["behave_logp"].to_numpy(np.float64))
    mask[keys, position] = 1.0
    return old, rollout, mask


def test_verl_columns_equal_verl_on_the_fixtures(fixture_store):
    files = [p for run in ("recompute", "loglinear") for p in sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3]]
    df = loss_tokens(files)
    with open_store(fixture_store) as con:
        got = con.sql("SELECT * FROM rollout_corr_summary").df()
    assert list(got.columns) == ["run_id", *ROLLOUT_CORR_COLUMNS]
    compared = 0
    for run, tokens in df.groupby("run_id"):
        tokens = tokens.reset_index(drop=True)
        for method, values in estimates(tokens).items():
            whole = ~tokens.assign(v=values).groupby(["seq_id", "minibatch"])["v"].transform(
                lambda v: v.isna().any()
            )
            if method == "proximal_t" or not whole.any():
                continue
            part = tokens[whole.to_numpy()].reset_index(drop=True)
            batch = padded(part, values[whole.to_numpy()])
            for mode in ("token", "sequence"):
                expected = rollout_corr(*batch, mode)
                row = got[(got["run_id"] == run) & (got["method"] == method) & (got["rollout_is"] == mode)]
                assert len(row) == 1, (run, method, mode)
                for column in (c for c in ROLLOUT_CORR_COLUMNS if c not in NOT_VERL):
                    value = row[column].item()
                    assert value == pytest.approx(expected[column], rel=1e-9, abs=1e-12), (
                        run,
                        method,
                        mode,
                        column,
                    )
                    compared += 1
    assert compared > 1500
    token, sequence = (
        got[got["rollout_is"] == m].set_index(["run_id", "method"]) for m in ("token", "sequence")
    )
    differ = token["rollout_is_seq_fraction_low"] != sequence["rollout_is_seq_fraction_low"]
    assert differ.any()  # each mode's sequence fraction in its own row
