"""How the benchmarks measure a child (`evaluator.bench.replay.run_child`): its peak memory is the kernel's
record of the finished process, what `/usr/bin/time -v` and a user's machine report, so a peak between
two samples counts too, and the benchmark's own size does not."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from evaluator.bench.replay import run_child
from evaluator.errors import ProxauditError

MIB = 2**20


def test_the_peak_is_the_kernels_maxrss_of_the_process():
    base = run_child([sys.executable, "-c", "import numpy"])
    spike = run_child([sys.executable, "-c", f"import numpy as np; np.ones({32 * MIB}).sum()"])  # 256 MiB
    assert 250 * MIB <= spike.maxrss - base.maxrss < 300 * MIB, (base, spike)  # bytes, not KiB
    assert spike.cpu_s > 0 and spike.seconds > 0


def test_the_benchmarks_own_memory_is_not_charged_to_the_child():
    """A process started by a large one is charged that one's peak by the kernel; the child is started
    from a small launcher, as from a shell."""
    held = np.ones(64 * MIB)  # 512 MiB resident in this process while the child runs
    small = run_child([sys.executable, "-c", "pass"])
    assert held.sum() == 64 * MIB and small.maxrss < 64 * MIB, small


def test_a_failing_child_is_an_error_with_its_stderr():
    with pytest.raises(ProxauditError, match="went wrong"):
        run_child([sys.executable, "-c", "import sys; sys.exit('it went wrong')"])


def test_the_watch_bench_times_each_file_and_alert_from_what_the_writer_and_watch_print(tmp_path):
    """`evaluator.bench.watch.report` on the lines the simulated run and watch print: a file's delay to its
    ingested line, an alert's delay from the file it was judged after; memory by thirds of the run."""
    from evaluator.bench.watch import report
    from evaluator.replay import FileOutcome
    from evaluator.watch.alerts import Alert

    paths = [str(tmp_path / f"f{i}.parquet") for i in range(3)]
    written = [(0.0, f"{p} {100.0 + 10 * i:.3f}") for i, p in enumerate(paths)]  # the writer's `PATH TIME`
    said = [(103.5 + 10 * i, FileOutcome(p, "ingested", 10, 9).line()) for i, p in enumerate(paths)]
    alert = Alert(
        "1970-01-01T00:02:04.000+00:00", "r", "verdict", "do_not_ship", "ship", "x", {"as_of": paths[1]}
    )
    (tmp_path / "alerts.jsonl").write_text(json.dumps(alert.record()) + "\n")
    # watch: 100 MiB, then 150 MiB; a worker: 40 MiB while the first third, then none
    memory = [(2.0 * i, (100 + (i >= 20) * 50) * MIB, (i < 12) * 40 * MIB) for i in range(30)]
    text = report(written, said, tmp_path / "alerts.jsonl", memory, 1, 3, 10, 10.0)
    assert "3 files, median 3.5 s, max 3.5 s" in text
    assert "file written -> alert line:  14.0 s  (verdict ship -> do_not_ship)" in text  # 124 - 110
    assert "watch's own RSS, median of the last third / the first: 1.500" in text
    assert (
        "its look's and worker processes' RSS (every 2 s), first third of the run: min 40, median 40, max 40"
        in text
    )
    assert "watch's RSS with theirs, median of the last third / the first: 1.071" in text  # 150 / 140
