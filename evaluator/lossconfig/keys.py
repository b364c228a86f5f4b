"""Reading typed values out of a config mapping, with errors that name the file and the key, and a record
of which keys were used and which were ignored."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from evaluator.errors import UsageError


@dataclass
class Reader:
    """The keys of one mapping of a config file (`where` names the file and the section)."""

    values: dict
    where: str
    used: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, key: str, why: str) -> UsageError:
        return UsageError(f"{self.where}: {key}: {why}")

    def has(self, key: str) -> bool:
        return key in self.values and self.values[key] is not None

    def _take(self, key: str) -> object:
        value = self.values[key]
        if isinstance(value, str) and "${" in value:
            raise self.fail(key, f"{value!r} is an unresolved interpolation: give the value itself")
        self.used.append(f"{key} = {value!r}")
        return value

    def number(self, key: str, default: float | None = None) -> float | None:
        if not self.has(key):
            return default
        value = self._take(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise self.fail(key, f"{value!r} must be a number")
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        if not self.has(key):
            return default
        value = self._take(key)
        if not isinstance(value, bool):
            raise self.fail(key, f"{value!r} must be true or false")
        return value

    def text(self, key: str, allowed: tuple[str, ...], default: str | None = None) -> str | None:
        if not self.has(key):
            return default
        value = self._take(key)
        if value not in allowed:
            raise self.fail(key, f"{value!r} must be one of {', '.join(allowed)}")
        return value

    def table(self, key: str) -> Reader | None:
        if not self.has(key):
            return None
        value = self.values[key]
        if not isinstance(value, dict):
            raise self.fail(key, f"{value!r} must be a table of keys")
        return Reader(value, f"{self.where} {key}")

    def ignored(self, taken: set[str]) -> list[str]:
        """The keys present but not among `taken` (the ones that shape no decision proxaudit models)."""
        return [f"{self.where.split(' ', 1)[-1]}.{k}" for k in self.values if k not in taken]
