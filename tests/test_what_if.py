"""The what-if table (issue 36 item 4): `replay --loss a,b,c` judges each run under every loss of the list.

On a crafted log whose answer per loss is known: on every other stale token the behaviour policy gave the
token 1.8 nats less than the proximal policy (w(g - b) = e^1.8 > 5), where AReaL's loglinear estimate at
staleness 1 is behave itself (w(a - b) = 1). A loss that masks the behaviour weight above 5 masks those tokens
under the truth and keeps them under the estimate: a large gradient mass error, do not ship. The same loss
with a bound of 1e6 and a clip band no token reaches has the true W under every estimate: ship. Each row
equals a separate single-loss replay + gate of its loss, and its gradient mass error numpy's over the log."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from evaluator.logio import write_log_atomic
from evaluator.store import connect_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.reference import decision_figures, reference_values

WIDE = "eps_low = 0.9\neps_high = 10.0\n"  # a clip band [0.1, 11]: no token's ratio reaches it
LOSSES = {"masked.toml": WIDE + "bound = 5.0\n", "unbounded.toml": WIDE + "bound = 1e6\n"}
BOUNDS = {"masked.toml": 5.0, "unbounded.toml": 1e6}
GATED = "loglinear_shipped"


@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> Path:
    """The log (module docstring), the two loss files and, replayed with `--loss masked.toml,unbounded.toml,
    default`, the store `main`; each loss alone in `<loss>-store`."""
    folder = tmp_path_factory.mktemp("what_if")
    spec = SyntheticSpec(run_id="w", tokens_per_step=4096, max_staleness=2, resume_fraction=0.0,
                         with_proximal_t=False)  # fmt: skip
    table = synthetic_steps(spec, 2, 12)
    stale = (table["step"].to_numpy() - table["behave_version"].to_numpy()) >= 1
    drifted = stale & (table["pos"].to_numpy() % 2 == 0)
    g = table["prox_logp"].to_numpy(zero_copy_only=False).astype(np.float64)
    b = np.where(drifted, g - 1.8, table["behave_logp"].to_numpy()).astype(np.float32)
    i = table.schema.get_field_index("behave_logp")
    write_log_atomic(table.set_column(i, table.schema.field(i), pa.array(b)), folder / "w.parquet")
    for name, text in LOSSES.items():
        (folder / name).write_text(text)
    return folder


def invoke(folder: Path, *args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def replayed(crafted) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(crafted)
        result = invoke(crafted, "replay", "w.parquet", "--db", "main", "--loss",
                        "masked.toml,unbounded.toml,default")  # fmt: skip
        assert result.exit_code == EXIT_OK, result.output
        for name in (*LOSSES, "default"):
            alone = invoke(crafted, "replay", "w.parquet", "--db", f"{name}-store", "--loss", name)
            assert alone.exit_code == EXIT_OK, alone.output
    (crafted / "replay.out").write_text(result.output)
    return crafted


def rows(db: Path) -> dict[str, dict]:
    with connect_store(db) as con:
        table = con.sql("SELECT * FROM what_if").to_arrow_table().to_pylist()
    return {r["loss"]: r for r in table}


def gate_json(folder: Path, db: str) -> dict:
    out = folder / f"{db}.gate.json"
    result = invoke(folder, "gate", "--db", str(folder / db), "--json", str(out))
    assert result.exit_code in (0, 1), result.output
    return json.loads(out.read_text())


def test_each_loss_equals_its_own_replay_and_gate(replayed):
    """Every row: the decision, its sentence and figures of a separate single-loss replay + gate, to the
    digit; the store's own loss marked."""
    table = rows(replayed / "main")
    assert set(table) == {*LOSSES, "default"} and [n for n, r in table.items() if r["own"]] == ["masked.toml"]
    for name, row in table.items():
        alone = gate_json(replayed, f"{name}-store")
        (decision,) = alone["decisions"]
        assert (row["run_id"], row["method"]) == (decision["run_id"], decision["method"]) == ("w", GATED)
        assert row["action"] == decision["action"] and row["max_staleness"] == decision["max_staleness"]
        assert row["sentence"] == decision["sentence"], name
        with connect_store(replayed / f"{name}-store") as con:
            pooled = con.execute(
                "SELECT gradient_mass_error, gradient_mass_error_lower, gradient_mass_error_upper, "
                "clip_flip_rate, n FROM decision_summary WHERE run_id = 'w' AND method = ?", [GATED]
            ).fetchone()  # fmt: skip
        figures = ("gradient_mass_error", "gradient_mass_error_lower", "gradient_mass_error_upper")
        assert (*(row[f] for f in figures), row["clip_flip_rate"], row["n"]) == pooled, name


