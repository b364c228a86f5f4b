"""proxaudit's own processes (the command line, replay's workers, watch's looks) never import pandas: 0.4 s
and 55 MB a process, a fifth of replaying a small file.

Nothing of theirs uses pandas: DuckDB gets values as literals and Arrow tables as streams
(`evaluator.duck.literal`, `arrow_view`), and the intervals are numpy. But pyarrow imports pandas on its
first conversion of a Python or numpy value (`pa.array`), only to recognise pandas objects, which these
processes never hand it. `arrow_without_pandas` lets that first conversion find no pandas, so pyarrow does
not look for it again; an explicit pandas conversion (`Table.to_pandas`) still imports it. The dashboard
runs in a process of its own and is not touched.
"""

from __future__ import annotations

import importlib.abc
import sys

import pyarrow as pa


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ImportError("pandas is kept out of this process (evaluator.pandas_free)")
        return None


def arrow_without_pandas() -> None:
    """Have pyarrow settle, now, that pandas is absent (a no-op if pandas is imported already)."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)
