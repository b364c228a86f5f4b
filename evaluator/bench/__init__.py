"""Benchmarks that print figures (BENCHMARKS.md has the commands and results): `replay` (`proxaudit
bench`: replay against a bare scan), `folder` (a folder locally and on Ray), `hook` (the hook's cost in
the reference trainer), `readers` (readers during a replay), `watch` (`proxaudit watch` following a
simulated run).

May import anything below the CLI."""
