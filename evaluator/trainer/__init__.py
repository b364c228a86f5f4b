"""The reference trainer: a small asynchronous decoupled-PPO trainer that really trains, recorded by the
token log hook, to make realistic logs for fixtures, tests and the demo.

`train` (the loop and its `Args`), `results` (its curves, progress line and report), `engine` (the
inference engine: bf16 weights, abort-resume, proximal_t), `policy` (a tiny transformer and
SmolLM2-135M-Instruct), `tasks` (verifiable rewards); `synthetic`, logs drawn from a model of drift
(no training) for the benches and tests; and `simulated_run`, a process writing them at intervals with a
drift planted from some step (what `proxaudit watch` is tested and benchmarked on).

May import: the hook, `evaluator.formulas` (for AReaL's loglinear), the base modules and `schemas`;
nothing downstream of the hook.
"""
