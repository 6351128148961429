"""The bundled family's model card renders from its stored measurements, and quotes the draft's distillation."""

import json

from engine.models.loading import RESOURCES
from engine.train.loop.card import render_card

MODELS = RESOURCES / "models"


def test_card_quotes_the_drafts_distillation_only_when_it_happened():
    training = json.loads((MODELS / "training.json").read_text())
    evaluation = json.loads((MODELS / "evaluation.json").read_text())
    evaluation.pop("draft_distillation", None)
    assert "distilled from the target" not in render_card(training, evaluation)
    evaluation["draft_distillation"] = {
        "steps": 12,
        "tokens": 24576,
        "wall_seconds_this_run": 120.0,
        "heldout_top1_agreement_before": 0.378,
        "heldout_top1_agreement": 0.5,
    }
    card = render_card(training, evaluation)
    assert "went on for 12 steps (24,576 tokens) distilled from the target" in card
    assert "from 0.378 to 0.500" in card and "--from draft --steps 12" in card
    assert "train draft --target runs/demo/target --from runs/demo/draft --steps 12" in card
