"""The dashboard in a real browser (Debian's chromium through playwright): serve a 200-step run (series
longer than the charts draw markers for, as on a long run) the way `proxaudit dashboard` does, load every
page, check that no exception box is shown and that the Plotly charts rendered, save screenshots under
tests/_artifacts/, and print each page's render time (a figure, not an assertion). The responsiveness
benchmark recorded in BENCHMARKS.md is the same test on a 1,000-step run: `PROXAUDIT_DASHBOARD_STEPS=1000`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from dashboard.views import PAGES
from evaluator.cli.serve import streamlit_command
from evaluator.store import connect_store

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent / "_artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
N_STEPS, TOKENS_PER_STEP = int(os.environ.get("PROXAUDIT_DASHBOARD_STEPS", "200")), 512
CHARTS = {"overview": 4, "drift": 5, "weights": 3, "training": 3, "compare": 2, "tokens": 1, "live": 1}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (`make chromium` installs it)"),
]

# True once the run whose title is `title` has finished (the script is done) ...
SCRIPT_DONE = """(title) => {
    const h1 = document.querySelector('h1');
    const running = document.querySelector('[data-testid="stStatusWidget"]');
    return !!h1 && h1.textContent.includes(title) && !running;
}"""
# ... and its `n` Plotly charts are drawn.
CHARTS_DRAWN = """(n) => {
    // charts of this run only: Streamlit keeps the previous page's elements, marked stale, until it is done
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')]
        .filter(c => !c.closest('[data-stale="true"]'));
    return charts.length === n && [...charts].every(c => c.querySelector('.main-svg'));
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bench_store(tmp_path_factory) -> Path:
    """A synthetic run of N_STEPS steps (512 tokens a step) replayed into a store."""
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, write_synthetic_log

    folder = tmp_path_factory.mktemp("bench_store")
    spec = SyntheticSpec(run_id=f"bench-{N_STEPS}", tokens_per_step=TOKENS_PER_STEP)
    write_synthetic_log(folder / "bench.parquet", N_STEPS * TOKENS_PER_STEP, spec)
    replay([folder / "bench.parquet"], folder / "metrics", progress=False)
    return folder / "metrics"


@contextlib.contextmanager
def serve(db: Path):
    """The dashboard served as `proxaudit dashboard` does, on a free local port; stopped afterwards."""
    port = free_port()
    log = open(db.parent / "streamlit.log", "w")  # noqa: SIM115 (closed in finally)
    child = subprocess.Popen(streamlit_command(db, "127.0.0.1", port), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if child.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    "the dashboard server did not start:\n" + (db.parent / "streamlit.log").read_text()
                )
            time.sleep(0.25)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


@pytest.fixture(scope="module")
def server(bench_store):
    with serve(bench_store) as url:
        yield url


@contextlib.contextmanager
def chromium(profile: Path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1500, "height": 2600},
        )  # fmt: skip
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _wait_rendered(page, slug: str, start: float) -> tuple[float, float]:
    """Seconds from `start` until the page's script finished, and until its charts were drawn."""
    page.wait_for_function(SCRIPT_DONE, arg=PAGES[slug][0], timeout=30_000, polling=10)
    script = time.perf_counter() - start
    try:
        page.wait_for_function(CHARTS_DRAWN, arg=CHARTS[slug], timeout=30_000, polling=10)
    except Exception as error:  # playwright's TimeoutError: say which page and what it drew
        drawn = page.locator(
            '[data-testid="stElementContainer"]:not([data-stale="true"]) [data-testid="stPlotlyChart"]'
        ).count()
        pytest.fail(f"page {slug}: {drawn} charts after 30 s, expected {CHARTS[slug]} ({error})")
    return script, time.perf_counter() - start


