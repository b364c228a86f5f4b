"""Where alerts go: a JSON-lines file (appended, flushed and fsynced, one line per alert), an optional
webhook (a POST of JSON with a Slack-compatible `text`), and `state`, what a trainer polls to stop itself.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from evaluator.errors import UsageError
from evaluator.text_table import slack_text
from evaluator.watch.alerts import Alert, RunState, fold

WEBHOOK_TIMEOUT_S = 10.0
"""A webhook that does not answer within this is a failed POST (reported; watch goes on)."""


class AlertsFile:
    """Appends each alert as one JSON line and makes it durable before going on (a reader polling the file
    sees whole lines only, and a crash loses no alert that was reported)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise UsageError(f"--alerts {self.path}: is a folder, not a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, alert: Alert) -> None:
        line = json.dumps(alert.record(), allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as sink:
            sink.write(line)
            sink.flush()
            os.fsync(sink.fileno())


class Webhook:
    """POSTs each alert as JSON: `text` (one line, what Slack shows, escaped as Slack asks: `slack_text`)
    and the alert's fields."""

    def __init__(self, url: str, timeout: float = WEBHOOK_TIMEOUT_S) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"--webhook {url!r}: not an http:// or https:// URL")
        self.url, self.timeout = url, timeout

    def post(self, alert: Alert) -> str | None:
        """Send one alert; None when the server took it (2xx), else why not (never raises)."""
        body = json.dumps({"text": slack_text(alert.text()), **alert.record()}, allow_nan=False).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as error:
            return f"the server answered {error.code} {error.reason}"
        except (urllib.error.URLError, OSError) as error:  # refused, unreachable, timed out
            return f"{getattr(error, 'reason', error)}"
        return None


def read_alerts(path: str | os.PathLike) -> list[dict]:
    """The alert records of a file, in order; a last line still being written (no newline yet) is left
    for the next read. A missing file has none. A line that is not a JSON object is a `UsageError`
    naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(text.split("\n")[:-1], 1):  # [-1]: after the last newline
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}: line {number}: not JSON ({error})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}: line {number}: a JSON {type(record).__name__}, not an alert object")
        records.append(record)
    return records


def state(alerts: str | os.PathLike) -> dict[str, RunState]:
    """`{run_id: RunState}`: each run's latest verdict (`action`: ship, ship_up_to, undecided,
    do_not_ship; `max_staleness`, `method`, `reason`) and the subjects whose trend is drifting, from the
    alerts file `proxaudit watch --alerts` writes. A trainer polls it to stop itself:

        if state("alerts.jsonl").get("my-run", RunState()).action == "do_not_ship": ...
    """
    return fold(read_alerts(alerts))
