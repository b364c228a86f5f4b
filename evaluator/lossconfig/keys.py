"""Reading typed values out of a config mapping, with errors that name the file and the key, and a record
of which keys were used and which were ignored. A value's type is checked before anything is built from
it (a number against the range its parameter allows, `evaluator.formulas.loss`); an error shows a value
in a few dozen characters (`evaluator.inputs.shown`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from evaluator.errors import ParameterError, UsageError
from evaluator.inputs import FINITE, Range, shown


@dataclass
class Reader:
    """The keys of one mapping of a config file: `file` names the file, `section` the mapping's dotted
    path in it (empty for the top level)."""

    values: dict
    file: str
    section: str = ""
    used: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    asked: set[str] = field(default_factory=set)
    """every key a reading asked for, null or absent ones too (null is read as unset, never ignored)"""

    def path(self, key: str) -> str:
        return f"{self.section}.{key}" if self.section else key

    def fail(self, key: str, why: str) -> UsageError:
        return UsageError(f"{self.file}: {self.path(key)}: {why}")

    def has(self, key: str) -> bool:
        self.asked.add(self.path(key))
        return key in self.values and self.values[key] is not None

    def _take(self, key: str, kinds: tuple[type, ...], what: str) -> object:
        value = self.values[key]
        if isinstance(value, str) and "${" in value:
            raise self.fail(key, f"{shown(value)} is an unresolved interpolation: give the value itself")
        if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
            raise self.fail(key, f"{shown(value)} must be {what}")
        self.used.append(f"{self.path(key)} = {value!r}")
        return value

    def number(self, key: str, default: float | None = None, allowed: Range = FINITE) -> float | None:
        """A finite number within `allowed` (the range of the loss parameter it sets)."""
        if not self.has(key):
            return default
        try:
            return allowed.check(key, self._take(key, (int, float), "a number"))
        except ParameterError as error:
            raise self.fail(key, error.why) from None

    def flag(self, key: str, default: bool = False) -> bool:
        return bool(self._take(key, (bool,), "true or false")) if self.has(key) else default

    def text(self, key: str, allowed: tuple[str, ...], default: str | None = None) -> str | None:
        if not self.has(key):
            return default
        value = self._take(key, (str,), f"one of {', '.join(allowed)}")
        if value not in allowed:
            raise self.fail(key, f"{shown(value)} must be one of {', '.join(allowed)}")
        return value

    def value(self, key: str, kinds: tuple[type, ...], what: str) -> object:
        """The value of `key` (present) when one of `kinds`, recorded as used."""
        return self._take(key, kinds, what)

    def table(self, key: str) -> Reader | None:
        if not self.has(key):
            return None
        value = self.values[key]
        if not isinstance(value, dict):
            raise self.fail(key, f"{shown(value)} must be a table of keys")
        return Reader(value, self.file, self.path(key))

    def ignored(self, reasons: dict[str, str] | None = None) -> list[str]:
        """The keys set (not null) that nothing read (they shape no decision proxaudit models), each with
        its reason where `reasons` has one and the key is not false."""
        read = {u.split(" = ")[0] for u in self.used} | self.asked
        out = []
        for key, value in self.values.items():
            name = self.path(str(key))
            if value is None or name in read or any(r.startswith(name + ".") for r in read):
                continue  # null sets nothing
            reason = (reasons or {}).get(key) if value is not False else None
            out.append(f"{name} ({reason})" if reason else name)
        return out
