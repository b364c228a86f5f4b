"""The live dashboard in chromium: served on a store that `proxaudit watch` is filling from a run that
still writes, the open page shows the new steps and the new commit without a reload."""

from __future__ import annotations

import re
import subprocess
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_dashboard_browser import CHROMIUM, SCRIPT_DONE, chromium, serve

from evaluator.replay import replay
from evaluator.store import connect_store
from evaluator.trainer.simulated_run import SimulatedRun

RUN = SimulatedRun(run_id="live", tokens_per_step=2048, steps_per_file=2)
WAIT_MS = 180_000  # a bound against a hang, never an assertion about time

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (`make chromium` installs it)"),
]

# The sidebar's commit caption and the step slider's upper end, as the page shows them now.
SHOWN = """() => {
    const side = document.querySelector('[data-testid="stSidebar"]');
    const caption = [...side.querySelectorAll('[data-testid="stCaptionContainer"]')]
        .map(c => c.textContent).find(t => t.startsWith('as of commit ')) || '';
    const slider = [...side.querySelectorAll('[data-testid="stSlider"]')]
        .find(s => s.querySelector('label') && s.querySelector('label').textContent.trim() === 'step');
    const ticks = slider && slider.querySelector('[data-testid="stSliderTickBar"]');
    const max = ticks ? ticks.lastElementChild.textContent : null;
    return {caption: caption, last_step: max, marker: window.__notReloaded === true};
}"""


def last_step(folder) -> int:
    return max(pc.max(pq.read_table(p, columns=["step"])["step"]).as_py() for p in folder.glob("*.parquet"))


def latest_snapshot(db) -> int:
    with connect_store(db) as con:
        return con.execute("SELECT id FROM store.current_snapshot()").fetchone()[0]


def test_the_page_follows_watch_without_a_reload(tmp_path):
    logs, db = tmp_path / "logs", tmp_path / "m"
    for i in range(2):
        RUN.write_file(logs, i)
    replay(sorted(logs.glob("*.parquet")), db, progress=False)
    before_step, before_commit = last_step(logs), latest_snapshot(db)
    watch = None
    with serve(db) as url, chromium(tmp_path / "profile") as page:
        try:
            page.goto(f"{url}/?page=training&run=live")
            page.wait_for_function(SCRIPT_DONE, arg="Over training", timeout=WAIT_MS, polling=100)
            shown = page.evaluate(SHOWN)
            assert shown["caption"].startswith(f"as of commit {before_commit}, "), shown
            assert shown["last_step"] == str(before_step), shown
            page.evaluate("() => { window.__notReloaded = true; }")  # gone if the page ever reloads

            watch = subprocess.Popen(
                [sys.executable, "-m", "evaluator.cli", "watch", str(logs), "--db", str(db), "--interval",
                 "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for i in range(2, 4):  # the run goes on
                RUN.write_file(logs, i)
            after_step = last_step(logs)
            page.wait_for_function(
                f"() => {{ const s = ({SHOWN})(); return s.last_step === '{after_step}'; }}",
                timeout=WAIT_MS,
                polling=250,
            )
            page.wait_for_function(  # the caption follows within its 1 s refresh
                f"() => {{ const m = ({SHOWN})().caption.match(/^as of commit (\\d+), /);"
                f" return !!m && Number(m[1]) > {before_commit}; }}",
                timeout=WAIT_MS,
                polling=250,
            )
            shown = page.evaluate(SHOWN)
        finally:
            if watch is not None:
                watch.terminate()
                watch.wait(timeout=60)
    number = int(re.match(r"as of commit (\d+), \d+ s ago", shown["caption"]).group(1))
    assert number > before_commit  # watch's commits are shown
    assert number <= latest_snapshot(db)
    assert shown["marker"]  # the same page: no reload
    assert after_step > before_step
