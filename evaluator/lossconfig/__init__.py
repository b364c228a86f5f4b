"""The loss a trainer runs, read from where the user has it: a named preset of a trainer's defaults
(`presets`), proxaudit's own TOML file (`toml_file`), or the trainer's experiment config (`areal`, `verl`
with NeMo-RL's, `others`: prime-rl's and TRL's), each saying which keys it used and which it ignored.
`resolve` picks one and applies the command line's shorthands (`--eps-low`, `--bound`, ...).

May import: the base (errors) and `evaluator.formulas` (the `Loss` it builds)."""

from evaluator.lossconfig.resolve import LossChoice, resolve

__all__ = ["LossChoice", "resolve"]