def test_the_answer_known_per_loss(replayed):
    """numpy over the log: the masked loss moves a large share of the gradient mass (do not ship beyond
    staleness 0); the unbounded one moves none and flips no clip (ship up to S = 2)."""
    table = rows(replayed / "main")
    for name, bound in BOUNDS.items():
        values = reference_values([replayed / "w.parquet"], eps_low=0.9, eps_high=10.0, bound=bound)
        expected = decision_figures(values, ["run_id"]).loc[("w", GATED)]
        assert table[name]["gradient_mass_error"] == pytest.approx(expected["gradient_mass_error"], rel=1e-9)
        assert table[name]["clip_flip_rate"] == pytest.approx(expected["clip_flip_rate"], rel=1e-9, abs=1e-15)
    masked, unbounded = table["masked.toml"], table["unbounded.toml"]
    assert masked["gradient_mass_error_lower"] > 0.1 and masked["action"] == "do_not_ship"
    assert masked["max_staleness"] == 0 and "Do not ship" in masked["sentence"]
    assert (
        unbounded["gradient_mass_error"] == pytest.approx(0, abs=1e-12) and unbounded["clip_flip_rate"] == 0
    )
    assert unbounded["action"] == "ship" and unbounded["max_staleness"] == unbounded["judged_staleness"] == 2


def test_the_store_s_own_gate_is_unchanged(replayed):
    """The store keeps the first loss, and its gate says what a replay under that loss alone says."""
    main, alone = gate_json(replayed, "main"), gate_json(replayed, "masked.toml-store")
    for document in (main, alone):
        document.pop("db", None)
    assert main == alone


def test_replay_says_each_loss_s_decision(replayed):
    text = (replayed / "replay.out").read_text()
    assert "what-if: unbounded.toml, default, judged beside it" in text
    assert "- under masked.toml (the store's loss): Do not ship" in text
    assert "- under unbounded.toml: Ship loglinear_shipped" in text


def test_summary_by_what_if(replayed):
    db = str(replayed / "main")
    text = invoke(replayed, "summary", "--db", db, "--by", "what-if")
    assert text.exit_code == EXIT_OK, text.output
    head = text.output.splitlines()[0].split()
    assert head[:4] == ["run_id", "loss", "own", "action"]
    assert "- under default: Do not ship" in text.output
    as_json = json.loads(
        invoke(replayed, "summary", "--db", db, "--by", "what-if", "--format", "json").output
    )
    assert [r["loss"] for r in as_json] == ["masked.toml", "default", "unbounded.toml"]
    assert {"sentence", "reason", "excess_gradient_mass_error_lower", "safe_staleness_upper"} <= set(
        as_json[0]
    )
    csv = invoke(replayed, "summary", "--db", db, "--by", "what-if", "--format", "csv").output
    assert (
        csv.splitlines()[0].startswith("run_id,loss,own,description,method,action")
        and len(csv.splitlines()) == 4
    )


def test_a_store_without_a_what_if_says_how_to_make_one(replayed):
    result = invoke(replayed, "summary", "--db", str(replayed / "default-store"), "--by", "what-if")
    assert result.exit_code == EXIT_FINDINGS and "--loss a,b,c" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--loss", "default,nope"], "'nope': neither a preset"),
        (["--loss", "default,areal-gspo,default"], "default named twice"),
        (["--loss", "default,,areal-gspo"], "an empty name"),
        (["--loss", "default,areal-gspo", "--eps-low", "0.1"], "takes no --loss-from, --eps-low"),
        (["--loss", "default,areal-gspo", "--loss-from", "x.yaml"], "takes no --loss-from"),
        (["--thresholds", "x.toml"], "--thresholds judges the what-if table"),
    ],
)
def test_a_bad_list_is_refused_before_any_work(crafted, tmp_path, args, says):
    db = tmp_path / "metrics"
    result = invoke(crafted, "replay", str(crafted / "w.parquet"), "--db", str(db), *args)
    assert result.exit_code == EXIT_USAGE and says in result.output, result.output
    assert not db.exists()


def test_other_commands_take_one_loss(crafted):
    result = invoke(crafted, "loss", "--loss", "default,areal-gspo")
    assert result.exit_code == EXIT_USAGE and "a list of losses is replay's what-if" in result.output


def test_the_overview_shows_the_table(replayed, monkeypatch):
    """The Overview's section: each loss's sentence as plain text and the table, the store's loss first; a
    store without a what-if says how to make one."""
    from tests.test_dashboard_app import no_exception, run_app

    at = run_app(replayed / "main", monkeypatch, page="overview", run="w")
    no_exception(at)
    assert "What if the trainer ran another loss?" in [s.value for s in at.subheader]
    (block,) = [t.value for t in at.text if t.value.startswith("- under ")]
    assert block.splitlines()[0].startswith("- under masked.toml (the store's loss): Do not ship")
    table = next(f.value for f in at.dataframe if "loss" in f.value.columns and "action" in f.value.columns)
    assert list(table["loss"]) == ["masked.toml", "default", "unbounded.toml"]
    assert list(table["action"]) == ["do_not_ship", "do_not_ship", "ship"]
    bare = run_app(replayed / "default-store", monkeypatch, page="overview", run="w")
    no_exception(bare)
    assert any("No what-if on this run" in c.value for c in bare.caption)
