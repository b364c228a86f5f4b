"""Stage 1, the trainer hook: records per-token log-probs and versions into Parquet token logs while a
trainer runs. `recorder` (`TokenLogHook`: the call, the background writer, the files), `layout` (the
trainer's tensor layouts and their alignment), `rows` (host copies and the rows of one call), `adapters`
(AReaL's and verl's batches as the hook's arguments), `earlier` (the run's files already in the folder),
`areal` and `verl` (the hook installed inside those trainers; they import the trainer only when called),
`trainers` (what those two share).

May import: `evaluator.logio`, `evaluator.errors` and `schemas` only: a trainer imports this package."""

from evaluator.hook.recorder import (
    Alignment,
    HookShapeError,
    HookWriterError,
    RunIdReusedWarning,
    TokenLogHook,
)

__all__ = ["Alignment", "HookShapeError", "HookWriterError", "RunIdReusedWarning", "TokenLogHook"]
