"""A replay's store opened in a thread while the file of a one-file call is checked, judged and summarised
(`open_while`): opening is mostly DuckDB (its extensions, the store's set-up check) and a file's work mostly
polars, numpy and DuckDB, all without the GIL, so a replay of one small file pays about the longer of the
two, not both."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from evaluator.replay.histograms import needs_compiled
from evaluator.replay.reading import footer_rows
from evaluator.replay.slots import Slot
from evaluator.replay.workers import LocalRunner
from evaluator.store import StoreWriter


def alone(slots: list[Slot], runner) -> bool:
    """Is there one file to do, small enough to need no compiled kernels, and checked and summarised in
    this process? Its work then needs nothing from the store."""
    todo = [s for s in slots if s.to_check]
    return (
        len(todo) == 1 and isinstance(runner, LocalRunner) and not needs_compiled(footer_rows(todo[0].path))
    )


def open_while(
    writer: StoreWriter, opened: contextlib.ExitStack, alone: bool, work: Callable[[], tuple[list, Iterator]]
) -> tuple[StoreWriter, tuple[list, list] | None]:
    """(the store, `work()`'s result or None): the store opened (`writer`, closed by `opened`) in a thread
    while a file that is `alone` is checked, judged and summarised here (`work`, its summaries taken now).
    The caller drops that work if the store holds the file after all (`evaluator.replay.slots.stored`)."""
    with ThreadPoolExecutor(1, thread_name_prefix="open-store") as pool:
        opening = pool.submit(writer.__enter__)
        try:
            done = None
            if alone:
                findings, summaries = work()
                done = findings, list(summaries)
        finally:
            store = opening.result()  # an open that failed has closed itself: its error is the call's
            opened.push(writer)
    return store, done
