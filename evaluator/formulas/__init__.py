"""The math of DOMAIN.md as pure functions over arrays: `estimators` (section 2, the proximal log-prob
estimates), `metrics` (section 3, their error metrics), `decisions` (section 3b, the loss's clip and bound
decisions and the gradient weights), `sketch` (the quantile sketch's bucket code).

May import: numpy and each other; nothing that reads or writes a file."""
