"""The simulated run's planted drift (`evaluator.trainer.simulated_run`): it grows from one step, and with
`--drift-until-step` stops growing there, so the later files are alike (the watch benchmark's run of files
alike)."""

import dataclasses

import pyarrow.parquet as pq
import pytest

from evaluator.trainer.simulated_run import SimulatedRun, main
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


@pytest.mark.parametrize(
    ("until", "expected"),
    [
        (None, {0: 0.05, 4: 0.05, 5: 0.08, 12: 0.29, 13: 0.32, 300: 8.93}),
        (12, {0: 0.05, 4: 0.05, 5: 0.08, 12: 0.29, 13: 0.29, 300: 0.29}),
        (2, {0: 0.05, 4: 0.05, 13: 0.05}),  # stops before it starts: never grows
    ],
)
def test_the_drift_grows_from_its_step_until_its_last(until, expected):
    run = SimulatedRun(drift=0.05, drift_from_step=4, drift_rate=0.03, drift_until_step=until)
    assert {step: run.drift_at(step) for step in expected} == pytest.approx(expected, abs=1e-12)


def test_files_after_the_drift_stops_are_written_at_its_last_value(tmp_path):
    common = ["--files", "2", "--start", "13", "--interval", "0", "--tokens-per-step", "256", "--run-id", "b",
              "--drift-from-step", "4", "--drift-rate", "0.03"]  # fmt: skip
    main([str(tmp_path / "until"), *common, "--drift-until-step", "12"])
    main([str(tmp_path / "growing"), *common])
    spec = SyntheticSpec(run_id="b", seed=0, tokens_per_step=256)
    for step, drift_then in ((13, 0.05 + 0.03 * 8), (14, 0.05 + 0.03 * 8)):
        expected = synthetic_steps(dataclasses.replace(spec, drift=drift_then), step, 1).to_pydict()
        (until,) = (tmp_path / "until").glob(f"b-step{step:06d}-*.parquet")
        (growing,) = (tmp_path / "growing").glob(f"b-step{step:06d}-*.parquet")
        assert pq.read_table(until).to_pydict() == expected
        assert pq.read_table(growing).to_pydict() != expected  # without the option it went on growing
