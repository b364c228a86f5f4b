"""The gate's thresholds file (TOML) as code: the allowed keys, their types and the rules between them.

A file holds an optional `[defaults]` table and a list of `[[check]]` tables. Each check names one
statistic of one metric of one method, or one derived figure (gradient mass error, flip rates, their excess
over the engine floor, weight diagnostics, the safe staleness; the catalogue of `schemas.figures`),
optionally restricted to an inclusive staleness range, judged at each staleness of it on its own
(`each_staleness`), and to one run, and the conditions it must meet: an absolute `max` and/or `min`,
and/or at most `max_regression` worse than the same statistic of `baseline_run`. Parsing never looks at a
database or a file: `evaluator.gate.judge` reads the file (a regular file of at most 1 MiB) and applies the
checks. Imports nothing of ours but `schemas`.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from schemas.figures import JUDGED, lookup, of_run
from schemas.store import ESTIMATOR_ONLY_METRICS, METHODS, METRICS, STATS, TRUTH_ONLY_METRICS, Tolerance

DEFAULT_THRESHOLDS = Path(str(files("schemas") / "default_thresholds.toml"))
ON_INSUFFICIENT = ("fail", "warn")
ABSURD = 1e100
"""A bound beyond +-1e100 can neither pass nor fail any figure meaningfully: rejected as a typo."""
BETTER = ("lower", "higher")

# Keys a [[check]] may hold, with their meaning (the README's table follows this).
CHECK_KEYS: dict[str, str] = {
    "name": "test-case name; default derived from the other keys",
    "method": "estimator: " + ", ".join(METHODS) + " (none for figure = 'warnings')",
    "metric": "metric: " + ", ".join(METRICS),
    "stat": "statistic: " + ", ".join(STATS),
    "figure": "instead of metric and stat, a derived figure: " + ", ".join(JUDGED),
    "max": "pass only if observed <= max",
    "min": "pass only if observed >= min",
    "staleness": "inclusive range [lo, hi] (or one integer); default: all tokens (excess_* figures: "
    "staleness 1 to S, the staleness the trainer runs)",
    "each_staleness": "judge each staleness of the range (default 1 to S) on its own, all of them together "
    "at 95% (Bonferroni); fails when one fails",
    "run": "judge this run only; default: every run in the database (but the baseline)",
    "warn_only": "a failure is reported as a warning and never fails the gate",
    "min_tokens": "fewer tokens in the selection means insufficient data",
    "on_insufficient": "verdict for insufficient data: fail or warn",
    "on_inconclusive": "verdict when the figure's 95% interval straddles the bound: warn (default) or fail",
    "baseline_run": "run to compare against (needs max_regression)",
    "max_regression": "allowed relative worsening against baseline_run (0.10 = 10%)",
    "better": "direction of the regression: lower (default) or higher (default when only min is set)",
    "max_gradient_mass_error": "safe_staleness: the tolerance on gradient_mass_error per staleness (0.01)",
    "max_clip_flip_rate": "safe_staleness: the tolerance on clip_flip_rate per staleness (0.01)",
}
SAFE_STALENESS_KEYS = ("max_gradient_mass_error", "max_clip_flip_rate")
# Keys [defaults] may hold; a check's own value wins.
DEFAULT_KEYS: tuple[str, ...] = ("min_tokens", "on_insufficient", "on_inconclusive", "warn_only")
BUILTIN_DEFAULTS: dict[str, Any] = {
    "min_tokens": 1,
    "on_insufficient": "fail",
    "on_inconclusive": "warn",
    "warn_only": False,
}


class ThresholdsFormatError(ValueError):
    """The thresholds file breaks a rule; the message names the file, the check and the key."""


@dataclass(frozen=True)
class Check:
    """One validated `[[check]]`; `index` is its 1-based position in the file."""

    index: int
    name: str
    method: str | None = None
    metric: str | None = None
    stat: str | None = None
    figure: str | None = None
    max: float | None = None
    min: float | None = None
    staleness: tuple[int, int] | None = None
    each_staleness: bool = False
    run: str | None = None
    warn_only: bool = False
    min_tokens: int = 1
    on_insufficient: str = "fail"
    on_inconclusive: str = "warn"
    baseline_run: str | None = None
    max_regression: float | None = None
    better: str = "lower"
    max_gradient_mass_error: float = Tolerance.max_gradient_mass_error
    max_clip_flip_rate: float = Tolerance.max_clip_flip_rate

    @property
    def label(self) -> str:
        return f"check {self.index} ({self.name!r})"

    @property
    def measure(self) -> str:
        """What is judged: the statistic of a metric check, or the figure."""
        return self.figure or self.stat


@dataclass(frozen=True)
class Thresholds:
    source: str
    checks: tuple[Check, ...]


def parse_thresholds(text: str, source: str = "<thresholds>") -> Thresholds:
    """Validate TOML text into `Thresholds`; errors name `source`, the check (index, name) and the key."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ThresholdsFormatError(f"{source}: not valid TOML: {error}") from None
    _reject_unknown(document, ("defaults", "check"), f"{source}: top level")
    defaults = _parse_defaults(document.get("defaults", {}), source)
    raw_checks = document.get("check", [])
    if not isinstance(raw_checks, list) or not all(isinstance(c, dict) for c in raw_checks):
        raise ThresholdsFormatError(f"{source}: 'check' must be an array of tables ([[check]])")
    if not raw_checks:
        raise ThresholdsFormatError(f"{source}: no [[check]] tables: a gate without checks proves nothing")
    checks = tuple(_parse_check(raw, i, defaults, source) for i, raw in enumerate(raw_checks, start=1))
    seen: dict[str, int] = {}
    for check in checks:
        if check.name in seen:
            raise ThresholdsFormatError(
                f"{source}: {check.label}: key 'name': already used by check {seen[check.name]}; "
                "names must be unique (each check is one test case)"
            )
        seen[check.name] = check.index
    return Thresholds(source=source, checks=checks)


