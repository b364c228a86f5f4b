"""Which files of a watched folder are complete: a pure function of the folder's listing (each file's path,
size, modification time and last bytes) and its markers, per format, from how each trainer writes them.

- `token-log`: the hook writes each file under a temporary name and renames it into place
  (`evaluator.logio.write_log_atomic`: `.NAME.parquet.XXXX.tmp`, fsync, rename to `NAME.parquet`), so a
  `*.parquet` is whole when it appears. Any other writer of schema v1 counts once the file ends with
  Parquet's footer magic `PAR1` (written last, so a file written in place is whole then too); hidden names
  are temporaries.
- `prime-rl` (PrimeIntellect-ai/prime-rl at 559b447): `TokenExporter._write` appends each record to
  `token_exports/step_N/rank_R.jsonl` (open, write, close); `train` (`src/prime_rl/trainer/rl/train.py`)
  calls `dist.barrier()` after the step's micro steps, then `TokenExporter.mark_stable` touches
  `step_N/STABLE`: every rank's file of the step is whole. Exports from before the marker (941019f,
  2026-06-11) have none: a rank's file of step N is whole once that rank writes a later step, or the run
  has ended.
- `nemo-rl` (NVIDIA-NeMo/RL at 7ea279a): `Logger.log_batched_dict_as_jsonl` (`nemo_rl/utils/logger.py`)
  writes `train_data_step{N}.jsonl` in place, a line per sample, once per step in order (`grpo_train`,
  `nemo_rl/algorithms/grpo.py`): whole once a later step's file appears, or the run has ended (then it
  must end with a newline).
- `slime` (THUDM/slime at 624b824) and Miles (radixark/miles at 31f1ca9): `save_debug_train_data`
  (`slime/observability/train_data_utils.py`; Miles: `save_debug_train_data_for_rank`,
  `miles/utils/train_dump_utils.py`, one `{id}_{rank}.pt` per rank) `torch.save`s
  `train_data/{rollout_id}.pt` in place after the actor trained the rollout, rollout after rollout
  (`MegatronTrainRayActor.train`): whole once the same rank's file of a later rollout appears, or the run
  has ended (then it must end with the zip end-of-central-directory record that `torch.save` writes
  last). `rollout_data/{id}.pt`, whose versions the import reads, is written by `RolloutManager.generate`
  (`slime/ray/rollout.py`) before the rollout goes to training: whole by the time its train file appears.
- `skyrl` (NovaSky-AI/SkyRL at a956457): `RayPPOTrainer.dump_data` (`skyrl/train/trainer.py`) pickles the
  step's batch in place (`TrainingInputBatch.save`: `pickle.dump` into `open(path, "wb")`) as
  `dumped_data/global_step_{N}_training_input.pkl`, once per step: whole once a later step's file
  appears, or the run has ended (then it must end with pickle's STOP opcode `.`).

"The run has ended" is the caller's call (`evaluator.watch.loop`: no file changed for `--idle-after`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluator.importers import nemo_rl, prime_rl, skyrl, slime

TAIL_BYTES = 22
"""How many last bytes of each file the listing keeps: a zip's end-of-central-directory record."""
FORMATS = ("token-log", "nemo-rl", "prime-rl", "slime", "skyrl")
"""What `watch` follows: token logs of schema v1 (the hook's or any writer's), or a trainer's dumps."""
STABLE = "STABLE"
_HOOK_TEMPORARY = re.compile(r"^\..+\.parquet\..+\.tmp$")
_ZIP_END = b"PK\x05\x06"


@dataclass(frozen=True)
class Entry:
    """One file of a watched folder as listed: where, how big, when last changed, its last bytes."""

    path: Path
    size: int
    mtime_ns: int
    tail: bytes = b""
    """the file's last `TAIL_BYTES` bytes (all of it when shorter)"""


@dataclass(frozen=True)
class Split:
    """A listing's files of the format: those complete, and those still being written (or cut short)."""

    complete: tuple[Entry, ...]
    incomplete: tuple[Entry, ...]


