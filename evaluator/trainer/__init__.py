"""The reference trainer: a small asynchronous decoupled-PPO trainer that really trains, recorded by the
token log hook, to make realistic logs for fixtures, tests and the demo.

`train` (the loop and its `Args`), `engine` (the inference engine: bf16 weights, abort-resume,
proximal_t), `policy` (a tiny transformer and SmolLM2-135M-Instruct), `tasks` (verifiable rewards).
Imports the hook and the estimators (for AReaL's loglinear), nothing downstream of them.
"""
