"""TRL's GRPOTrainer, less the work that cannot change the weights.

A sample whose advantage is 0 (every sample of a group rewarded alike: all invalid, all wrong,
all right) adds nothing to the gradient: with no KL term its per-token loss is exactly 0. With
the "grpo" loss (each sequence's mean, then the mean over sequences) the loss of the batch is
then (samples kept / batch) x the loss of the samples kept, exactly. So only those samples go
through the forward and backward pass, and the columns of completion padding that only the
dropped samples needed are cut. Early in training most groups are rewarded alike (a small
model writes no valid plan until it has learnt the format), and such a step costs its sampling
and scoring only.

TRL has no option for this (its ``mask_truncated_completions`` and DAPO's dynamic sampling
filter differently), so the trainer is subclassed here; any other loss setting falls back to
TRL's own computation untouched.
"""

from __future__ import annotations

from typing import Any

# Inputs laid out per completion token (batch x completion length): cut with the completion.
_PER_COMPLETION_TOKEN = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
# Loss types that normalise each sequence on its own, then average over sequences.
_PER_SEQUENCE_LOSSES = ("grpo", "sapo")


def grpo_trainer_class(trl: Any) -> Any:
    """A GRPOTrainer subclass that skips zero-advantage samples in the loss (see above)."""
    import torch

    class ConductorGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        def _skipping_is_exact(self, advantages: Any) -> bool:
            return bool(
                self.beta == 0.0
                and self.loss_type in _PER_SEQUENCE_LOSSES
                and self.top_entropy_quantile >= 1.0  # a quantile over the batch changes
                and not self.aux_loss_enabled
                and not getattr(self, "_entropy_bonus_enabled", False)
                and advantages.dim() == 1
            )

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            advantages = inputs["advantages"]
            if not self._skipping_is_exact(advantages):
                return super()._compute_loss(model, inputs)
            batch = advantages.size(0)
            moving = torch.nonzero(advantages != 0).flatten()
            # The share of the batch left out of the loss, a metric per step (metrics.jsonl).
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["samples_skipped"].append(1 - moving.numel() / batch)
            if moving.numel() == batch:
                return super()._compute_loss(model, inputs)
            # With nothing to learn one sample still runs (its loss is 0), so the graph, the
            # optimizer step and TRL's per-step metrics stay as they are.
            kept = moving if moving.numel() else torch.zeros(1, dtype=torch.long)
            loss = super()._compute_loss(model, select_samples(inputs, kept.to(advantages.device)))
            return loss * (moving.numel() / batch)

    return ConductorGRPOTrainer


def select_samples(inputs: dict[str, Any], rows: Any) -> dict[str, Any]:
    """The inputs of the samples at ``rows`` only, with completion columns that none of them
    uses cut off (they are padding: masked out of the loss)."""
    import torch

    batch = inputs["advantages"].size(0)
    selected = {
        key: value[rows]
        if isinstance(value, torch.Tensor) and value.dim() and value.size(0) == batch
        else value
        for key, value in inputs.items()
    }
    mask = selected["completion_mask"]
    width = mask.size(1)
    used = int(torch.nonzero(mask.any(dim=0)).max()) + 1 if bool(mask.any()) else 1
    if used < width:
        for key in _PER_COMPLETION_TOKEN:
            value = selected.get(key)
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.size(1) == width:
                selected[key] = value[:, :used]
    return selected
