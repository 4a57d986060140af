"""The trainer: GRPO training of the Conductor (``conductor train``) and training data from
traces (``conductor traces export``), scored with the evaluation harness's items and verifiers."""
