"""Alerts: a state machine over each run's successive verdicts and trends, and over the watched folders'
activity, that emits an `Alert` on each change of state; and the state that a file of alerts adds up to.

Kinds and states: `verdict` (the verdict's action: `ship`, `ship_up_to`, `undecided`, `do_not_ship`; a
change of `max_staleness` is a change too), `trend` (`drifting` or `steady`, per run and subject: the
engine floor or the method's excess), `idle` (`idle`: no file changed in the watched folders for the
stated time; `active` again; `run_id` None). The first verdict of a run is an alert (from no state); a
trend or the folders start `steady` and `active`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from evaluator.text_table import printable

if TYPE_CHECKING:  # a trainer polling `state` imports this module: nothing of the store
    from evaluator.watch.judge import VerdictLike
    from evaluator.watch.trends import RunTrend


@dataclass(frozen=True)
class Alert:
    """One change of state, as written to the alerts file (one JSON object per line)."""

    time: str
    """ISO 8601, UTC"""
    run_id: str | None
    kind: str
    state: str
    previous: str | None
    reason: str
    details: dict = field(default_factory=dict)
    """by kind: `method`, `max_staleness`, `steps_to_decide`; `subject`, `slope`, `lower`, `upper`,
    `crossing`; `paths`, `idle_s`; and `as_of`, the last file ingested before it"""

    def record(self) -> dict:
        """The alert as a JSON object: the fixed fields, then the details."""
        fixed = dict(time=self.time, run_id=self.run_id, kind=self.kind, state=self.state)
        return {**fixed, "previous": self.previous, "reason": self.reason, **self.details}

    def text(self) -> str:
        """One line for the terminal and a chat (a webhook's `text`, `slack_text` of it), the run and the
        reason spelled out (`printable`)."""
        who = "watched folders" if self.run_id is None else f"run {printable(self.run_id)}"
        change = self.state if self.previous is None else f"{self.previous} -> {self.state}"
        return f"proxaudit watch: {who}: {self.kind} {change}: {printable(self.reason)}"


@dataclass(frozen=True)
class RunState:
    """What a run's alerts add up to: its latest verdict and the subjects whose trend is drifting."""

    action: str | None = None
    max_staleness: int | None = None
    method: str | None = None
    reason: str = ""
    time: str | None = None
    """of the latest alert about the run"""
    drifting: frozenset[str] = frozenset()


def fold(records: Iterable[Mapping]) -> dict[str, RunState]:
    """`{run_id: RunState}` from alert records in the order written (records of the folders left out)."""
    states: dict[str, RunState] = {}
    for r in records:
        run = r.get("run_id")
        if run is None:
            continue
        known = states.get(run, RunState())
        if r.get("kind") == "verdict":
            known = replace(
                known, action=r.get("state"), max_staleness=r.get("max_staleness"), method=r.get("method"),
                reason=r.get("reason", ""),
            )  # fmt: skip
        elif r.get("kind") == "trend":
            subject = r.get("subject")
            drifting = (
                known.drifting | {subject} if r.get("state") == "drifting" else known.drifting - {subject}
            )
            known = replace(known, drifting=frozenset(drifting))
        states[run] = replace(known, time=r.get("time"))
    return states


class AlertMachine:
    """The states last alerted (`known`: from an earlier watch's alerts, so a restart repeats nothing), and
    the alerts each new judgement makes."""

    def __init__(self, known: Mapping[str, RunState] | None = None) -> None:
        known = known or {}
        self.verdicts = {run: (s.action, s.max_staleness) for run, s in known.items() if s.action}
        self.drifting = {(run, subject) for run, s in known.items() for subject in s.drifting}
        self.idle = False

    def on_verdicts(self, verdicts: Sequence[VerdictLike], time: str, as_of: str | None) -> list[Alert]:
        alerts = []
        for v in verdicts:
            now, before = (v.action, v.max_staleness), self.verdicts.get(v.run_id)
            if now == before:
                continue
            self.verdicts[v.run_id] = now
            details = dict(method=v.method, max_staleness=v.max_staleness, as_of=as_of)
            if getattr(v, "steps_to_decide", None) is not None:
                details["steps_to_decide"] = v.steps_to_decide
            if before is not None and before[0] == v.action:
                details["previous_max_staleness"] = before[1]
            previous = None if before is None else before[0]
            alerts.append(Alert(time, v.run_id, "verdict", v.action, previous, v.reason, details))
        return alerts

    def on_trends(self, trends: Sequence[RunTrend], time: str, as_of: str | None) -> list[Alert]:
        alerts = []
        for found in trends:
            key, t = (found.run_id, found.subject), found.trend
            if t.drifting == (key in self.drifting):
                continue
            (self.drifting.add if t.drifting else self.drifting.discard)(key)
            state, previous = ("drifting", "steady") if t.drifting else ("steady", "drifting")
            details = dict(
                subject=found.subject, slope=t.slope, lower=t.lower, upper=t.upper, crossing=t.crossing,
                tolerance=t.tolerance, steps=[t.first_step, t.last_step], as_of=as_of,
            )  # fmt: skip
            alerts.append(Alert(time, found.run_id, "trend", state, previous, found.sentence(), details))
        return alerts

    def on_activity(self, idle: bool, time: str, idle_s: float, paths: Sequence[str]) -> list[Alert]:
        """An alert when the folders fall idle (no file changed for `idle_s` seconds) or come back."""
        if idle == self.idle:
            return []
        self.idle = idle
        where = ", ".join(paths)
        if idle:
            state, previous, why = "idle", "active", f"no file changed in {where} for {idle_s:.0f} s"
        else:
            state, previous, why = "active", "idle", f"files change again in {where}"
        return [Alert(time, None, "idle", state, previous, why, dict(paths=list(paths), idle_s=idle_s))]
