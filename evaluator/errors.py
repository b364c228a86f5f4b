"""Named exceptions of the library. The CLI maps them to exit codes in one place (`evaluator.cli`)."""

from __future__ import annotations


class ProxauditError(Exception):
    """Base class: a problem the user can fix, reported without a traceback."""


class UsageError(ProxauditError):
    """Bad arguments: a path that does not exist, an unknown option value (exit code 2)."""


class NothingReadableError(ProxauditError):
    """No input file could be read at all (exit code 2)."""


class NoGroundTruthError(ProxauditError):
    """Nothing to show: no token of the runs asked for has prox_logp, so no error or decision figure
    (exit code 2, never an empty table read as a clean result)."""


class StoreError(ProxauditError):
    """The metrics database is missing, locked or not a proxaudit store (exit code 2)."""


class ThresholdsError(ProxauditError):
    """The gate's thresholds file is malformed or names an unknown method, metric or stat (exit code 2)."""


class FileFailed(ProxauditError):
    """One file could not be replayed for a reason of its own (a worker died, an unexpected error): it is
    reported, the other files go on (exit code 1)."""


class ParameterError(UsageError, ValueError):
    """A parameter outside what it allows (a NaN bound, an eps past 1, upper below lower): names the
    parameter (`key`) and the rule (exit code 2). A ValueError too, as the loss's constructors raise it.
    Each entry path re-raises it under the name the user wrote (`renamed`): the flag, the config key."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key, self.why = key, why

    def renamed(self, name: str) -> ParameterError:
        return ParameterError(name, self.why)


class InputFileError(UsageError):
    """A file given as input that is not a regular file (a FIFO, a device, a folder), is past its size
    bound, or holds a line past the bound on one line: names the file and the bound (exit code 2)."""
