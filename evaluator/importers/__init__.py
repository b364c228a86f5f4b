"""Importers: other trainers' per-token dumps converted to schema v1 Parquet (`proxaudit import`).

Each format module reads its trainer's files as that trainer writes them (docs/importers.md names the
repository, file and commit followed), one record at a time, and hands whole responses to
`evaluator.importers.rows`, which aligns them and writes the Parquet.

May import: the base modules (`logio`, `errors`, `inputs`) and `schemas`; never the validator, replay or
the store: an imported log is validated and replayed like any other.
"""

from __future__ import annotations

from evaluator.importers import nemo_rl, prime_rl, skyrl, slime
from evaluator.importers.rows import ImportResult

FORMATS = {"nemo-rl": nemo_rl, "prime-rl": prime_rl, "slime": slime, "skyrl": skyrl}
"""Format name (the CLI's FORMAT) -> module with `find(paths)`, `out_name(path, run_id)` and
`convert(path, out_dir, run_id)`."""

__all__ = ["FORMATS", "ImportResult"]
