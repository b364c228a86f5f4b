"""Every input has a bound and every parameter its range (the hostile-input cases of issue 32): a nonsense
loss is a usage error naming the flag or key, never exit 0 and a store; a FIFO, a device or a huge file
given as a config is refused at once; a YAML alias bomb is refused before it is built; a dump's overlong
line fails its file alone; a NaN bound or verl's threshold 0 is a usage error, not a traceback. Memory is
measured in a child process (its peak RSS), time only guarded by a generous timeout."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.cli import cli
from evaluator.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

MiB = 1 << 20
CHILD = """\
import atexit, re, sys
def peak():  # VmHWM: this process's own peak since exec (ru_maxrss keeps the forking parent's)
    kib = re.search(r"VmHWM:\\s*(\\d+)", open("/proc/self/status").read()).group(1)
    print("peak_kib=" + kib, file=sys.stderr)
atexit.register(peak)
from evaluator.cli import main
sys.argv[0] = "proxaudit"
main()
"""


def run(*args: str):
    return CliRunner().invoke(cli, [*args])


def child(*args: str, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """proxaudit in a child process: (its result, its peak resident memory in MiB). The timeout only
    stops a hang (a FIFO read before the fix waited forever)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    peak = re.search(r"peak_kib=(\d+)", done.stderr)
    assert peak, done.stderr
    return done, int(peak.group(1)) / 1024


def assert_usage_error(result, *fragments: str) -> None:
    output = result.output if hasattr(result, "output") else result.stdout + result.stderr
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code == EXIT_USAGE, output
    for fragment in fragments:
        assert fragment in output, output
    assert "Traceback" not in output


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    spec = SyntheticSpec(run_id="p", tokens_per_step=256, mean_length=16)
    return write_log_atomic(synthetic_steps(spec, 0, 2), folder / "p.parquet")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


