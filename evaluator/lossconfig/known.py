"""The keys a trainer's config may hold in the sections proxaudit reads, from the trainer's own schema at
a pinned commit (`trainer_keys/{trainer}.json`, made from the trainer's source by
`trainer_keys/make_keys.py`), with, where its schema does not declare every key it ships (NeMo-RL's
TypedDicts), the keys its own example configs at that commit hold (`from_examples`). A key outside them,
at any depth, is a usage error naming the nearest known key: a typo (`eps_clp`, `uper`) or a key of
another version of the trainer, never a default silently used instead. Keys a reader maps from older
versions of its trainer are added by that reader (`extra`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from evaluator.errors import UsageError
from evaluator.inputs import shown

ANY = "*"
"""A mapping whose keys are not checked: a `dict` field, or a section proxaudit does not read."""


@dataclass(frozen=True)
class TrainerKeys:
    """One trainer's sections, by their dotted path in the config ("" the top level): each key maps to None
    (a value), `ANY`, the keys below it (a dict), or a list holding the keys of each of its items."""

    trainer: str
    repository: str
    commit: str
    sections: dict
    from_examples: tuple[str, ...] = ()
    """the dotted keys known from the trainer's example configs, not its schema"""

    @property
    def schema(self) -> str:
        examples = " or its example configs" if self.from_examples else ""
        return f"{self.trainer}'s config schema{examples} at {self.repository}@{self.commit[:8]}"


@cache
def trainer_keys(name: str) -> TrainerKeys:
    """The keys of `name` (areal, verl, nemo_rl, prime_rl, trl)."""
    document = json.loads((files("evaluator.lossconfig") / "trainer_keys" / f"{name}.json").read_text())
    fields = ("trainer", "repository", "commit", "sections")
    return TrainerKeys(*(document[f] for f in fields), tuple(document.get("from_examples", ())))


def check_known(
    config: dict, keys: TrainerKeys, file: str, extra: dict[str, tuple[str, ...]] | None = None
) -> None:
    """A `UsageError` naming `file`, the dotted key and its nearest known key for the first key of the
    sections of `keys` that `config` holds and the trainer does not know (`extra`: more known keys, by
    the dotted path of their mapping)."""
    pending = [(_at(config, s), tree, s) for s, tree in keys.sections.items()]
    pending = [(values, tree, path) for values, tree, path in pending if isinstance(values, dict)]
    while pending:
        values, tree, path = pending.pop()
        if tree == ANY:
            continue
        known = {**tree, **dict.fromkeys((extra or {}).get(path, ()))}
        for key, value in values.items():
            if key not in known:
                label = key if isinstance(key, str) and len(key) <= 60 else shown(key)
                raise UsageError(f"{file}: {_join(path, label)}: {_unknown(key, known, keys)}")
            below = known[key]
            if isinstance(below, dict | str) and isinstance(value, dict):
                pending.append((value, below, _join(path, key)))
            elif isinstance(below, list) and isinstance(value, list):
                items = enumerate(value)
                pending += [
                    (v, below[0], f"{_join(path, key)}[{i}]") for i, v in items if isinstance(v, dict)
                ]


def _at(config: dict, section: str) -> object:
    """The value at the dotted path `section` of `config` (`config` itself for "")."""
    for key in filter(None, section.split(".")):
        config = config.get(key) if isinstance(config, dict) else None
    return config


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _unknown(key: object, known: dict, keys: TrainerKeys) -> str:
    return f"unknown key: not in {keys.schema}{nearest(key, known)}"


def nearest(key: object, known: Iterable[str]) -> str:
    """ "; the nearest known key is K" (difflib's closest of `known`), or nothing for a key not a string."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.0) if isinstance(key, str) else []
    return f"; the nearest known key is {close[0]}" if close else ""
