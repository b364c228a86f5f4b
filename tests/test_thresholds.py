"""The thresholds format (schemas/thresholds.py): what parses, what each check becomes, and that every
broken rule is an error naming the file, the check and the key."""

from __future__ import annotations

import pytest

from evaluator.errors import InputFileError
from evaluator.gate.judge import load_thresholds
from schemas.figures import JUDGED, of_run
from schemas.store import METHODS, METRICS, STATS, TRUTH_ONLY_METRICS
from schemas.thresholds import CHECK_KEYS, Check, ThresholdsFormatError, parse_thresholds

MINIMAL = """
[[check]]
method = "loglinear"
metric = "abs_error"
stat = "p99"
max = 0.05
"""
FIGURE = """
[[check]]
method = "loglinear"
figure = "gradient_mass_error"
max = 0.01
"""


def one(text: str) -> Check:
    (check,) = parse_thresholds(text, source="t.toml").checks
    return check


class TestParse:
    def test_minimal_check_gets_builtin_defaults_and_a_derived_name(self):
        check = one(MINIMAL)
        assert check == Check(
            index=1, name="loglinear abs_error p99 <= 0.05", method="loglinear", metric="abs_error",
            stat="p99", max=0.05,
        )  # fmt: skip
        assert (check.min_tokens, check.on_insufficient, check.warn_only, check.better) == (
            1,
            "fail",
            False,
            "lower",
        )

    def test_every_key(self):
        check = one(
            """
            [[check]]
            name = "tail"
            method = "linear"
            metric = "rel_error"
            stat = "mean"
            max = 1
            min = 0
            staleness = [1, 4]
            run = "run-42"
            warn_only = true
            min_tokens = 50
            on_insufficient = "warn"
            baseline_run = "run-41"
            max_regression = 0.1
            better = "higher"
            """
        )
        assert check.max == 1.0 and isinstance(check.max, float) and check.min == 0.0
        assert check.staleness == (1, 4) and check.run == "run-42" and check.warn_only
        assert (check.min_tokens, check.on_insufficient) == (50, "warn")
        assert (check.baseline_run, check.max_regression, check.better) == ("run-41", 0.1, "higher")

    def test_defaults_table_applies_and_a_check_overrides_it(self):
        thresholds = parse_thresholds(
            '[defaults]\nmin_tokens = 1000\non_insufficient = "warn"\nwarn_only = true\n'
            + MINIMAL
            + MINIMAL.replace("0.05", "0.1") + "min_tokens = 5\nwarn_only = false\n"
        )  # fmt: skip
        first, second = thresholds.checks
        assert (first.min_tokens, first.on_insufficient, first.warn_only) == (1000, "warn", True)
        assert (second.min_tokens, second.on_insufficient, second.warn_only) == (5, "warn", False)
        assert (first.index, second.index) == (1, 2)

    def test_derived_names(self):
        check = one(MINIMAL.replace("max = 0.05", "min = 0.5\nstaleness = 3\nrun = 'r'"))
        assert check.name == "loglinear abs_error p99 >= 0.5 [staleness 3] [run r]"
        assert check.staleness == (3, 3)
        check = one(MINIMAL + 'staleness = [1, 4]\nbaseline_run = "main"\nmax_regression = 0.1\n')
        assert check.name == "loglinear abs_error p99 <= 0.05 within 10% of main [staleness 1-4]"

    def test_regression_direction_defaults_from_the_condition(self):
        only_min = one(MINIMAL.replace("max =", "min =") + 'baseline_run = "b"\nmax_regression = 0.1\n')
        assert only_min.better == "higher"
        only_regression = one(MINIMAL.replace("max = 0.05", 'baseline_run = "b"\nmax_regression = 0.1'))
        assert only_regression.better == "lower" and only_regression.max is None

    def test_every_vocabulary_word_is_accepted(self):
        for method in METHODS:
            for stat in STATS:
                assert one(MINIMAL.replace("loglinear", method).replace("p99", stat)).method == method
        for metric in METRICS:
            method = "ground_truth" if metric in TRUTH_ONLY_METRICS else "loglinear"
            assert one(MINIMAL.replace("abs_error", metric).replace("loglinear", method)).metric == metric
        for figure in [name for name in JUDGED if not of_run(name)]:
            check = one(FIGURE.replace("gradient_mass_error", figure))
            assert (check.figure, check.measure, check.metric, check.stat) == (figure, figure, None, None)

    def test_a_run_figure_takes_no_method(self):
        check = one('[[check]]\nfigure = "warnings"\nmax = 0\n')
        assert (check.method, check.figure, check.name) == (None, "warnings", "warnings <= 0")
        with pytest.raises(ThresholdsFormatError, match="method"):
            one('[[check]]\nmethod = "loglinear"\nfigure = "warnings"\nmax = 0\n')
        with pytest.raises(ThresholdsFormatError, match="staleness"):
            one('[[check]]\nfigure = "warnings"\nmax = 0\nstaleness = [1, 2]\n')

    def test_a_figure_check(self):
        check = one(FIGURE + "staleness = [1, 5]\n")
        assert check.name == "loglinear gradient_mass_error <= 0.01 [staleness 1-5]"
        safe = one(
            '[[check]]\nmethod = "linear"\nfigure = "safe_staleness"\nmin = 4\nmax_clip_flip_rate = 0.02\n'
        )
        assert (safe.max_gradient_mass_error, safe.max_clip_flip_rate, safe.better) == (0.01, 0.02, "higher")
        assert safe.name == "linear safe_staleness >= 4"

    def test_a_check_at_each_staleness(self):
        """`each_staleness` judges a decision figure with an interval at each staleness of its range (1 to S
        without one); the name says so."""
        check = one(
            FIGURE.replace("gradient_mass_error", "excess_gradient_mass_error") + "each_staleness = true\n"
        )
        assert (check.each_staleness, check.staleness) == (True, None)
        assert check.name == "loglinear excess_gradient_mass_error <= 0.01 [each staleness]"
        ranged = one(FIGURE + "each_staleness = true\nstaleness = [2, 4]\n")
        assert ranged.staleness == (2, 4) and ranged.name.endswith("[staleness 2-4] [each staleness]")
        assert not one(FIGURE).each_staleness

    def test_load_reads_a_file(self, tmp_path):
        path = tmp_path / "gate.toml"
        path.write_text(MINIMAL)
        assert load_thresholds(path).source == str(path)

    def test_every_check_key_is_documented(self, repo_root):
        section = (repo_root / "docs" / "gate.md").read_text()
        for key in CHECK_KEYS:
            assert f"`{key}`" in section, key