class TestNonsenseLossesAreRefused:
    """Issue 32, case 3: accepted before with exit 0 and written to the store."""

    @pytest.mark.parametrize(
        "flags, named",
        [
            (["--bound", "-1"], "--bound"),
            (["--bound", "0"], "--bound"),
            (["--eps-low", "1"], "--eps-low"),  # PPO's clip [0, 1.2]: nothing clipped below
            (["--eps-low", "-0.1"], "--eps-low"),
            (["--eps-high", "0"], "--eps-high"),
            (["--bound", "nan"], "--bound"),  # case 5: a traceback before
            (["--eps-high", "inf"], "--eps-high"),
        ],
    )
    def test_flags(self, log, tmp_path, flags, named):
        result = run("replay", str(log), "--db", str(tmp_path / "m"), *flags)
        assert_usage_error(result, named)
        assert not (tmp_path / "m").exists()

    @pytest.mark.parametrize("flag", ["--loss", "--params"])
    @pytest.mark.parametrize(
        "text, named",
        [
            ("[[rule]]\nupper = -1.0\n", "rule 1.upper: -1.0 must be > 0"),
            ("[[rule]]\nlower = 2.0\nupper = 1.0\n", "rule 1.lower: 2 must be below upper 1"),
            ("[[rule]]\nupper = nan\n", "rule 1.upper: nan must be a finite number"),
            ("[[rule]]\nstatistic = 'kl_k3'\nupper = 0\n", "rule 1.upper: 0.0 must be > 0"),
            ("eps_low = 1.0\n", "eps_low: 1.0 must be in (0, 1)"),
            ("eps_high = -0.2\n", "eps_high: -0.2 must be > 0"),
            ("dual_clip = 1.0\n", "dual_clip: 1.0 must be > 1"),
            ("bound = -1\n", "bound: -1.0 must be > 0"),
            ("eps_high = 1e400\n", "eps_high: inf must be a finite number"),
            ("policy = 'dppo_tv'\nkl_penalty = -0.001\n", "kl_penalty: -0.001 must be >= 0"),
            ("kl_penalty = 0.001\n", "kl_penalty: ppo has no (theta - prox)^2 term"),
            ("m2_threshold = 0\n", "m2_threshold: 0.0 must be > 0"),
            ("policy = 'gmpo'\n", "ratio_level: gmpo is sequence-level"),
            ("[[rule]]\nstatistic = 'mult_prob_error'\nupper = 1.0\n", "rule 1.upper: 1.0 must be > 1"),
        ],
    )
    def test_loss_files(self, log, tmp_path, flag, text, named):
        loss = write(tmp_path / "loss.toml", text)
        result = run("replay", str(log), "--db", str(tmp_path / "m"), flag, str(loss))
        assert_usage_error(result, f"{loss}: {named}")
        assert not (tmp_path / "m").exists()

    @pytest.mark.parametrize(
        "config, named",
        [
            ({"actor": {"rejection_sampling": {"upper": -1.0}}},
             "actor.rejection_sampling.upper: -1.0 must be > 1"),  # AReaL's own rule for a ratio
            ({"actor": {"rejection_sampling": {"metric": "ratio", "lower": 0}}},
             "actor.rejection_sampling.lower: 0 must be > 0"),
            ({"actor": {"eps_clip": 1.0}}, "actor.eps_clip: 1.0 must be in (0, 1)"),
            ({"actor": {"eps_clip": 0.2, "eps_clip_higher": -1}}, "actor.eps_clip_higher: -1 must be > 0"),
            ({"actor": {"c_clip": 0.5}}, "actor.c_clip: 0.5 must be > 1"),
            ({"actor": {"use_cispo_loss": True, "eps_clip": 1.0, "c_clip": 3.0}},
             "actor.c_clip: the dual clip"),
            ({"actor_rollout_ref": {"actor": {"clip_ratio_high": 0}}},
             "actor_rollout_ref.actor.clip_ratio_high: 0 must be > 0"),
            ({"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": -2}}},
             "algorithm.rollout_correction.rollout_is_threshold: -2 must be > 0"),
            ({"algorithm": {"rollout_correction": {"rollout_rs": "seq_mean_k1",
                                                   "rollout_rs_threshold": 0.5}}},
             "rollout_rs_threshold: '0.5' for seq_mean_k1: keeps ratios in [2, 0.5], which holds none"),
            ({"loss_fn": {"ratio_clip_min": 1.5}}, "loss_fn.ratio_clip_min: 1.5 must be in (0, 1)"),
            ({"loss_fn": {"use_importance_sampling_correction": True,
                          "truncated_importance_sampling_type": "tis",
                          "truncated_importance_sampling_ratio": 0}},
             "loss_fn.truncated_importance_sampling_ratio: 0 must be > 0"),
            ({"actor": {"m2_threshold": 0.04, "eps_clip": -0.1}}, "actor.eps_clip: -0.1 must be in [0, 1)"),
            ({"actor": {"m2_threshold": -1}}, "actor.m2_threshold: -1 must be > 0"),
            ({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "dro", "dro_beta": -0.1}}}},
             "actor_rollout_ref.actor.policy_loss.dro_beta: -0.1 must be > 0"),
            ({"actor_rollout_ref": {"actor": {"clip_ratio": -0.2, "policy_loss": {"loss_mode": "dppo_tv"}}}},
             "actor_rollout_ref.actor.clip_ratio: -0.2 must be >= 0"),
            ({"loss_fn": {}, "grpo": {"seq_logprob_error_threshold": 1.0}},
             "grpo.seq_logprob_error_threshold: 1.0 must be > 1"),
            ({"loss_type": "cispo", "epsilon_high": 0.5}, "epsilon_high: 0.5 must be > 1"),
            ({"loss_type": "dapo", "vllm_importance_sampling_clip_max": 0},
             "vllm_importance_sampling_clip_max: 0 must be > 0"),
        ],
    )  # fmt: skip
    def test_trainer_configs(self, log, tmp_path, config, named):
        path = write(tmp_path / "trainer.yaml", yaml.safe_dump(config))
        result = run("replay", str(log), "--db", str(tmp_path / "m"), "--loss-from", str(path))
        assert_usage_error(result, str(path), named)
        assert not (tmp_path / "m").exists()

    @pytest.mark.parametrize(
        "args",
        [
            ["summary", "--db", "m", "--max-gradient-mass-error", "nan"],
            ["summary", "--db", "m", "--max-clip-flip-rate", "-0.01"],
            ["summary", "--db", "m", "--min-tokens", "-1"],
            ["dashboard", "--db", "m", "--port", "0"],
            ["demo", "--port", "70000", "--no-serve"],
            ["bench", "--tokens", "0"],
            ["bench", "--tokens-per-step", "-5"],
        ],
    )
    def test_every_other_numeric_option_has_its_range(self, args):
        result = run(*args)
        assert result.exit_code == EXIT_USAGE and "Invalid value for" in result.output, result.output


