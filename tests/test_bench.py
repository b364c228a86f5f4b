"""How the benchmarks measure a child (`evaluator.bench.replay.run_child`): its peak memory is the kernel's
record of the finished process, what `/usr/bin/time -v` and a user's machine report, so a peak between
two samples counts too, and the benchmark's own size does not."""

from __future__ import annotations

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