BAD = [
    # (what is wrong, TOML, fragments the message must contain)
    ("not TOML", "[[check]\n", ["t.toml", "not valid TOML"]),
    ("no checks", "[defaults]\nmin_tokens = 3\n", ["no [[check]]"]),
    ("check not a table array", "check = 3\n", ["array of tables"]),
    ("unknown top-level key", "colour = 1\n" + MINIMAL, ["top level", "'colour'"]),
    ("unknown check key", MINIMAL + "maxx = 1\n", ["check 1", "'maxx'", "allowed keys"]),
    ("unknown defaults key", "[defaults]\nstat = 'p50'\n" + MINIMAL, ["[defaults]", "'stat'"]),
    ("defaults not a table", "defaults = 1\n" + MINIMAL, ["[defaults]", "table"]),
    ("missing method", MINIMAL.replace('method = "loglinear"', ""), ["check 1", "'method'"]),
    ("missing stat", MINIMAL.replace('stat = "p99"', ""), ["'stat'"]),
    ("unknown method", MINIMAL.replace('"loglinear"', '"logistic"'), ["'method'", "logistic", "loglinear"]),
    ("unknown metric", MINIMAL.replace('"abs_error"', '"abs_err"'), ["'metric'", "abs_err", "rel_error"]),
    ("unknown stat", MINIMAL.replace('"p99"', '"p95"'), ["'stat'", "p95", "p90"]),
    ("no condition", MINIMAL.replace("max = 0.05", ""), ["no condition", "'max'"]),
    ("max not a number", MINIMAL.replace("0.05", '"0.05"'), ["'max'", "finite number"]),
    ("max is a bool", MINIMAL.replace("0.05", "true"), ["'max'", "finite number"]),
    ("max is nan", MINIMAL.replace("0.05", "nan"), ["'max'", "finite number"]),
    ("min above max", MINIMAL + "min = 0.1\n", ["'min'", "> 'max'"]),
    ("staleness reversed", MINIMAL + "staleness = [4, 1]\n", ["'staleness'", "lo <= hi"]),
    ("staleness negative", MINIMAL + "staleness = [-1, 2]\n", ["'staleness'", "0 <= lo"]),
    ("staleness three items", MINIMAL + "staleness = [1, 2, 3]\n", ["'staleness'", "[lo, hi]"]),
    ("staleness floats", MINIMAL + "staleness = [1.0, 2.0]\n", ["'staleness'", "two integers"]),
    ("run empty", MINIMAL + 'run = ""\n', ["'run'", "non-empty string"]),
    ("warn_only a string", MINIMAL + 'warn_only = "yes"\n', ["'warn_only'", "true or false"]),
    ("min_tokens negative", MINIMAL + "min_tokens = -1\n", ["'min_tokens'", ">= 0"]),
    ("min_tokens float", MINIMAL + "min_tokens = 10.5\n", ["'min_tokens'", "integer"]),
    ("on_insufficient bad", MINIMAL + 'on_insufficient = "ignore"\n', ["'on_insufficient'", "fail, warn"]),
    (
        "regression without baseline",
        MINIMAL + "max_regression = 0.1\n",
        ["'max_regression' needs 'baseline_run'"],
    ),
    (
        "baseline without regression",
        MINIMAL + 'baseline_run = "b"\n',
        ["'baseline_run' needs 'max_regression'"],
    ),
    (
        "negative regression",
        MINIMAL + 'baseline_run = "b"\nmax_regression = -0.1\n',
        ["'max_regression'", ">= 0"],
    ),
    ("better without regression", MINIMAL + 'better = "lower"\n', ["'better' only applies"]),
    ("better bad", MINIMAL + 'baseline_run = "b"\nmax_regression = 0.1\nbetter = "up"\n', ["'better'"]),
    (
        "baseline is the run",
        MINIMAL + 'run = "a"\nbaseline_run = "a"\nmax_regression = 0.1\n',
        ["equals 'run'"],
    ),
    ("drift of an estimator", MINIMAL.replace("abs_error", "drift"), ["'drift'", "ground_truth"]),
    (
        "a flip of the ground truth",
        MINIMAL.replace("abs_error", "clip_flip").replace('"loglinear"', '"ground_truth"'),
        ["'clip_flip'", "compares an estimate"],
    ),
    ("figure and metric", FIGURE + 'metric = "abs_error"\n', ["key 'metric' with 'figure'"]),
    ("unknown figure", FIGURE.replace("gradient_mass_error", "gme"), ["'figure'", "gme", "safe_staleness"]),
    (
        "gradient mass error of the ground truth",
        FIGURE.replace('"loglinear"', '"ground_truth"'),
        ["'gradient_mass_error'", "compares an estimate"],
    ),
    (
        "safe staleness in a staleness range",
        FIGURE.replace("gradient_mass_error", "safe_staleness") + "staleness = [0, 3]\n",
        ["'staleness'", "every staleness"],
    ),
    (
        "tolerance of another figure",
        FIGURE + "max_clip_flip_rate = 0.1\n",
        ["only applies", "safe_staleness"],
    ),
    (
        "negative tolerance",
        FIGURE.replace("gradient_mass_error", "safe_staleness") + "max_gradient_mass_error = -1\n",
        ["'max_gradient_mass_error'", ">= 0"],
    ),
    ("duplicate names", MINIMAL + MINIMAL, ["check 2", "already used by check 1"]),
    (
        "each staleness of a metric",
        MINIMAL + "each_staleness = true\n",
        ["key 'each_staleness'", "a decision figure with a 95% interval", "'abs_error'"],
    ),
    (
        "each staleness of a figure without an interval",
        FIGURE.replace("gradient_mass_error", "ess_fraction") + "each_staleness = true\n",
        ["key 'each_staleness'", "'ess_fraction'"],
    ),
    (
        "each staleness of the safe staleness",
        FIGURE.replace("gradient_mass_error", "safe_staleness") + "each_staleness = true\n",
        ["key 'each_staleness'", "'safe_staleness'"],
    ),
    (
        "each staleness of the engine floor",
        '[[check]]\nfigure = "floor_gradient_mass_error"\nmax = 0.01\neach_staleness = true\n',
        ["key 'each_staleness'", "counts over the whole run"],
    ),
    (
        "each staleness against a baseline",
        FIGURE + 'each_staleness = true\nbaseline_run = "b"\nmax_regression = 0.1\n',
        ["'each_staleness' with 'baseline_run'"],
    ),
    ("each staleness not a bool", FIGURE + 'each_staleness = "yes"\n', ["'each_staleness'", "true or false"]),
]


