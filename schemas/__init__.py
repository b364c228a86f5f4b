"""Data contracts shared by the hook, the evaluator, the gate and the dashboard. Imports nothing of ours."""