class TestVerlThresholdZero:
    """Issue 32, case 5: `ZeroDivisionError` in lossconfig/verl.py before."""

    @pytest.mark.parametrize("threshold", [0, "0", "0.0,2", "0_2", "nan", "inf", "2_nan", "-1", "abc"])
    def test_a_threshold_not_above_0_is_a_usage_error(self, tmp_path, threshold):
        options = "seq_sum_k1,seq_mean_k3" if "," in str(threshold) else "seq_sum_k1"
        correction = {"rollout_rs": options, "rollout_rs_threshold": threshold}
        path = write(
            tmp_path / "verl.yaml", yaml.safe_dump({"algorithm": {"rollout_correction": correction}})
        )
        assert_usage_error(run("loss", "--loss-from", str(path)), "rollout_rs_threshold", str(path))


class TestBoundedReads:
    """Issue 32, case 4: hangs and unbounded memory before."""

    def test_a_fifo_is_refused_at_once(self, tmp_path):
        fifo = tmp_path / "gate.toml"
        os.mkfifo(fifo)
        done, _ = child("gate", "--db", str(tmp_path / "m"), "--thresholds", str(fifo))
        assert_usage_error(done, f"{fifo}: the thresholds file is a FIFO (named pipe), not a regular file")

    @pytest.mark.parametrize(
        "args, what",
        [
            (["gate", "--db", "m", "--thresholds", "zero"], "thresholds file"),
            (["loss", "--loss-from", "zero"], "--loss-from config"),
            (["loss", "--loss", "zero"], "loss file"),
            (["replay", "x.parquet", "--db", "m", "--loss-from", "zero"], "--loss-from config"),
        ],
    )
    def test_dev_zero_behind_a_symlink_is_refused_in_bounded_memory(self, tmp_path, args, what):
        (tmp_path / "zero").symlink_to("/dev/zero")
        (tmp_path / "x.parquet").touch()
        done, peak = child(*args, cwd=tmp_path)
        assert_usage_error(done, f"zero: the {what} is a character device, not a regular file")
        assert peak < 256, f"{peak:.0f} MiB"  # 1.5 GB within 2 s before

    @pytest.mark.parametrize(
        "flag, what", [("--thresholds", "thresholds file"), ("--loss-from", "--loss-from config")]
    )
    def test_a_file_past_1_mib_is_refused_reading_no_more(self, tmp_path, flag, what):
        big = tmp_path / "big"
        with big.open("wb") as f:
            f.truncate(4 << 30)  # sparse: 4 GiB of zeros on no disk
        args = ["gate", "--db", "m", flag, str(big)] if flag == "--thresholds" else ["loss", flag, str(big)]
        done, peak = child(*args, cwd=tmp_path)
        assert_usage_error(done, f"{big}: the {what} is larger than 1 MiB, the bound on a {what}")
        assert peak < 256, f"{peak:.0f} MiB"

    def test_a_yaml_alias_bomb_is_refused_before_it_is_built(self, tmp_path):
        """1 KB: nine levels of nine aliases at eps_clip, 9^9 strings once expanded (30 s and ~1 GB
        before: the value's repr was built before its type was checked)."""
        levels = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
        bomb = write(tmp_path / "bomb.yaml", "\n".join(levels) + "\nactor:\n  eps_clip: *a8\n")
        assert bomb.stat().st_size < 1024
        done, peak = child("loss", "--loss-from", str(bomb))
        assert_usage_error(
            done, f"{bomb}: holds more than 1,000,000 values once its YAML aliases are expanded"
        )
        assert peak < 256, f"{peak:.0f} MiB"

    def test_aliases_of_real_configs_still_load(self, tmp_path):
        """Anchors and merge keys as NeMo-RL's configs use them (`<<: *POLICY_BASE`)."""
        text = "base: &base {ratio_clip_min: 0.1, ratio_clip_max: 0.3}\n"
        text += "loss_fn:\n  <<: *base\n  use_cispo: false\n"
        result = run("loss", "--loss-from", str(write(tmp_path / "nemo.yaml", text)))
        assert result.exit_code == EXIT_OK and "clip [0.9, 1.3]" in result.output, result.output

    @pytest.mark.parametrize(
        "text, says",
        [
            ("actor:\n  eps_clip: &x [*x]\n", "a YAML alias inside its own anchor"),
            ("actor:\n  eps_clip: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
            ("actor:\n  eps_clip: " + "9" * 5000 + "\n", "cannot read the --loss-from config as YAML"),
            ("actor:\n  eps_clip: !!python/object/apply:os.system ['true']\n",
             "could not determine a constructor"),
            ("actor:\n  eps_clip: '" + "x" * 100_000 + "'\n", "actor.eps_clip: 'xxx"),
            ("actor:\n  eps_clip: [1, 2]\n", "actor.eps_clip: a list of 2 items must be a number"),
            ("actor:\n  ? [a, b]\n  : 1\n", "cannot read the --loss-from config as YAML"),
        ],
    )  # fmt: skip
    def test_hostile_yaml_is_a_usage_error_with_a_short_message(self, tmp_path, text, says):
        result = run("loss", "--loss-from", str(write(tmp_path / "hostile.yaml", text)))
        assert_usage_error(result, says)
        assert len(result.output) < 1000

    def test_a_dump_line_past_the_bound_fails_its_file_alone_in_bounded_memory(self, repo_root, tmp_path):
        """One 1 GiB line (sparse) beside a good NeMo-RL file: 2 GB before (the line was held whole)."""
        dump = tmp_path / "dump"
        dump.mkdir()
        shutil.copy(repo_root / "fixtures/importers/nemo-rl/train_data_step1.jsonl", dump)
        huge = dump / "train_data_step2.jsonl"
        with huge.open("wb") as f:
            f.write(b'{"token_ids": [')
            f.seek(1 << 30)
            f.write(b"]}\n")
        done, peak = child("import", "nemo-rl", str(dump), "--out", str(tmp_path / "logs"), "--run-id", "r")
        assert done.returncode == EXIT_FINDINGS, done.stdout + done.stderr
        assert f"{huge}: failed: line 1 is longer than 64 MiB, the bound on one line" in done.stdout
        assert "1 of 2 files imported" in done.stdout and "Traceback" not in done.stderr
        assert [p.name for p in (tmp_path / "logs").iterdir()] == ["r-train_data_step1.parquet"]
        assert peak < 448, f"{peak:.0f} MiB"

    @pytest.mark.parametrize(
        "fmt, folder, name",
        [
            ("nemo-rl", "nemo-rl", "train_data_step3.jsonl"),
            ("prime-rl", "prime-rl/token_exports", "step_3/rank_0.jsonl"),
            ("slime", "slime", "train_data/9.pt"),
            ("skyrl", "skyrl/dumped_data", "global_step_9_training_input.pkl"),
        ],
    )
    def test_a_fifo_among_dumps_fails_alone(self, repo_root, tmp_path, fmt, folder, name):
        dump = tmp_path / "dump"
        shutil.copytree(repo_root / "fixtures/importers" / folder.split("/")[0], dump,
                        ignore=shutil.ignore_patterns("*.py", "force_on_policy"))  # fmt: skip
        fifo = dump / "/".join(folder.split("/")[1:]) / name
        fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(fifo)
        extra = ["--trust-pickle"] if fmt == "skyrl" else []
        done, _ = child("import", fmt, str(dump), "--out", str(tmp_path / "logs"), "--run-id", "r", *extra)
        assert done.returncode == EXIT_FINDINGS, done.stdout + done.stderr
        assert f"{fifo}: failed: the " in done.stdout and "is a FIFO (named pipe)" in done.stdout


FLAGS = {
    "--eps-low": lambda x: 0 < x < 1,  # under the default loss, PPO
    "--eps-high": lambda x: x > 0,
    "--bound": lambda x: x > 0,
}


@settings(max_examples=80, deadline=None)
@given(flag=st.sampled_from(sorted(FLAGS)), value=st.floats() | st.integers(-5, 5) | st.text(max_size=8))
def test_every_value_of_a_loss_flag_is_accepted_iff_in_range(flag, value):
    text = str(value)
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    result = run("loss", flag, text)
    if math.isfinite(number) and FLAGS[flag](number):
        assert result.exit_code == EXIT_OK, result.output
    else:
        assert result.exit_code == EXIT_USAGE and flag in result.output and "Traceback" not in result.output


VALUES = st.one_of(
    st.none(), st.booleans(), st.floats(), st.integers(), st.integers(-(10**400), 10**400),
    st.text(max_size=20), st.lists(st.floats(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_every_value_of_a_config_number_is_read_iff_a_number_in_range(tmp_path, value):
    """AReaL's eps_clip: null takes the default; a finite number in (0, 1) is read; anything else (a
    bool, a string, a list, NaN, inf, an integer past float's range) is exit 2 naming the key."""
    path = write(tmp_path / "areal.yaml", yaml.safe_dump({"actor": {"eps_clip": value}}))
    result = run("loss", "--loss-from", str(path))
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if value is None or (number and abs(value) < 2 and 0 < value < 1):
        assert result.exit_code == EXIT_OK, result.output
    else:
        assert_usage_error(result, f"{path}: actor.eps_clip: ")
        assert len(result.output) < 500