@pytest.mark.parametrize(("toml", "fragments"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_file_is_a_clear_error(toml, fragments):
    with pytest.raises(ThresholdsFormatError) as error:
        parse_thresholds(toml, source="t.toml")
    message = str(error.value)
    assert message.startswith("t.toml")
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_error_names_the_check_by_index_and_name():
    text = (
        MINIMAL
        + '\n[[check]]\nname = "second"\nmethod = "loglinear"\nmetric = "abs_error"\nstat = "p42"\nmax = 1\n'
    )
    with pytest.raises(ThresholdsFormatError, match=r"t\.toml: check 2 \('second'\): key 'stat'"):
        parse_thresholds(text, source="t.toml")


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(InputFileError, match="thresholds file not found"):
        load_thresholds(tmp_path / "absent.toml")


def test_default_thresholds_file_parses(repo_root):
    thresholds = load_thresholds(repo_root / "schemas" / "default_thresholds.toml")
    assert thresholds.checks
    assert all(
        check.min_tokens >= 1000 for check in thresholds.checks if not (check.figure and of_run(check.figure))
    )
    # blocking: the engine floor on its own and the approximation's excess over it at each staleness the
    # trainer runs (never pooled), at the 1% tolerance; the nats of AReaL's "typical good values"
    # (0.001-0.01 absolute, 0.1%-1% relative) only warn; an inconclusive interval warns
    blocking = {
        (c.figure, c.each_staleness, c.staleness): c.max for c in thresholds.checks if not c.warn_only
    }
    assert blocking == {
        ("floor_gradient_mass_error", False, None): 0.01, ("floor_clip_flip_rate", False, None): 0.01,
        ("excess_gradient_mass_error", True, None): 0.01, ("excess_clip_flip_rate", True, None): 0.01,
        ("excess_bound_flip_rate", True, None): 0.01,
    }  # fmt: skip
    assert {c.on_inconclusive for c in thresholds.checks} == {"warn"}
    for check in thresholds.checks:
        if check.stat == "mean":
            assert check.warn_only and check.max is not None and 0.001 <= check.max <= 0.01, check.name
