"""The trainer: offline jobs on the orchestration core (evaluation harness now, GRPO next)."""