def _parse_defaults(raw: Any, source: str) -> dict[str, Any]:
    where = f"{source}: [defaults]"
    if not isinstance(raw, dict):
        raise ThresholdsFormatError(f"{where}: must be a table")
    _reject_unknown(raw, DEFAULT_KEYS, where)
    return {**BUILTIN_DEFAULTS, **{key: _value(raw, key, where) for key in raw}}


def _parse_check(raw: dict, index: int, defaults: dict[str, Any], source: str) -> Check:
    name = raw.get("name")
    where = f"{source}: check {index}" + (f" ({name!r})" if isinstance(name, str) else "")
    _reject_unknown(raw, tuple(CHECK_KEYS), where)
    if raw.get("figure") in JUDGED and of_run(raw["figure"]):
        needed = ("figure",)
    else:
        needed = ("method", "figure") if "figure" in raw else ("method", "metric", "stat")
    for key in needed:
        if key not in raw:
            raise ThresholdsFormatError(f"{where}: missing required key {key!r} ({CHECK_KEYS[key]})")
    for key in ("metric", "stat"):
        if key in raw and "figure" in raw:
            raise ThresholdsFormatError(
                f"{where}: key {key!r} with 'figure': a check judges one or the other"
            )
    values = {**defaults, **{key: _value(raw, key, where) for key in raw}}
    _check_rules(values, where)
    if "better" not in values:
        values["better"] = "higher" if "min" in values and "max" not in values else "lower"
    if "name" not in values:
        values["name"] = default_name(values)
    return Check(index=index, **values)


def _check_rules(values: dict[str, Any], where: str) -> None:
    """Rules between keys (each key's own type and range are checked by `_value`)."""
    if not any(key in values for key in ("max", "min", "max_regression")):
        raise ThresholdsFormatError(f"{where}: no condition: give 'max' and/or 'min' (or 'max_regression')")
    if "max" in values and "min" in values and values["min"] > values["max"]:
        raise ThresholdsFormatError(f"{where}: key 'min' ({values['min']}) > 'max' ({values['max']})")
    if ("max_regression" in values) != ("baseline_run" in values):
        given, needed = ("max_regression", "baseline_run")
        if "baseline_run" in values:
            given, needed = needed, given
        raise ThresholdsFormatError(f"{where}: key {given!r} needs {needed!r}")
    if "better" in values and "max_regression" not in values:
        raise ThresholdsFormatError(f"{where}: key 'better' only applies with 'max_regression'")
    if values.get("run") is not None and values.get("run") == values.get("baseline_run"):
        raise ThresholdsFormatError(f"{where}: key 'baseline_run' equals 'run' ({values['run']!r})")
    if values.get("metric") in TRUTH_ONLY_METRICS and values["method"] != "ground_truth":
        raise ThresholdsFormatError(
            f"{where}: key 'metric': {values['metric']!r} exists for method 'ground_truth' only, "
            f"not {values['method']!r}"
        )
    if values.get("metric") in ESTIMATOR_ONLY_METRICS and values["method"] == "ground_truth":
        raise ThresholdsFormatError(
            f"{where}: key 'metric': {values['metric']!r} compares an estimate with the ground truth; "
            "method 'ground_truth' has none"
        )
    figure = lookup(values["figure"]) if "figure" in values else None
    if figure and figure[0].view != "weight" and values.get("method") == "ground_truth":
        raise ThresholdsFormatError(
            f"{where}: key 'figure': {values['figure']!r} compares an estimate with the ground truth; "
            "method 'ground_truth' has none"
        )
    if values.get("each_staleness") and not (figure and figure[0].view == "decision" and figure[0].interval):
        raise ThresholdsFormatError(
            f"{where}: key 'each_staleness': judges a decision figure with a 95% interval at each staleness "
            f"(e.g. excess_gradient_mass_error), not {values.get('figure') or values.get('metric')!r}"
        )
    if values.get("each_staleness") and "baseline_run" in values:
        raise ThresholdsFormatError(f"{where}: key 'each_staleness' with 'baseline_run': one or the other")
    if figure and of_run(values["figure"]):
        for key in ("method", "staleness", "each_staleness"):
            if values.get(key) not in (None, False):
                raise ThresholdsFormatError(
                    f"{where}: key {key!r}: figure {values['figure']!r} counts over the whole run"
                )
    if figure and figure[0].view == "safe_staleness" and "staleness" in values:
        raise ThresholdsFormatError(f"{where}: key 'staleness': {values['figure']} looks at every staleness")
    for key in SAFE_STALENESS_KEYS:
        if key in values and not (figure and figure[0].view == "safe_staleness"):
            raise ThresholdsFormatError(
                f"{where}: key {key!r} only applies with figure = "
                "'safe_staleness' or 'safe_staleness_beyond_floor'"
            )


