"""Which files of a watched folder are complete (evaluator.watch.completeness), per trainer: on listings made
up by hand, and on the real dumps in fixtures/importers (written by each trainer's own code), whole and
cut short."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.watch.completeness import Entry, split
from evaluator.watch.listing import Lister
from tests.conftest import FIXTURES

DUMPS = FIXTURES / "importers"
ZIP_END = b"PK\x05\x06" + bytes(18)


def entry(path: str, tail: bytes = b"", size: int = 100) -> Entry:
    return Entry(Path(path), size, 0, tail)


def names(entries) -> list[str]:
    return [str(e.path) for e in entries]


class TestTokenLogs:
    def test_a_renamed_file_is_complete_and_the_hooks_temporary_is_not(self):
        listing = [
            entry("logs/run-step000000-000009-0000.parquet", b"....PAR1"),
            entry("logs/.run-step000010-000019-0001.parquet.k2j3h4.tmp", b"...."),  # write_log_atomic's
            entry("logs/notes.txt", b"PAR1"),
        ]
        found = split("token-log", listing, ended=False)
        assert names(found.complete) == ["logs/run-step000000-000009-0000.parquet"]
        assert names(found.incomplete) == ["logs/.run-step000010-000019-0001.parquet.k2j3h4.tmp"]

    def test_a_parquet_written_in_place_counts_once_its_footer_is_there(self):
        listing = [
            entry("a.parquet", b"xxxxPAR1"),
            entry("b.parquet", b"xxxxxxxx"),
            entry("c.parquet", b"PAR1", 4),
        ]
        for ended in (False, True):  # the footer decides, not the end of the run
            found = split("token-log", listing, ended=ended)
            assert names(found.complete) == ["a.parquet"] and names(found.incomplete) == [
                "b.parquet",
                "c.parquet",
            ]

    def test_on_real_files(self, tmp_path):
        table = synthetic_steps(SyntheticSpec(tokens_per_step=256), 0, 2)
        whole = write_log_atomic(table, tmp_path / "whole.parquet")
        cut = tmp_path / "cut.parquet"
        cut.write_bytes(whole.read_bytes()[:-100])  # a writer stopped before the footer
        found = split("token-log", Lister([tmp_path]).scan(), ended=True)
        assert names(found.complete) == [str(whole)] and names(found.incomplete) == [str(cut)]


class TestPrimeRl:
    def test_the_stable_marker_decides(self):
        listing = [
            entry("exp/token_exports/step_1/rank_0.jsonl", b"}\n"),
            entry("exp/token_exports/step_1/rank_1.jsonl", b"}\n"),
            entry("exp/token_exports/step_1/STABLE"),
            entry("exp/token_exports/step_2/rank_0.jsonl", b"}\n"),
            entry("exp/token_exports/step_3/rank_0.jsonl", b"}\n"),  # written: step 2 lacks its marker
        ]
        for ended in (False, True):  # a step left without its marker is a step cut short
            found = split("prime-rl", listing, ended=ended)
            assert names(found.complete) == [
                "exp/token_exports/step_1/rank_0.jsonl",
                "exp/token_exports/step_1/rank_1.jsonl",
            ]
            assert len(found.incomplete) == 2

    def test_an_exporter_without_markers_goes_by_each_ranks_later_step(self):
        listing = [
            entry("x/token_exports/step_1/rank_0.jsonl", b"}\n"),
            entry("x/token_exports/step_1/rank_1.jsonl", b"}\n"),
            entry("x/token_exports/step_2/rank_0.jsonl", b"}\n"),
            entry("x/token_exports/step_2/rank_1.jsonl", b'{"ste'),  # cut short
        ]
        found = split("prime-rl", listing, ended=False)
        assert names(found.complete) == [
            "x/token_exports/step_1/rank_0.jsonl",
            "x/token_exports/step_1/rank_1.jsonl",
        ]
        found = split("prime-rl", listing, ended=True)  # the run ended: rank 0's last step ends its line
        assert "x/token_exports/step_2/rank_0.jsonl" in names(found.complete)
        assert names(found.incomplete) == ["x/token_exports/step_2/rank_1.jsonl"]

    def test_on_the_real_export(self):
        found = split("prime-rl", Lister([DUMPS / "prime-rl" / "token_exports"]).scan(), ended=False)
        assert len(found.complete) == 4 and not found.incomplete


@pytest.mark.parametrize(
    "fmt, folder, later, whole, cut",
    [
        ("nemo-rl", "run", "train_data_step{}.jsonl", b'"idx": 3}\n', b'"advant'),
        ("skyrl", "exp/dumped_data", "global_step_{}_training_input.pkl", b"\x94\x8c\x05.", b"\x94\x8c\x05"),
        ("slime", "dump/train_data", "{}.pt", ZIP_END, b"PK\x03\x04" + bytes(18)),
        ("slime", "dump/train_data", "{}_1.pt", ZIP_END, bytes(22)),  # Miles: one file per rank
    ],
)
def test_a_file_is_complete_once_a_later_one_follows_or_the_run_ends_whole(fmt, folder, later, whole, cut):
    listing = [entry(f"{folder}/{later.format(n)}", tail) for n, tail in ((1, whole), (2, whole), (3, cut))]
    found = split(fmt, listing, ended=False)
    assert names(found.complete) == [f"{folder}/{later.format(n)}" for n in (1, 2)]
    assert names(found.incomplete) == [f"{folder}/{later.format(3)}"]
    assert split(fmt, listing, ended=True).incomplete == found.incomplete  # cut short: never complete
    last_whole = [*listing[:2], entry(f"{folder}/{later.format(3)}", whole)]
    assert not split(fmt, last_whole, ended=False).complete[2:]  # the last one waits for the end of the run
    assert len(split(fmt, last_whole, ended=True).complete) == 3


def test_miles_ranks_are_series_of_their_own():
    # rank 1 has written rollout 1, rank 0 not yet: rank 0's rollout 0 file may still be written
    listing = [entry("d/train_data/0_0.pt", ZIP_END), entry("d/train_data/0_1.pt", ZIP_END),
               entry("d/train_data/1_1.pt", ZIP_END)]  # fmt: skip
    assert names(split("slime", listing, ended=False).complete) == ["d/train_data/0_1.pt"]


@pytest.mark.parametrize(
    "fmt, source",
    [
        ("nemo-rl", "nemo-rl"),
        ("skyrl", "skyrl/dumped_data"),
        ("slime", "slime/sync"),
        ("slime", "miles"),
    ],
)
def test_the_real_dumps_end_whole_and_a_cut_copy_does_not(fmt, source, tmp_path):
    """Each trainer's own writer (fixtures/importers/*/make_dump.py): the last file counts once the run
    ends because it ends as its format ends; cut short, it never does."""
    copy = tmp_path / "dump"
    shutil.copytree(DUMPS / source, copy)
    found = split(fmt, Lister([copy]).scan(), ended=True)
    assert found.complete and not found.incomplete
    last = found.complete[-1].path
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    found = split(fmt, Lister([copy]).scan(), ended=True)
    assert names(found.incomplete) == [str(last)]


def test_the_listing_follows_changes_and_forgets_vanished_files(tmp_path):
    lister = Lister([tmp_path / "logs", tmp_path / "not-yet"])
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "a.jsonl"
    log.write_bytes(b"{}\n{")
    assert [e.tail for e in lister.scan()] == [b"{}\n{"]
    log.write_bytes(b"{}\n{}\n")
    assert [e.tail for e in lister.scan()] == [b"{}\n{}\n"]  # read again: the size changed
    log.unlink()
    assert lister.scan() == []


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        split("verl", [], ended=False)
