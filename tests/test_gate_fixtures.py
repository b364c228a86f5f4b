"""The gate on real data: the logs in `fixtures/` (made by the reference trainer) replayed once into a
database. Every kind of check is shown both passing and failing, with thresholds set relative to the
observed values (x0.5 and x2) so the tests stay meaningful when the fixtures are regenerated; every kind
of bad configuration exits with 2."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_gate import selection_stats

from evaluator.cli import cli
from evaluator.gate import run_gate
from evaluator.gate.judge import load_thresholds
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store
from schemas.store import STATS
from schemas.thresholds import DEFAULT_THRESHOLDS
from tests.reference import stored_excess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
METHOD, METRIC = "loglinear", "abs_error"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """The fixture logs replayed into a fresh database (once for this module)."""
    logs = sorted(FIXTURES.glob("*.parquet"))
    assert logs, f"no fixture logs in {FIXTURES}"
    path = tmp_path_factory.mktemp("gate") / "fixtures"
    report = replay([str(p) for p in logs], path, progress=False)
    assert report.clean and report.n_ingested == len(logs)
    return path


@pytest.fixture(scope="module")
def views(db) -> dict:
    """Per run, the loglinear abs_error row of `run_summary` (the public view) and the staleness values."""
    con = connect_store(db)
    rows = con.execute(
        "SELECT * FROM run_summary WHERE method = ? AND metric = ?", [METHOD, METRIC]
    ).fetchall()
    summary = {row[0]: dict(zip(STATS, row[3 : 3 + len(STATS)], strict=True)) for row in rows}
    staleness = con.execute("SELECT DISTINCT staleness FROM file_tokens ORDER BY 1").fetchall()
    con.close()
    assert len(summary) >= 2, "the fixtures should hold at least two runs (for the baseline checks)"
    return {"summary": summary, "staleness": [s[0] for s in staleness]}


@pytest.fixture(scope="module")
def run(views) -> str:
    """The run with the most tokens."""
    return max(views["summary"], key=lambda r: views["summary"][r]["n"])


def gate(db: Path, tmp_path: Path, body: str, **options) -> tuple[int, dict]:
    """Run `proxaudit gate` on `body` (TOML); return the exit code and the JSON report."""
    thresholds = tmp_path / "gate.toml"
    thresholds.write_text(body)
    report = tmp_path / "gate.json"
    args = ["gate", "--db", str(db), "--thresholds", str(thresholds), "--json", str(report)]
    for key, value in options.items():
        args += [f"--{key}", value]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in (0, 1, 2), result.output
    return result.exit_code, (
        json.loads(report.read_text()) if result.exit_code != 2 else {"error": result.output}
    )


def check_toml(run: str, stat: str, metric: str = METRIC, **keys) -> str:
    lines = [
        "[[check]]",
        f'method = "{METHOD}"',
        f'metric = "{metric}"',
        f'stat = "{stat}"',
        f'run = "{run}"',
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def verdicts(report: dict) -> list[tuple[str, str]]:
    return [(v["verdict"], v["outcome"]) for v in report["verdicts"]]


@pytest.mark.parametrize("stat", STATS)
def test_max_and_min_pass_and_fail_on_every_stat(db, views, run, tmp_path, stat):
    observed = views["summary"][run][stat]
    spread = max(0.5 * abs(observed), 1e-6)  # the min of abs_error can be exactly 0
    body = "".join(
        [
            check_toml(run, stat, name="max above", max=observed + spread),
            check_toml(run, stat, name="max below", max=observed - spread),
            check_toml(run, stat, name="min below", min=observed - spread),
            check_toml(run, stat, name="min above", min=observed + spread),
        ]
    )
    code, report = gate(db, tmp_path, body)
    assert code == 1
    assert verdicts(report) == [("pass", "ok"), ("fail", "threshold"), ("pass", "ok"), ("fail", "threshold")]
    # the public view's value (to the last bits DuckDB's parallel sums may order differently)
    assert all(v["observed"] == pytest.approx(observed, rel=1e-12) for v in report["verdicts"])
    code, _ = gate(db, tmp_path, check_toml(run, stat, max=observed + spread, min=observed - spread))
    assert code == 0


def test_staleness_range_passes_and_fails(db, views, run, tmp_path):
    lo, hi = 1, max(2, min(4, views["staleness"][-1]))
    con = connect_store(db)
    sql = "SELECT n, mean FROM staleness_summary WHERE run_id = ? AND method = ? AND metric = ?"
    sql += " AND staleness BETWEEN ? AND ?"
    per = con.execute(sql, [run, METHOD, METRIC, lo, hi]).fetchall()
    expected = selection_stats(con, METHOD, METRIC, (lo, hi))[run]
    con.close()
    # exact moments of the range agree with the public per-staleness view
    assert expected["n"] == sum(n for n, _ in per) and len(per) == hi - lo + 1
    assert expected["mean"] == pytest.approx(sum(n * m for n, m in per) / expected["n"], rel=1e-12)
    body = "".join(
        check_toml(run, stat, name=f"{stat} {factor}", max=factor * expected[stat], staleness=[lo, hi])
        for stat in ("mean", "p90", "p99")
        for factor in (2.0, 0.5)
    )
    code, report = gate(db, tmp_path, body)
    assert code == 1
    assert [v for v, _ in verdicts(report)] == ["pass", "fail"] * 3
    assert {v["tokens"] for v in report["verdicts"]} == {expected["n"]} and expected["n"] < views["summary"][
        run
    ]["n"]
    # the range's p99 is its own, not the whole run's
    assert report["verdicts"][4]["observed"] == expected["p99"]


def test_baseline_regression_passes_and_fails(db, views, tmp_path):
    summary = views["summary"]
    worse, better = sorted(summary, key=lambda r: summary[r]["mean"], reverse=True)[:2]
    ratio = summary[worse]["mean"] / summary[better]["mean"] - 1.0
    assert ratio > 0.01, "two fixture runs should differ in loglinear abs_error"
    body = "".join(
        [
            check_toml(
                worse, "mean", name="within 2x the gap", baseline_run=better, max_regression=2 * ratio
            ),
            check_toml(
                worse, "mean", name="within half the gap", baseline_run=better, max_regression=ratio / 2
            ),
            check_toml(
                better, "mean", name="better than its baseline", baseline_run=worse, max_regression=0.0
            ),
        ]
    )
    code, report = gate(db, tmp_path, body)
    assert code == 1
    assert verdicts(report) == [("pass", "ok"), ("fail", "regression"), ("pass", "ok")]
    first = report["verdicts"][1]
    assert first["baseline_value"] == pytest.approx(summary[better]["mean"], rel=1e-12)
    assert first["observed"] == pytest.approx(summary[worse]["mean"], rel=1e-12)
    assert first["regression_limit"] == pytest.approx(summary[better]["mean"] * (1 + ratio / 2))
    # a `min` check regresses downwards: the run with fewer tokens is worse on n
    fewer, more = sorted(summary, key=lambda r: summary[r]["n"])[:2]
    if summary[fewer]["n"] < summary[more]["n"]:
        drop = 1.0 - summary[fewer]["n"] / summary[more]["n"]
        body = check_toml(fewer, "n", min=1, baseline_run=more, max_regression=drop / 2)
        body += check_toml(
            fewer, "n", name="n generous", min=1, baseline_run=more, max_regression=min(1.0, 2 * drop)
        )
        assert verdicts(gate(db, tmp_path, body)[1]) == [("fail", "regression"), ("pass", "ok")]


def test_insufficient_data_fails_or_warns_and_enough_passes(db, views, run, tmp_path):
    n = views["summary"][run]["n"]
    body = "".join(
        [
            check_toml(run, "mean", name="enough", max=1e9, min_tokens=n),
            check_toml(run, "mean", name="one short, fail", max=1e9, min_tokens=n + 1),
            check_toml(
                run, "mean", name="one short, warn", max=1e9, min_tokens=n + 1, on_insufficient="warn"
            ),
            check_toml(run, "mean", name="empty range", max=1e9, staleness=[1000, 2000]),
        ]
    )
    code, report = gate(db, tmp_path, body)
    assert code == 1
    assert verdicts(report) == [
        ("pass", "ok"),
        ("fail", "insufficient_data"),
        ("warn", "insufficient_data"),
        ("fail", "insufficient_data"),
    ]
    code, report = gate(
        db, tmp_path, check_toml(run, "mean", max=1e9, min_tokens=n + 1, on_insufficient="warn")
    )
    assert code == 0  # a warning does not fail the gate


def test_warn_only_and_missing_run(db, views, run, tmp_path):
    observed = views["summary"][run]["p99"]
    code, report = gate(db, tmp_path, check_toml(run, "p99", max=0.5 * observed, warn_only=True))
    assert (code, verdicts(report)) == (0, [("warn", "threshold")])
    body = check_toml(run, "p99", max=1e9).replace(f'run = "{run}"', 'run = "no-such-run"')
    assert verdicts(gate(db, tmp_path, body)[1]) == [("fail", "missing_run")]


def test_missing_metric_on_a_run_logged_without_the_recompute_pass(tmp_path):
    """A real fixture log with `prox_logp` dropped (as a trainer running `loglinear` in production logs
    it): the error metrics cannot be measured, so they fail; the weights are still there and judged."""
    source = sorted(FIXTURES.glob("*.parquet"))[0]
    table = pq.read_table(source)
    n = table.num_rows
    table = table.set_column(
        table.schema.get_field_index("prox_logp"), "prox_logp", pa.nulls(n, pa.float32())
    )
    run = table.column("run_id")[0].as_py() + "-no-recompute"
    table = table.set_column(
        table.schema.get_field_index("run_id"), "run_id", pa.array([run] * n, pa.string())
    )
    write_log_atomic(table, tmp_path / "logs" / "no_recompute.parquet")
    db = tmp_path / "no_recompute"
    assert replay([str(tmp_path / "logs")], db, progress=False).clean
    con = connect_store(db)
    sql = "SELECT mean FROM run_summary WHERE method = ? AND metric = ?"
    weight = con.execute(sql, [METHOD, "behave_imp_weight"]).fetchone()[0]
    con.close()
    body = check_toml(run, "mean", name="abs_error needs the truth", max=1e9)
    body += check_toml(run, "mean", name="warn-only abs_error", max=1e9, warn_only=True)
    body += check_toml(run, "mean", "behave_imp_weight", name="weight", max=2 * weight, min=0.5 * weight)
    body += check_toml(run, "mean", "behave_imp_weight", name="narrow", max=2 * weight, min=1.5 * weight)
    code, report = gate(db, tmp_path, body)
    assert code == 1
    assert verdicts(report) == [
        ("fail", "missing_metric"),
        ("warn", "missing_metric"),
        ("pass", "ok"),
        ("fail", "threshold"),
    ]
    code, report = gate(db, tmp_path, DEFAULT_THRESHOLDS.read_text())
    by_figure = {v["figure"] == "warnings": v["outcome"] for v in report["verdicts"]}
    assert code == 1 and {v["outcome"] for v in report["verdicts"]} == {"missing_metric", "threshold"}
    # the run's warnings need no truth: the one warning is that it has none (no_ground_truth, from replay)
    assert by_figure == {True: "threshold", False: "missing_metric"}
    missing = [v["reason"] for v in report["verdicts"] if v["outcome"] == "missing_metric"]
    n_loss = int(pc.sum(table["loss_mask"]).as_py())
    said = f"no token of run '{run}' has prox_logp (0 of {n_loss:,} loss tokens): nothing to judge"
    assert all(reason.startswith(said) for reason in missing)


def test_every_run_by_default_and_reports(db, views, tmp_path):
    body = CHECK.replace("mean", "n") + "min = 1\n"
    junit = tmp_path / "gate.xml"
    code, report = gate(db, tmp_path, body, junit=str(junit))
    assert code == 0 and sorted(v["run_id"] for v in report["verdicts"]) == sorted(views["summary"])
    suite = ET.parse(junit).getroot().find("testsuite")
    # a case per run's decision (a check on n decides nothing about shipping: undecided, skipped), one per
    # check and run
    assert int(suite.get("tests")) == 2 * len(views["summary"]) and suite.get("failures") == "0"
    run = sorted(views["summary"])[0]
    code, report = gate(db, tmp_path, body, run=run)
    assert [v["run_id"] for v in report["verdicts"]] == [run]


CHECK = '[[check]]\nmethod = "loglinear"\nmetric = "abs_error"\nstat = "mean"\n'
BAD_CONFIGURATIONS = {
    "not TOML": "[[check]\nmethod = 1\n",
    "unknown key": CHECK + "max = 1\nthreshold = 2\n",
    "unknown method": CHECK.replace("loglinear", "loglin") + "max = 1\n",
    "unknown metric": CHECK.replace("abs_error", "error") + "max = 1\n",
    "unknown stat": CHECK.replace("mean", "p95") + "max = 1\n",
    "wrong type": CHECK + 'max = "0.1"\n',
    "no condition": CHECK,
    "min above max": CHECK + "max = 1\nmin = 2\n",
    "bad staleness": CHECK + "max = 1\nstaleness = [4, 1]\n",
    "regression without baseline": CHECK + "max_regression = 0.1\n",
    "bad on_insufficient": '[defaults]\non_insufficient = "skip"\n' + CHECK + "max = 1\n",
    "no checks": "[defaults]\nmin_tokens = 10\n",
}


@pytest.mark.parametrize("body", BAD_CONFIGURATIONS.values(), ids=BAD_CONFIGURATIONS.keys())
def test_bad_configuration_exits_2(db, tmp_path, body):
    code, report = gate(db, tmp_path, body)
    assert code == 2 and "gate.toml" in report["error"]
    assert not (tmp_path / "gate.json").exists()


def test_missing_database_exits_2(tmp_path):
    result = CliRunner().invoke(cli, ["gate", "--db", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "absent" in result.output


def test_default_thresholds_run_on_the_fixtures(db, views, capsys):
    result = run_gate(db, DEFAULT_THRESHOLDS)
    assert len(result.verdicts) == len(load_thresholds(DEFAULT_THRESHOLDS).checks) * len(views["summary"])
    assert {v.verdict for v in result.verdicts if v.check.figure == "warnings"} == {"pass"}  # clean logs
    # every metric measured, enough tokens; an interval may straddle a bound (80 steps of 12 responses)
    assert {v.outcome for v in result.verdicts} <= {"ok", "threshold", "inconclusive"}
    undecided = [v for v in result.verdicts if v.outcome == "inconclusive"]
    bound = lambda c: c.max if c.max is not None else c.min  # noqa: E731
    assert all(
        v.verdict == "warn" and v.observed.lower <= bound(v.check) <= v.observed.upper for v in undecided
    )
    with capsys.disabled():
        counts = ", ".join(f"{result.count(v)} {v}" for v in ("pass", "warn", "fail"))
        print(f"\ndefault thresholds on the fixtures: {counts}")


def test_the_default_gate_fails_the_recompute_run_and_every_report_says_why(db, tmp_path):
    """`gate --run recompute` with the default thresholds exits 1: loglinear_shipped's excess over the engine
    floor fails at a staleness >= 1 (the run's largest staleness with 1,000 tokens, 6, judged 1..6
    family-wise); the terminal, JSON, JUnit and Markdown reports carry the same decision, naming it with its
    interval, recomputed here from the stored per-step sums."""
    out = tmp_path / "reports"
    args = ["gate", "--db", str(db), "--run", "recompute", "--json", str(out / "g.json"), "--junit",
            str(out / "g.xml"), "--markdown", str(out / "g.md")]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    (decision,) = json.loads((out / "g.json").read_text())["decisions"]
    reason = decision["reason"]
    assert (decision["action"], decision["max_staleness"], decision["judged_up_to"]) == ("do_not_ship", 0, 6)
    assert reason["measure"] == "excess_gradient_mass_error" and reason["staleness"] >= 1
    expected = stored_excess(db, "recompute", "loglinear_shipped", list(range(1, 7)))[reason["staleness"]]
    got = (reason["observed"], reason["observed_lower"], reason["observed_upper"])
    assert got == pytest.approx(expected, rel=1e-9) and reason["observed_lower"] > reason["bound"] == 0.01
    sentence = decision["sentence"]
    shown = f"at staleness {reason['staleness']} it moves {100 * got[0]:.2f}% (family-wise 95%: "
    assert sentence.startswith(
        "Do not ship loglinear_shipped (AReaL actor.prox_logp_method: loglinear) beyond"
    )
    assert (
        shown + f"{100 * got[1]:.2f}-{100 * got[2]:.2f}%) of the gradient mass beyond the engine floor"
        in sentence
    )
    assert sentence.endswith(
        "Keep the recompute (AReaL actor.prox_logp_method: recompute), or set max_head_offpolicyness: 0."
    )
    assert f"- {sentence} " in result.output
    case = ET.parse(out / "g.xml").getroot().find("testsuite").find("testcase")
    assert case.get("name") == "decision on run recompute" and case.find("failure").get("message") == sentence
    markdown = (out / "g.md").read_text()
    in_markdown = sentence.replace("on run recompute", "on run ` recompute `")  # the store's data: code spans
    assert "- ❌ " + in_markdown.replace("max_head_offpolicyness", "` max_head_offpolicyness `") in markdown


def test_the_fixtures_readme_states_what_the_store_holds(db):
    """fixtures/README.md's table is these logs' numbers (rounded as written there)."""
    text = (FIXTURES / "README.md").read_text()
    con = connect_store(db)
    try:
        errors = con.execute(
            "SELECT run_id, method, mean FROM run_summary WHERE metric = 'abs_error' AND method IN "
            "('loglinear_shipped', 'loglinear', 'loglinear_exact', 'rollout')"
        ).fetchall()
        pairing = con.execute(
            "SELECT run_id, shipped_over_own FROM pairing_summary WHERE interpolation = 'loglinear'"
        ).fetchall()
        gme = con.execute(
            "SELECT run_id, gradient_mass_error FROM decision_summary WHERE method = 'loglinear_shipped'"
        ).fetchall()
        excess = con.execute(
            "SELECT excess_gradient_mass_error, excess_gradient_mass_error_lower, "
            "excess_gradient_mass_error_upper FROM decision_summary WHERE method = 'loglinear_shipped' "
            "AND run_id = 'recompute'"
        ).fetchone()
    finally:
        con.close()
    for _, _, mean in errors:
        assert f"{mean:.4f}".rstrip("0") in text or f"{mean:.3g}" in text, mean
    for _, ratio in pairing:
        assert f"{ratio:.2f}x" in text, ratio
    for _, g in gme:
        assert f"{100 * g:.1f}%" in text, g
    # the excess over the stale tokens, and the decision's figure (staleness 1, family-wise over 1..6)
    assert "{:.2f}% ({:.2f}-{:.2f}%)".format(*(100 * x for x in excess)) in text
    point, lower, upper = stored_excess(db, "recompute", "loglinear_shipped", list(range(1, 7)))[1]
    assert f"{100 * point:.2f}% (family-wise 95%: {100 * lower:.2f}-{100 * upper:.2f}%)" in text