def _value(raw: dict, key: str, where: str) -> Any:
    """Validate one key's type and range; returns the normalised value."""
    value = raw[key]
    here = f"{where}: key {key!r}"
    if key in ("method", "metric", "stat", "figure"):
        choices = {"method": METHODS, "metric": METRICS, "stat": STATS, "figure": JUDGED}[key]
        if value not in choices:
            raise ThresholdsFormatError(
                f"{here}: unknown {key} {value!r}; expected one of {', '.join(choices)}"
            )
        return value
    if key in ("name", "run", "baseline_run"):
        if not isinstance(value, str) or not value.strip():
            raise ThresholdsFormatError(f"{here}: must be a non-empty string, got {value!r}")
        return value
    if key in ("max", "min", "max_regression", *SAFE_STALENESS_KEYS):
        return _finite_number(value, here, nonnegative=key != "max" and key != "min")
    if key == "staleness":
        return _staleness(value, here)
    if key in ("warn_only", "each_staleness"):
        if not isinstance(value, bool):
            raise ThresholdsFormatError(f"{here}: must be true or false, got {value!r}")
        return value
    if key == "min_tokens":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ThresholdsFormatError(f"{here}: must be an integer >= 0, got {value!r}")
        return value
    choices = {"on_insufficient": ON_INSUFFICIENT, "on_inconclusive": ON_INSUFFICIENT, "better": BETTER}[key]
    if value not in choices:
        raise ThresholdsFormatError(f"{here}: must be one of {', '.join(choices)}, got {value!r}")
    return value


def _finite_number(value: Any, here: str, nonnegative: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ThresholdsFormatError(f"{here}: must be a finite number, got {value!r}")
    if abs(value) > ABSURD:
        raise ThresholdsFormatError(
            f"{here}: {value!r} is beyond +-{ABSURD:g}, which no figure of proxaudit reaches (weights are "
            "capped at 1.4e65): a typo?"
        )
    if nonnegative and value < 0:
        raise ThresholdsFormatError(f"{here}: must be >= 0, got {value!r}")
    return float(value)


def _staleness(value: Any, here: str) -> tuple[int, int]:
    bounds = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(bounds, list)
        or len(bounds) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
    ):
        raise ThresholdsFormatError(f"{here}: must be [lo, hi] (two integers) or one integer, got {value!r}")
    lo, hi = bounds
    if lo < 0 or hi < lo:
        raise ThresholdsFormatError(f"{here}: need 0 <= lo <= hi, got [{lo}, {hi}]")
    return (lo, hi)


def _reject_unknown(table: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ThresholdsFormatError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}"
        )


def _number(x: float) -> str:
    return f"{x:g}"


def default_name(values: dict[str, Any]) -> str:
    """e.g. 'loglinear abs_error p99 <= 0.05 [staleness 1-4]', 'loglinear gradient_mass_error <= 0.01',
    'warnings <= 0'."""
    parts = [
        *([values["method"]] if "method" in values else []),
        *([values["figure"]] if "figure" in values else [values["metric"], values["stat"]]),
    ]
    if "min" in values:
        parts.append(f">= {_number(values['min'])}")
    if "max" in values:
        parts.append(f"<= {_number(values['max'])}")
    if "max_regression" in values:
        parts.append(f"within {_number(100 * values['max_regression'])}% of {values['baseline_run']}")
    if values.get("staleness") is not None:
        lo, hi = values["staleness"]
        parts.append(f"[staleness {lo}]" if lo == hi else f"[staleness {lo}-{hi}]")
    if values.get("each_staleness"):
        parts.append("[each staleness]")
    if values.get("run") is not None:
        parts.append(f"[run {values['run']}]")
    return " ".join(parts)
