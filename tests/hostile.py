"""A store whose every text is hostile: what a crafted log, loss file, trainer config or thresholds file can
put in front of a person. Built through the project's own writers (a replay of token logs, the what-if),
the derived findings' rows shaped by the store's own `findings_table`, so that it stays a store whatever
the store's format becomes.

`HOSTILE` holds, in 200 bytes (a run_id's bound): a line break that starts a forged line (`FORGED`), a
carriage return, C0 and C1 controls (ESC, the CSI U+009B; a NUL only in the thresholds file's check name,
as the store refuses one: DuckLake's catalog cannot hold it in a text statistic), a bidi override, a line
separator, an XML noncharacter, HTML, a Markdown image and link, a bare URL and address (autolinked even
when escaped), a Slack mention, a table pipe and a backtick."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from evaluator.logio import write_log_atomic
from evaluator.lossconfig import resolve
from evaluator.problems import CheckOutcome, Finding
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store
from evaluator.store.findings import checks_table, findings_table
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.verdict.what_if import what_if
from tests.builders import set_column

HOSTILE = (
    "r\nFORGED\r\x1b[31m\x9b1m\u202e\u2028\ufffe<img src=https://evil.example/i.png>"
    "[l](https://evil.example) www.evil.example a@evil.example <!channel> | `c` &amp; ]]>"
)
IN_PATH = HOSTILE.replace("/", "")[:80]
"""as much of it as a file name holds (no NUL, no slash)"""
FORGED = "FORGED"
EVIL = "evil.example"


@dataclass(frozen=True)
class HostileStore:
    db: Path
    logs: Path
    """the folder of the token log (its name is hostile too)"""
    thresholds: Path
    """a thresholds file whose check's name is hostile"""
    loss: Path
    """the loss file the store was replayed under (its path, the loss's name, is hostile)"""


def hostile_store(folder: Path) -> HostileStore:
    """A store of one run (enough steps for every page) in which every text column holds `HOSTILE`: run_id,
    the log's path, the loss's name (in the what-if table too), the trainer's staleness source and key, and
    one finding and check outcome of every text field (rule, column_name, message, threshold, advice,
    check_name, why)."""
    logs = folder / f"logs {IN_PATH}"
    spec = SyntheticSpec(run_id="x", tokens_per_step=1024, mean_length=16)
    table = synthetic_steps(spec, 4, 8)
    write_log_atomic(set_column(table, "run_id", pa.array([HOSTILE] * table.num_rows)), logs / "h.parquet")
    loss_file = folder / f"loss {IN_PATH}.toml"
    loss_file.write_text('preset = "areal-ppo"\n')
    loss = resolve(str(loss_file), None).loss
    db = folder / "m.duckdb"
    replay([logs], db, loss=loss, staleness_limit=(4, HOSTILE, HOSTILE), progress=False, workers=1)
    what_if([logs], db, [(HOSTILE, loss), (HOSTILE + " 2", loss)], staleness_limit=(4, HOSTILE, HOSTILE))
    finding = Finding(
        rule=HOSTILE, run_id=HOSTILE, column=HOSTILE, rows=3, message=HOSTILE, figure=0.5, threshold=HOSTILE,
        examples=({"step": 4, "seq_id": 1, "minibatch": 0, "pos": 2},), advice=HOSTILE,
    )  # fmt: skip
    found = findings_table([finding]).append_column("found_at", pa.array([datetime.now()]))
    checked = checks_table([CheckOutcome(check=HOSTILE, run_id=HOSTILE, status="undecided", why=HOSTILE)])
    checked = checked.append_column("checked_at", pa.array([datetime.now()]))
    with connect_store(db, read_only=False) as con:  # the rows replay derives, as the writer shapes them
        for table, rows in (("run_finding", found), ("run_check", checked)):
            con.register("hostile_rows", rows)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM hostile_rows")
            con.unregister("hostile_rows")
    thresholds = folder / "gate.toml"
    thresholds.write_text(
        f"[[check]]\nname = {json.dumps(HOSTILE + chr(0))}\nfigure = 'floor_gradient_mass_error'\n"
        "max = 0.01\n\n"
        "[[check]]\nmethod = 'loglinear'\nfigure = 'excess_gradient_mass_error'\neach_staleness = true\n"
        "max = 0.01\n\n"
        "[[check]]\nmethod = 'loglinear'\nfigure = 'gradient_mass_error'\nmax_regression = 0.1\n"
        f"baseline_run = {json.dumps(HOSTILE)}\n"
    )
    return HostileStore(db, logs, thresholds, loss_file)
