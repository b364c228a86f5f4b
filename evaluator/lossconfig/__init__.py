"""The loss a trainer runs, read from where the user has it: a named preset of a trainer's defaults
(`presets`), proxaudit's own TOML file (`toml_file`), or the trainer's experiment config (`areal`, `verl`
with NeMo-RL's, `others`: prime-rl's and TRL's), each saying which keys it used and which it ignored.
`resolve` picks one and applies the command line's shorthands (`--eps-low`, `--bound`, ...).

Every key of the sections read must be one of the trainer's own at a pinned commit (`known`); every
number is within the range its loss parameter allows; every file is bounded (`evaluator.inputs`).

May import: the base (errors, inputs) and `evaluator.formulas` (the `Loss` it builds)."""

from evaluator.lossconfig.resolve import LossChoice, resolve

__all__ = ["LossChoice", "resolve"]