def split(fmt: str, entries: Iterable[Entry], ended: bool) -> Split:
    """The files of format `fmt` in `entries`, complete or not (see the module docstring); `ended`: the run
    has ended (no file changed for a while), so a file of a non-atomic writer that no later file follows
    counts once it ends as its format ends. Complete files come sorted by path."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: not one of {', '.join(FORMATS)}")
    entries = list(entries)
    rule = {"token-log": _token_logs, "prime-rl": _prime_rl}.get(fmt)
    if rule is not None:
        done, waiting = rule(entries, ended)
    else:
        candidates, key, order, whole = _SERIES[fmt]
        done, waiting = _series([e for e in entries if candidates(e)], key, order, ended, whole)
    return Split(tuple(sorted(done, key=lambda e: str(e.path))), tuple(waiting))


def _token_logs(entries: Sequence[Entry], ended: bool) -> tuple[list[Entry], list[Entry]]:
    """Parquet files that end with the footer magic; the hook's temporaries (and footless files) wait."""
    done, waiting = [], []
    for e in entries:
        name = e.path.name
        if _HOOK_TEMPORARY.match(name):
            waiting.append(e)
        elif name.endswith(".parquet") and not name.startswith("."):
            (done if e.size >= 12 and e.tail.endswith(b"PAR1") else waiting).append(e)
    return done, waiting


def _series(
    entries: Sequence[Entry],
    key: Callable[[Entry], Hashable],
    order: Callable[[Entry], int],
    ended: bool,
    whole: Callable[[Entry], bool],
) -> tuple[list[Entry], list[Entry]]:
    """Files written one after another within each series (`key`: a folder, a rank) in `order`: each is
    complete once a later one of its series exists; the last one once the run has ended and it is whole."""
    latest: dict[Hashable, int] = {}
    for e in entries:
        latest[key(e)] = max(latest.get(key(e), order(e)), order(e))
    done, waiting = [], []
    for e in entries:
        followed = order(e) < latest[key(e)]
        (done if followed or (ended and whole(e)) else waiting).append(e)
    return done, waiting


def _prime_rl(entries: Sequence[Entry], ended: bool) -> tuple[list[Entry], list[Entry]]:
    """`step_N/rank_R.jsonl`: complete with `step_N/STABLE`; under an exporter that writes no marker at
    all (none in its `token_exports`), once the rank writes a later step or the run has ended."""
    files = [
        e for e in entries if prime_rl.NAME.match(e.path.name) and prime_rl.STEP_DIR.match(e.path.parent.name)
    ]
    stable = {e.path.parent for e in entries if e.path.name == STABLE}
    marked_roots = {folder.parent for folder in stable}
    done, waiting = [], []
    unmarked = []
    for e in files:
        if e.path.parent in stable:
            done.append(e)
        elif e.path.parent.parent in marked_roots:  # an exporter with markers: the marker decides
            waiting.append(e)
        else:
            unmarked.append(e)
    later, still = _series(unmarked, _prime_rank, _prime_step, ended, _ends_line)
    return done + later, waiting + still


def _prime_rank(e: Entry) -> Hashable:
    return e.path.parent.parent, prime_rl.NAME.match(e.path.name).group(1)


def _prime_step(e: Entry) -> int:
    return int(prime_rl.STEP_DIR.match(e.path.parent.name).group(1))


def _ends_line(e: Entry) -> bool:
    return e.tail.endswith(b"\n")


def _slime_file(e: Entry) -> bool:
    return e.path.parent.name == "train_data" and slime.NAME.match(e.path.name) is not None


def _slime_series(e: Entry) -> Hashable:
    """The folder and the rank (`{id}_{rank}.pt`, Miles and slime before format 2; None: one file)."""
    return e.path.parent, slime.NAME.match(e.path.name).group(2)


_SERIES: dict[str, tuple[Callable, Callable, Callable, Callable]] = {
    "nemo-rl": (
        lambda e: nemo_rl.NAME.match(e.path.name) is not None,
        lambda e: e.path.parent,
        lambda e: int(nemo_rl.NAME.match(e.path.name).group(1)),
        _ends_line,
    ),
    "slime": (
        _slime_file,
        _slime_series,
        lambda e: int(slime.NAME.match(e.path.name).group(1)),
        lambda e: len(e.tail) >= 22 and e.tail[-22:-18] == _ZIP_END,
    ),
    "skyrl": (
        lambda e: skyrl.NAME.match(e.path.name) is not None,
        lambda e: e.path.parent,
        lambda e: int(skyrl.NAME.match(e.path.name).group(1)),
        lambda e: e.tail.endswith(b"."),
    ),
}
"""Per format of one-file-after-another writers: (is a dump file, its series, its place, ends whole)."""
