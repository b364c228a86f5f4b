"""Alerts (evaluator.watch.alerts, sinks): one alert per change of state, none repeated after a restart; the
alerts file's lines and what a trainer polls of them (`state`); the webhook against a local HTTP server,
whose failures are reported and never raised."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from evaluator.errors import UsageError
from evaluator.formulas.trend import trend
from evaluator.watch import RunState, read_alerts, state
from evaluator.watch.alerts import AlertMachine
from evaluator.watch.judge import RunVerdict
from evaluator.watch.sinks import AlertsFile, Webhook
from evaluator.watch.trends import FLOOR, RunTrend

T = "2026-11-26T06:00:00.000+00:00"


def verdict(action: str, max_staleness: int | None = None, run: str = "run-a") -> RunVerdict:
    return RunVerdict(run, action, max_staleness, "loglinear_shipped", f"because {action}")


def run_trend(slope: float, run: str = "run-a", subject: str = "loglinear_shipped") -> RunTrend:
    x = np.arange(20.0)
    return RunTrend(run, subject, trend(x, 0.002 + slope * x, tolerance=0.01))


class TestMachine:
    def test_each_change_of_verdict_is_one_alert(self):
        machine = AlertMachine()
        seen = []
        for action in ("undecided", "undecided", "ship", "ship", "undecided", "do_not_ship"):
            seen += machine.on_verdicts([verdict(action, 4 if action == "ship" else None)], T, "f.parquet")
        assert [(a.previous, a.state) for a in seen] == [
            (None, "undecided"), ("undecided", "ship"), ("ship", "undecided"), ("undecided", "do_not_ship")
        ]  # fmt: skip
        first = seen[0].record()
        assert first == {
            "time": T, "run_id": "run-a", "kind": "verdict", "state": "undecided", "previous": None,
            "reason": "because undecided", "method": "loglinear_shipped", "max_staleness": None,
            "as_of": "f.parquet",
        }  # fmt: skip

    def test_a_lower_safe_staleness_is_a_change_too(self):
        machine = AlertMachine()
        machine.on_verdicts([verdict("ship_up_to", 3)], T, None)
        (alert,) = machine.on_verdicts([verdict("ship_up_to", 1)], T, None)
        assert alert.state == alert.previous == "ship_up_to"
        assert alert.details["max_staleness"] == 1 and alert.details["previous_max_staleness"] == 3

    def test_runs_are_followed_apart(self):
        machine = AlertMachine()
        machine.on_verdicts([verdict("ship", 2, "a"), verdict("ship", 2, "b")], T, None)
        alerts = machine.on_verdicts([verdict("ship", 2, "a"), verdict("do_not_ship", None, "b")], T, None)
        assert [(a.run_id, a.state) for a in alerts] == [("b", "do_not_ship")]

    def test_a_trend_alerts_when_found_and_when_it_is_gone(self):
        machine = AlertMachine()
        assert machine.on_trends([run_trend(0.0)], T, None) == []  # a trend starts steady
        (found,) = machine.on_trends([run_trend(0.0005)], T, None)
        assert (found.previous, found.state, found.details["subject"]) == (
            "steady",
            "drifting",
            "loglinear_shipped",
        )
        assert found.details["crossing"] == pytest.approx(16.0)  # 0.002 + 0.0005 x = 0.01
        assert "beyond the engine floor rises by 0.05%" in found.reason
        assert machine.on_trends([run_trend(0.0005)], T, None) == []
        (gone,) = machine.on_trends([run_trend(-0.0001)], T, None)
        assert (gone.previous, gone.state) == ("drifting", "steady")

    def test_idle_and_back(self):
        machine = AlertMachine()
        assert machine.on_activity(False, T, 60, ["logs"]) == []
        (idle,) = machine.on_activity(True, T, 60, ["logs"])
        assert (
            idle.run_id is None and idle.state == "idle" and "no file changed in logs for 60 s" in idle.reason
        )
        assert machine.on_activity(True, T, 60, ["logs"]) == []
        (back,) = machine.on_activity(False, T, 60, ["logs"])
        assert (back.previous, back.state) == ("idle", "active")


def test_the_file_holds_one_json_line_per_alert_and_a_restart_repeats_none(tmp_path):
    path = tmp_path / "alerts" / "run.jsonl"
    sink, machine = AlertsFile(path), AlertMachine()
    for alert in [
        *machine.on_verdicts([verdict("undecided"), verdict("ship", 3, "run-b")], T, None),
        *machine.on_trends([run_trend(0.0005, subject=FLOOR)], T, None),
        *machine.on_verdicts([verdict("do_not_ship"), verdict("ship", 3, "run-b")], T, None),
    ]:
        sink.append(alert)
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line)["time"] == T for line in lines)
    runs = state(path)
    assert runs["run-a"] == RunState(
        action="do_not_ship", max_staleness=None, method="loglinear_shipped", reason="because do_not_ship",
        time=T, drifting=frozenset({FLOOR}),
    )  # fmt: skip
    assert runs["run-b"].action == "ship" and runs["run-b"].max_staleness == 3
    restarted = AlertMachine(runs)  # what watch does at start with the file it appends to
    assert restarted.on_verdicts([verdict("do_not_ship"), verdict("ship", 3, "run-b")], T, None) == []
    assert restarted.on_trends([run_trend(0.0005, subject=FLOOR)], T, None) == []


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path):
    path = tmp_path / "alerts.jsonl"
    path.write_text('{"run_id": "r", "kind": "verdict", "state": "ship"}\n{"run_id": "r", "kind": "verd')
    assert [r["state"] for r in read_alerts(path)] == ["ship"]
    assert state(tmp_path / "none.jsonl") == {}


def test_a_line_that_is_not_an_alert_names_the_file_and_line(tmp_path):
    path = tmp_path / "alerts.jsonl"
    path.write_text('{"run_id": "r"}\n[1, 2]\n')
    with pytest.raises(UsageError, match=r"alerts.jsonl: line 2: a JSON list, not an alert object"):
        state(path)


class Recorder(BaseHTTPRequestHandler):
    """A webhook endpoint: keeps each POST's JSON body; answers with the server's `status`."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append((self.headers["Content-Type"], json.loads(body)))
        time.sleep(self.server.delay)
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    httpd.bodies, httpd.status, httpd.delay = [], 200, 0.0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_the_webhook_posts_a_slack_text_and_the_alert(server):
    (alert,) = AlertMachine().on_verdicts([verdict("do_not_ship")], T, None)
    assert Webhook(f"http://127.0.0.1:{server.server_port}/hook").post(alert) is None
    ((kind, body),) = server.bodies
    assert kind == "application/json"
    assert body["text"] == "proxaudit watch: run run-a: verdict do_not_ship: because do_not_ship"
    assert body["state"] == "do_not_ship" and body["run_id"] == "run-a" and body["previous"] is None


def test_a_failed_post_is_reported_never_raised(server):
    (alert,) = AlertMachine().on_verdicts([verdict("ship", 1)], T, None)
    server.status = 500
    assert "500" in Webhook(f"http://127.0.0.1:{server.server_port}/").post(alert)
    server.status, server.delay = 200, 2.0
    assert "timed out" in Webhook(f"http://127.0.0.1:{server.server_port}/", timeout=0.2).post(alert)
    port = server.server_port
    server.shutdown()
    server.server_close()
    assert "refused" in Webhook(f"http://127.0.0.1:{port}/").post(alert).lower()


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://host/x", "localhost:8080", "http://"])
def test_a_webhook_that_is_not_http_is_refused(url):
    with pytest.raises(UsageError, match="not an http:// or https:// URL"):
        Webhook(url)
