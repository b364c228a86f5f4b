"""The math of DOMAIN.md as pure functions over arrays: `estimators` (section 2, the proximal log-prob
estimates), `metrics` (section 3, their error metrics, from each estimate's `terms`), `diagnostics` (verl's
rollout_corr series and the trainers' own mismatch series), `loss`, `gradients` and `policies` (sections 3b
and 3c, the loss's decisions and gradient weights; `sequences` the weight w(d) and the tokens' sequences
they share), `sketch` (the quantile sketch's bucket code), `bootstrap` (95% intervals over steps), `trend`
(a figure's slope over steps and the drift test). Here: the array type and the one shape check they share.

May import: numpy, `schemas`, the base's named errors and `evaluator.inputs.Range` (the range a
parameter allows), and each other; nothing that reads or writes a file."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
"""A float64 array, `[n_tokens]` unless said otherwise."""
Flags = NDArray[np.bool_]
"""A boolean array, `[n_tokens]`."""


def check_shapes(**arrays: object) -> None:
    """Raise a ValueError naming every shape when the arrays (scalars broadcast) do not have one shape."""
    shapes = {name: np.shape(a) for name, a in arrays.items()}
    if len({s for s in shapes.values() if s != ()}) > 1:
        raise ValueError(f"{', '.join(shapes)} must have one shape, got {shapes}")
