"""The engine floor's own verdict (DOMAIN.md 3d): at staleness 0 every estimate is `behave_logp`, so the
decision figures there measure the inference engine against the trainer, judged against their bounds, with
verl's and NeMo-RL's reference lines for the drift."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.figures import Observed, Outcome, shown

VERL_NORMAL, VERL_PROBLEM = 0.005, 0.01
"""verl's FAQ: a mean |p_rollout - p_train| below 0.005 is normal, above 0.01 a precision problem."""
NEMO_RL_FLAG = 1.05
"""NeMo-RL flags a mean exp(|logp_gen - logp_train|) above 1.05."""
JUDGED = ("gradient_mass_error", "clip_flip_rate")
"""The floor's figures judged against a bound (the others are reported)."""


def verl_reading(prob_drift: float | None) -> str:
    """verl's reading of a mean prob_drift: normal, above normal, or a precision problem."""
    if prob_drift is None:
        return "unmeasured"
    return (
        "normal" if prob_drift < VERL_NORMAL
        else "a precision problem" if prob_drift > VERL_PROBLEM
        else "above normal"
    )  # fmt: skip


@dataclass(frozen=True)
class FloorVerdict:
    """A run's engine floor (the view `engine_floor`: `rollout`'s figures at staleness 0 and the drift there,
    by name) judged against `bounds` (a max per judged figure: the thresholds' floor checks, else the
    tolerance). `figures` is empty when no token at staleness 0 has prox_logp."""

    figures: dict[str, Observed]
    bounds: dict[str, float]

    def _outcomes(self) -> list[Outcome]:
        return [
            self.figures[name].judge(bound, "max")
            for name, bound in self.bounds.items()
            if name in self.figures and self.figures[name].measured
        ]

    @property
    def outcome(self) -> Outcome:
        """fail, else inconclusive, else pass, else unmeasured (no figure measured)."""
        found = self._outcomes()
        return next((o for o in ("fail", "inconclusive", "pass") if o in found), "unmeasured")

    @property
    def over(self) -> bool:
        """Whether the point of a judged figure is beyond its bound."""
        return any(
            self.figures[name].value > bound
            for name, bound in self.bounds.items()
            if name in self.figures and self.figures[name].measured
        )

    @property
    def word(self) -> str:
        """The verdict as a verb phrase: passes or fails the tolerance, at 95% or, when the interval
        straddles it, by the point estimate."""
        if self.outcome == "inconclusive":
            verb = "fails" if self.over else "passes"
            return f"{verb} the tolerance by its point estimate, inconclusive at 95%"
        return {"fail": "fails", "pass": "passes"}[self.outcome] + " the tolerance"

    def sentence(self, run_id: str) -> str:
        """The floor's verdict in words, with its figures, intervals and the reference lines."""
        if self.outcome == "unmeasured":
            return f"Engine floor of run {run_id}: not measured (no token at staleness 0 has prox_logp)."
        f = self.figures
        gme, flips = f["gradient_mass_error"], f["clip_flip_rate"]
        moves = f"the inference engine alone moves {gme.format()} of the gradient mass"
        if flips.measured:
            moves += f" and flips {flips.format()} of the clip decisions"
        tolerance = " and ".join(dict.fromkeys(shown(b, "percent", exact=True) for b in self.bounds.values()))
        text = (
            f"Engine floor of run {run_id}: {self.word}: at staleness 0, where every estimate is "
            f"behave_logp, {moves} (tolerance {tolerance})"
        )
        drift, exp = f.get("prob_drift", Observed(None)), f.get("exp_abs_drift", Observed(None))
        if drift.measured:
            text += f"; mean prob_drift {drift.value:.4f} (verl: {verl_reading(drift.value)})"
        if exp.measured:
            flagged = "flagged" if exp.value > NEMO_RL_FLAG else "not flagged"
            text += f", exp_abs_drift {exp.value:.4f} ({flagged} by NeMo-RL)"
        advice = " Fix the engine's precision before blaming the approximation." if self.over else ""
        return f"{text}.{advice}"
