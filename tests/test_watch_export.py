"""`proxaudit watch --tensorboard DIR --wandb DIR`: a watch following a small simulated run (two ranks'
folders, one a step behind), stopped and restarted, writes each step once, when final, with the tags and
values `proxaudit export` writes from the final store (read back with TensorBoard's event accumulator and
from the W&B offline run's transaction log), and the decision state at the steps it judged."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from test_export import _wandb_records
from test_watch_loop import Clock, Lines

from evaluator.cli import cli
from evaluator.logio import write_log_atomic
from evaluator.trainer.simulated_run import SimulatedRun
from evaluator.watch import read_alerts
from evaluator.watch.loop import Watcher, WatchOptions

RUN = SimulatedRun(run_id="sim", tokens_per_step=2048, drift_from_step=1, drift_rate=0.1)
ACTION = {"ship": 0.0, "undecided": 1.0, "ship_up_to": 2.0, "do_not_ship": 3.0}  # higher is worse


def write_files(logs: Path) -> list[Path]:
    """Steps 0-3 as two ranks' hooks write them (`seq_id = rank + 2k`, a folder per rank), two steps a
    file: rank0/0 and rank1/0 hold steps 0-1, rank0/1 and rank1/1 steps 2-3; every step spans two files."""
    table = RUN.steps(0, 4)
    rank, later = pc.bit_wise_and(table["seq_id"], 1), pc.greater_equal(table["step"], 2)
    return [
        write_log_atomic(
            table.filter(pc.and_(pc.equal(rank, r), pc.equal(later, i == 1))),
            logs / f"rank{r}" / f"{i}.parquet",
        )
        for r, i in ((0, 0), (1, 0), (0, 1), (1, 1))
    ]


def watcher(tmp_path: Path, clock: Clock, **sinks) -> Watcher:
    options = WatchOptions(
        paths=(tmp_path / "logs",), db=tmp_path / "m", alerts=tmp_path / "alerts.jsonl", idle_after=60.0,
        until_idle=True, **sinks,
    )  # fmt: skip
    return Watcher(options, Lines(), clock)


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every event file in `folder`, in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0}).Reload()
    return {
        tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
        for tag in events.Tags()["tensors"]
    }


def test_watch_writes_each_final_step_once_as_export_writes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    logs, tb, wb = tmp_path / "logs", tmp_path / "tb", tmp_path / "wb"
    files, clock = write_files(logs), Clock()
    late = tmp_path / "late.parquet"
    files[-1].rename(late)  # rank 1 is a step behind: its steps 2-3 come later
    with watcher(tmp_path, clock, tensorboard=tb) as first:
        assert first.poll() is None
    # steps 2-3 are in for rank 0 only, so step 1 is the last whole one; 0 is final, 1 waits for rank 1
    assert {s for series in scalars(tb / "sim").values() for s, _ in series} == {0}
    # restarted, now with W&B too: TensorBoard goes on after step 0, W&B starts from the first step
    late.rename(files[-1])
    clock.now += 10
    with watcher(tmp_path, clock, tensorboard=tb, wandb=wb) as second:
        assert second.poll() is None  # steps 1 and 2 are final (step 3 is in, from both ranks)
        assert {s for s, _ in scalars(tb / "sim")["watch/action"]} == {0, 2}
        clock.now += 60  # idle: the run ended, its last step is final
        assert second.poll() == 0
    assert len(list((tb / "sim").glob("events.out.tfevents.*"))) == 2

    exported = tmp_path / "export"
    result = CliRunner().invoke(
        cli, ["export", "--db", str(tmp_path / "m"), "--to", "tensorboard", str(exported)]
    )
    assert result.exit_code == 0, result.output
    wanted, written = scalars(exported / "sim"), scalars(tb / "sim")
    assert set(written) == set(wanted) | {"watch/action", "watch/max_staleness", "watch/drifting"}
    assert "loglinear_shipped/decision/gradient_mass_error" in wanted
    for tag, series in wanted.items():  # each step once, in order, with export's value
        assert [s for s, _ in written[tag]] == [s for s, _ in series], tag
        assert [v for _, v in written[tag]] == pytest.approx([v for _, v in series], rel=1e-6, abs=1e-7), tag

    # the decision state at the last step of each look that wrote: 0, then 2 (after the restart), 3 (ended)
    verdicts = [r for r in read_alerts(tmp_path / "alerts.jsonl") if r["kind"] == "verdict"]
    assert [s for s, _ in written["watch/action"]] == [0, 2, 3]
    assert written["watch/action"][-1] == (3, ACTION[verdicts[-1]["state"]])
    assert all(v in ACTION.values() for _, v in written["watch/action"])
    assert json.loads((tb / "proxaudit-watch-tensorboard.json").read_text())["runs"]["sim"]["step"] == 3

    (log,) = wb.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[int, dict] = {}
    for record in _wandb_records(log):
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            assert items["_step"] not in history  # each step once
            history[items["_step"]] = items
    assert sorted(history) == [0, 1, 2, 3]
    for tag, series in written.items():  # W&B holds what TensorBoard holds (its decision state at 2 and 3)
        logged = [(s, history[s][tag]) for s in sorted(history) if tag in history[s]]
        if tag.startswith("watch/"):
            assert logged == [p for p in series if p[0] >= 2], tag
        else:
            assert [s for s, _ in logged] == [s for s, _ in series], tag
            assert [v for _, v in logged] == pytest.approx([v for _, v in series], rel=1e-6, abs=1e-7), tag


def test_a_watch_killed_between_its_scalars_and_its_record_writes_no_step_twice(tmp_path, monkeypatch):
    """Killed after flushing a look's steps but before recording them, in its event file of the session
    or in a new one (the first write after a restart): the restarted watch cuts them off and writes them
    once."""
    from evaluator.export import RunSeries
    from evaluator.watch.scalars import Record, TensorBoardSink

    run = RunSeries("sim", {"a/b/avg": ([0, 1, 2, 3], [0.5, 1.5, 2.5, 3.5])})
    commit, calls = Record.commit, []

    def killed_at(n: int):
        def commit_or_die(self, run_id, **fields):
            calls.append(fields)
            if len(calls) == n:
                raise KeyboardInterrupt  # kill -9: the record is never replaced
            commit(self, run_id, **fields)

        return commit_or_die

    first = TensorBoardSink(tmp_path)
    first.write(run.between(-1, 1), 1)  # steps 0-1 recorded
    monkeypatch.setattr(Record, "commit", killed_at(1))
    with pytest.raises(KeyboardInterrupt):  # the same session's file
        first.write(run.between(1, 3), 3)
    assert [s for s, _ in scalars(tmp_path / "sim")["a/b/avg"]] == [0, 1, 2, 3]  # 2-3 on disk, unrecorded
    calls.clear()
    monkeypatch.setattr(Record, "commit", killed_at(2))
    with pytest.raises(KeyboardInterrupt):  # restarted: 2-3 cut off; a new file, recorded, 2-3 unrecorded
        TensorBoardSink(tmp_path).write(run.between(1, 3), 3)
    assert [s for s, _ in scalars(tmp_path / "sim")["a/b/avg"]] == [0, 1, 2, 3]
    assert len(list((tmp_path / "sim").glob("events.out.tfevents.*"))) == 2
    monkeypatch.setattr(Record, "commit", commit)
    again = TensorBoardSink(tmp_path)
    assert again.record.last("sim") == 1
    again.write(run.between(again.record.last("sim"), 3), 3)
    again.close()
    assert scalars(tmp_path / "sim")["a/b/avg"] == [(0, 0.5), (1, 1.5), (2, 2.5), (3, 3.5)]


def test_a_folder_that_cannot_be_written_is_an_error_before_watching(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    for option in ("--tensorboard", "--wandb"):
        args = ["watch", str(tmp_path / "logs"), "--db", str(tmp_path / "m"), option, str(taken / "tb")]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert f"{option} {taken / 'tb'}: cannot write there" in result.output
    assert not (tmp_path / "m").exists()  # nothing watched


def test_a_record_that_is_not_watchs_is_an_error_naming_it(tmp_path):
    record = tmp_path / "tb" / "proxaudit-watch-tensorboard.json"
    record.parent.mkdir()
    args = [
        "watch",
        str(tmp_path / "logs"),
        "--db",
        str(tmp_path / "m"),
        "--tensorboard",
        str(tmp_path / "tb"),
    ]
    for text, why in (
        ("[1]", "not watch's record"),
        ('{"runs": {"sim": {"step": "3"}}}', "runs.sim: `step`"),
        ('{"runs": {"sim": {"step": 3, "events": "../../x", "bytes": 0}}}', "runs.sim.events: not the name"),
    ):
        record.write_text(text)
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and f"{record}: {why}" in result.output, result.output
