"""The section "Your trainer's own mismatch figure": what each trainer would log on this run at staleness 0
(NeMo-RL, prime-rl, slime, Miles, SkyRL, OpenRLHF, AReaL, verl), by its own definition, against its
published line, beside proxaudit's engine floor (view `trainer_mismatch`)."""

from __future__ import annotations

import streamlit as st

from dashboard.views.common import Context, load
from evaluator.store.trainers import TrainerFigure, trainer_sentences


def render(ctx: Context) -> None:
    """The sentences, then the table with each figure's definition and source."""
    frame = load(ctx.db, "trainer_mismatch", ctx.run_id)
    st.subheader("Your trainer's own mismatch figure")
    if frame.empty:
        st.info("No token at staleness 0 with prox_logp: no trainer's mismatch figure can be computed.")
        return
    st.caption(
        "Each trainer logs the engine-vs-trainer mismatch on its own scale. Computed here on this run's "
        "tokens at staleness 0 (behave and prox one version), each by its trainer's definition, with the "
        "line the trainer publishes (blank: none)."
    )
    figures = [TrainerFigure(**row) for row in frame.to_dict("records")]
    st.text("\n".join(f"- {sentence}" for sentence in trainer_sentences(figures, runs=False)))
    st.dataframe(frame.drop(columns=["run_id"]), width="stretch", hide_index=True)
