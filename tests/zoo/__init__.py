"""The bug zoo: kinds of real bugs in what RL trainers log or compute per token, mined from their issue
trackers and pull requests, each with its citation, the invariant of the token log it breaks, a small
generator that plants it in a clean log (synthetic or a real LM's) and the finding (or file rule) that must
catch it. `tests/test_zoo.py` plants each kind and asserts the finding, with evidence naming the column.
"""