def test_every_page_renders_in_the_browser(server, tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    timings: dict[str, dict[str, float]] = {}
    with chromium(tmp_path / "profile") as page:
        page.goto(f"{server}/?page=tokens")  # warm-up: the server's first session imports the libraries
        _wait_rendered(page, "tokens", time.perf_counter())
        for slug in PAGES:  # a fresh load of each page from its URL (what a shared link does)
            start = time.perf_counter()
            page.goto(f"{server}/?page={slug}")
            script, drawn = _wait_rendered(page, slug, start)
            timings[slug] = {"load_s": drawn, "load_script_done_s": script}
            assert page.locator('[data-testid="stException"]').count() == 0, slug
            page.screenshot(path=str(ARTIFACTS / f"dashboard-{slug}.png"))
        for slug in [*list(PAGES)[1:], "overview"]:  # moving between pages in the sidebar
            page.locator('[data-testid="stSidebar"] label').filter(has_text=PAGES[slug][0]).first.click()
            timings[slug]["switch_s"] = _wait_rendered(page, slug, time.perf_counter())[1]
            assert page.locator('[data-testid="stException"]').count() == 0, slug
            page.wait_for_url(f"**page={slug}**", timeout=5_000)  # the URL follows: the view can be shared
    report = {
        "n_steps": N_STEPS,
        "tokens_per_step": TOKENS_PER_STEP,
        "cpu_count": os.cpu_count(),
        "pages": timings,
    }
    (ARTIFACTS / "dashboard_timings.json").write_text(json.dumps(report, indent=2))
    print(f"\ndashboard render times, {N_STEPS}-step run ({TOKENS_PER_STEP} tokens/step):")
    for slug, t in timings.items():
        load, script, switch = t["load_s"], t["load_script_done_s"], t["switch_s"]
        print(
            f"  {PAGES[slug][0]:<32} load {load:5.2f} s (script done {script:4.2f} s)  switch {switch:5.2f} s"
        )


def test_values_from_the_data_are_never_links(tmp_path):
    """A run_id and a recorded path that look like links, HTML or Markdown: rendered by chromium, no page
    has a link or an image of theirs (GitHub Markdown autolinks a bare URL even with every character
    escaped), and the text is there, as code."""
    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    hostile = (
        "see https://evil.example/x www.evil.example a@evil.example <a href='https://evil.example'>x</a>"
    )
    spec = SyntheticSpec(run_id=hostile, prox_every=0, with_proximal_t=False)  # pages say why, naming the run
    db = tmp_path / "m"
    replay([write_log_atomic(synthetic_steps(spec, 8, 2), tmp_path / "h.parquet")], db, progress=False)
    with connect_store(db, read_only=False) as con:
        con.execute("UPDATE ingested_file SET path = ?", ["/nowhere/see www.evil.example/h.parquet"])
    with serve(db) as url, chromium(tmp_path / "profile") as page:
        for slug in ("overview", "drift", "compare", "tokens"):
            page.goto(f"{url}/?page={slug}")
            page.wait_for_function(SCRIPT_DONE, arg=PAGES[slug][0], timeout=60_000, polling=50)
            assert page.locator('[data-testid="stException"]').count() == 0, slug
            alert = page.locator('[data-testid="stAlert"]', has_text="www.evil.example").first
            alert.wait_for(timeout=30_000)  # each of these pages says why it is empty, naming the run or file
            for element in ("a", "img", "area", "iframe"):
                assert page.locator(f'{element}[href*="evil"], {element}[src*="evil"]').count() == 0, slug
            # shown, as code (the Overview's decision names the run in its sentence, its reason and its floor)
            assert alert.locator("code", has_text="www.evil.example").count() >= 1, slug


def test_the_overview_opens_with_the_decision(fixture_store, tmp_path):
    """The real runs in chromium: the first thing under the title is the decision banner, above every chart,
    rendered as text (no Markdown marks or escapes left), saying what to do with the gated method and the
    figure it rests on, the engine floor's verdict with its interval, the gate's checks, the staleness judged
    and the loss; saved as a screenshot."""
    ARTIFACTS.mkdir(exist_ok=True)
    with serve(fixture_store) as url, chromium(tmp_path / "profile") as page:
        page.goto(f"{url}/?page=overview&run=recompute")
        page.wait_for_function(SCRIPT_DONE, arg="Overview", timeout=60_000, polling=50)
        page.wait_for_function(CHARTS_DRAWN, arg=CHARTS["overview"], timeout=30_000, polling=50)
        assert page.locator('[data-testid="stException"]').count() == 0
        first = page.locator('[data-testid="stMain"] [data-testid="stAlert"]').first
        text = first.inner_text()
        assert text.startswith("Decision on run recompute: "), text
        actions = ("Ship", "Do not ship", "Cannot tell yet whether to ship")
        heads = [f"Decision on run recompute: {action} loglinear_shipped (AReaL " for action in actions]
        assert any(text.startswith(head) for head in heads), text
        for part in ("the default thresholds, schemas/default_thresholds.toml", "Engine floor of run",
                     "of the gradient mass", "(95%: ", "family-wise 95%: ", "(verl: ", "by NeMo-RL",
                     "Judged at each staleness 1 to ", "PPO, clip [0.8, 1.2]"):  # fmt: skip
            assert part in text, part
        assert "**" not in text and "\\" not in text and "`" not in text  # Markdown rendered, escapes gone
        top = first.bounding_box()["y"]
        charts = page.locator('[data-testid="stPlotlyChart"]')
        assert all(top < charts.nth(i).bounding_box()["y"] for i in range(charts.count()))
        first.screenshot(path=str(ARTIFACTS / "dashboard-banner.png"))


# Every attribute of every element holding a needle (but a text field's value: text by definition, the run
# chosen in the sidebar), and the elements that fetch or link, for the hostile store's test.
# Plotly keeps each label's source text in its SVG text's `data-unformatted` (inert: an attribute value,
# and escaped by the dashboard before Plotly reads it as its HTML subset, so it holds no raw `<`).
ATTRIBUTES_WITH = """(needles) => [...document.querySelectorAll('*')].flatMap(e => [...e.attributes]
    .filter(a => !(e.tagName === 'INPUT' && a.name === 'value'))
    .filter(a => !(e.tagName === 'text' && a.name === 'data-unformatted' && !a.value.includes('<')))
    .filter(a => needles.some(n => a.value.includes(n))).map(a => `${e.tagName} ${a.name}=${a.value}`))"""
ACTIVE_IN_MAIN = "[data-testid='stMain'] :is(a, img, script, iframe, object, embed, svg image, video, audio)"


def test_a_store_whose_every_text_is_hostile_renders_only_text(tmp_path):
    """`tests.hostile`'s store (run_id, paths, loss name, findings, checks, the trainer's staleness key and
    source: links, images, HTML, Markdown, controls): on every page, no element carries a value of the
    data in an attribute, no link, image, script or frame in the page's body comes from it, and the browser
    sends no request anywhere but the dashboard's own server."""
    from tests.hostile import EVIL, FORGED, hostile_store

    store = hostile_store(tmp_path)
    requests: list[str] = []
    with serve(store.db) as url, chromium(tmp_path / "profile") as page:
        page.on("request", lambda request: requests.append(request.url))
        for slug in PAGES:
            page.goto(f"{url}/?page={slug}")
            page.wait_for_function(SCRIPT_DONE, arg=PAGES[slug][0], timeout=60_000, polling=50)
            for expander in page.locator("[data-testid='stExpander'] summary").all():
                expander.click()  # the findings' evidence and the undecided checks, opened
            page.wait_for_timeout(500)
            assert page.locator('[data-testid="stException"]').count() == 0, slug
            assert page.evaluate(ATTRIBUTES_WITH, [EVIL, FORGED]) == [], slug
            active = page.locator(ACTIVE_IN_MAIN)
            sources = [
                active.nth(i).evaluate("e => e.outerHTML.slice(0, 200)") for i in range(active.count())
            ]
            assert not [s for s in sources if EVIL in s or "FORGED" in s], (slug, sources)
            if slug == "overview":  # the data is there, as text
                assert page.get_by_text(EVIL, exact=False).count() >= 1
    local = f"{url}/"
    assert requests and all(r.startswith((local, "data:", "blob:")) for r in requests), sorted(
        {r for r in requests if not r.startswith(local)}
    )
