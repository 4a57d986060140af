"""The GRPO trainer that leaves zero-advantage samples out of the loss: same loss, same gradient."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conductor_trainer.grpo_trainer import select_samples


def batch_inputs(advantages: list[float], completion_lengths: list[int]) -> dict[str, Any]:
    """What TRL hands ``_compute_loss``: left-padded prompts, right-padded completions."""
    import torch

    generator = torch.Generator().manual_seed(0)
    size, width = len(advantages), max(completion_lengths) + 3  # 3 columns of padding for all
    completion_mask = torch.zeros(size, width, dtype=torch.long)
    for row, length in enumerate(completion_lengths):
        completion_mask[row, :length] = 1
    prompt_mask = torch.ones(size, 6, dtype=torch.long)
    prompt_mask[0, :2] = 0  # a shorter prompt
    return {
        "prompt_ids": torch.randint(3, 250, (size, 6), generator=generator),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(3, 250, (size, width), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }


def test_selected_samples_keep_their_rows_and_lose_unused_completion_columns() -> None:
    import torch

    inputs = batch_inputs([0.0, 1.0, 0.0, -1.0], [9, 4, 2, 5])
    kept = select_samples(inputs, torch.tensor([1, 3]))
    assert kept["advantages"].tolist() == [1.0, -1.0]
    assert kept["prompt_ids"].tolist() == inputs["prompt_ids"][[1, 3]].tolist()
    assert kept["completion_ids"].shape == (2, 5)  # the longest kept completion
    assert kept["completion_mask"].sum(dim=1).tolist() == [4, 5]
    assert kept["num_items_in_batch"] is inputs["num_items_in_batch"]  # not per sample


@pytest.fixture(scope="module")
def trainers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """TRL's trainer and ours, over the same tiny model, float32 (exact comparisons)."""
    import datasets  # type: ignore[import-untyped]
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_trainer.grpo_trainer import grpo_trainer_class
    from conductor_trainer.train import TrainOptions, grpo_config

    from fakes.tiny_model import write_tiny_model

    directory = write_tiny_model(tmp_path_factory.mktemp("tiny"))
    out = tmp_path_factory.mktemp("out")
    # Built by whichever test of the module runs first: transformers' rename warning is the
    # fixture's own, not that test's.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated", FutureWarning)
        args = grpo_config(
            TrainOptions(suites=["gsm8k"], out=out, questions_per_step=2, precision="fp32"),
            trl,
            use_cpu=True,
        )
    made = []
    for trainer_class in (trl.GRPOTrainer, grpo_trainer_class(trl)):
        made.append(
            trainer_class(
                model=AutoModelForCausalLM.from_pretrained(str(directory)),
                reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                args=args,
                train_dataset=datasets.Dataset.from_list([{"prompt": "p"}] * 8),
                processing_class=AutoTokenizer.from_pretrained(str(directory)),
            )
        )
    for trainer in made:
        trainer.current_gradient_accumulation_steps = 1  # set by train(), which is not run
    return made[0], made[1]


def loss_and_gradient(trainer: Any, inputs: dict[str, Any]) -> tuple[float, Any]:
    import torch

    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    gradient = torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
            for p in trainer.model.parameters()
        ]
    )
    return float(loss.detach()), gradient


@pytest.mark.training
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    "advantages",
    [[0.0, 1.2, 0.0, -0.7, 0.0, 0.0, 0.4, -0.9], [0.0] * 8, [0.5, -0.5] * 4],
    ids=["some-zero", "all-zero", "none-zero"],
)
def test_leaving_zero_advantage_samples_out_changes_neither_loss_nor_gradient(
    trainers: tuple[Any, Any], advantages: list[float]
) -> None:
    import torch

    trl_trainer, ours = trainers
    ours.model.load_state_dict(trl_trainer.model.state_dict())
    inputs = batch_inputs(advantages, [9, 4, 2, 5, 7, 1, 3, 8])
    expected_loss, expected_gradient = loss_and_gradient(trl_trainer, inputs)
    loss, gradient = loss_and_gradient(ours, inputs)
    assert loss == pytest.approx(expected_loss, abs=1e-7)
    # Cutting padding columns changes the order of float sums a little, nothing else.
    assert torch.allclose(gradient, expected_gradient, atol=1e-6, rtol=1e-4)
    if any(advantages):
        assert gradient.abs().sum() > 0  # the comparison is not of two zeros
    skipped = ours._metrics["train"]["samples_skipped"][-1]
    assert skipped == pytest.approx(advantages.count(0.0) / len(advantages))


def test_the_shared_prefix_leaves_each_prompt_a_token_of_its_own() -> None:
    from conductor_trainer.grpo_trainer import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 9]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical prompts
    assert shared_prefix_length([[7, 1], [8, 1]]) == 0


@pytest.mark.training
@pytest.mark.parametrize(
    "rows_of_prompt",
    [[0, 1, 2, 3], [0, 0, 0, 1, 1, 1, 2, 2, 2]],
    ids=["distinct-prompts", "groups-of-three"],
)
def test_sampling_with_the_prefix_computed_once_gives_what_plain_sampling_gives(
    tmp_path: Path, rows_of_prompt: list[int]
) -> None:
    """Greedy, so both must pick the same tokens: the same prompts as TRL would pad them whole
    (left padding) and with the shared prefix cached once (and, where samples repeat a prompt
    as GRPO's groups do, each distinct prompt once); prompts of different lengths."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from conductor_trainer.grpo_trainer import generate_with_shared_prefix, shared_prefix_length

    from fakes.tiny_model import write_tiny_model

    directory = write_tiny_model(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(str(directory)).eval()
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 250, (40,), generator=generator).tolist()
    distinct = [
        prefix + torch.randint(3, 250, (length,), generator=generator).tolist()
        for length in (5, 1, 9, 5)
    ]
    prompts = [distinct[i] for i in rows_of_prompt]
    config = GenerationConfig(
        max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=[2], bos_token_id=1
    )
    width = max(len(p) for p in prompts)
    padded = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        plain = model.generate(input_ids=padded, attention_mask=mask, generation_config=config)
        shared = generate_with_shared_prefix(
            model,
            prompts,
            shared_prefix_length(prompts),
            generation_config=config,
            pad_token_id=0,
            eos_token_ids=[2],
        )
    expected = []
    for row in plain[:, width:].tolist():
        expected.append(row[: row.index(2) + 1] if 2 in row else row)
    assert shared == expected
    assert all(len(row) > 0 for row in shared)


def shared_prefix_batch(own_lengths: list[int], completion_lengths: list[int]) -> Any:
    """Left-padded prompts that share a 40-token prefix, then right-padded completions."""
    import torch

    generator = torch.Generator().manual_seed(2)
    prefix = torch.randint(3, 250, (40,), generator=generator).tolist()
    prompts = [
        prefix + torch.randint(3, 250, (n,), generator=generator).tolist() for n in own_lengths
    ]
    width = max(map(len, prompts))
    completion_width = max(completion_lengths) + 2
    ids = torch.zeros((len(prompts), width + completion_width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (prompt, length) in enumerate(zip(prompts, completion_lengths, strict=True)):
        ids[row, width - len(prompt) : width] = torch.tensor(prompt)
        mask[row, width - len(prompt) : width] = 1
        ids[row, width : width + length] = torch.randint(3, 250, (length,), generator=generator)
        mask[row, width : width + length] = 1
    return ids, mask, completion_width


@contextmanager
def prefix_keys_and_values_detached(model: Any, prefix_columns: Any) -> Iterator[None]:
    """TRL's own forward pass with the keys and values of the shared prefix's positions cut from
    the graph in every layer: what the loss computes when the prefix runs without gradient
    (the prefix's hidden states reach the rows' tokens through its keys and values only)."""
    import torch

    def detach_prefix(_: Any, __: Any, output: Any) -> Any:
        return torch.where(prefix_columns[..., None], output.detach(), output)

    handles = [
        module.register_forward_hook(detach_prefix)
        for name, module in model.named_modules()
        if name.endswith(("k_proj", "v_proj"))
    ]
    assert handles
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.training
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("checkpointing", [False, True], ids=["checkpointing-off", "on"])
def test_the_loss_with_a_frozen_prefix_matches_trls_log_probs_and_gradient_without_it(
    trainers: tuple[Any, Any], checkpointing: bool
) -> None:
    """Log-probabilities as TRL computes them; the gradient TRL's would be with the prefix's
    keys and values held constant; the same with activation checkpointing (its replay reads the
    prefix a second time) as without."""
    import torch

    from conductor_trainer.checkpointing import set_checkpointing

    trl_trainer, ours = trainers
    ours.model.load_state_dict(trl_trainer.model.state_dict())
    own = [5, 1, 9, 3]
    ids, mask, keep = shared_prefix_batch(own, [7, 2, 4, 7])
    prompt_width = ids.size(1) - keep
    prefix_columns = torch.zeros(ids.shape, dtype=torch.bool)
    for row, length in enumerate(own):
        start = prompt_width - 40 - length
        prefix_columns[row, start : start + 40] = True
    results = []
    for trainer in (trl_trainer, ours):
        model = trainer.model.train()
        set_checkpointing(model, checkpointing and trainer is ours)
        model.zero_grad()
        if trainer is trl_trainer:
            with prefix_keys_and_values_detached(model, prefix_columns):
                logps, entropies, _ = type(trl_trainer)._get_per_token_logps_and_entropies(
                    trainer, model, ids, mask, keep, compute_entropy=True
                )
        else:
            logps, entropies, _ = type(ours)._get_per_token_logps_and_entropies(
                trainer, model, ids, mask, keep, compute_entropy=True
            )
        completion = mask[:, -keep:].bool()
        (logps[completion].sum() + entropies[completion].sum()).backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((logps[completion].detach(), entropies[completion].detach(), gradient))
        set_checkpointing(model, False)
    (expected_logps, expected_entropies, expected_gradient), (logps, entropies, gradient) = results
    assert torch.allclose(logps, expected_logps, atol=1e-5)
    assert torch.allclose(entropies, expected_entropies, atol=1e-5)
    assert gradient.shape == expected_gradient.shape
    assert torch.allclose(gradient, expected_gradient, atol=1e-5, rtol=1e-4)
    assert gradient.abs().sum() > 0


@pytest.mark.training
def test_the_prefix_runs_once_per_optimizer_step_whatever_the_micro_batches(
    trainers: tuple[Any, Any],
) -> None:
    import torch

    from conductor_trainer.grpo_trainer import FrozenPrefix, per_token_logps_with_shared_prefix

    model = trainers[1].model.eval()
    ids, mask, keep = shared_prefix_batch([5, 1, 9, 3], [7, 2, 4, 7])
    prefix = FrozenPrefix()
    with torch.no_grad():
        whole = per_token_logps_with_shared_prefix(
            model, ids, mask, keep, compute_entropy=False, prefix=prefix, step=3
        )
        halves = [
            per_token_logps_with_shared_prefix(
                model, ids[rows], mask[rows], keep, compute_entropy=False, prefix=prefix, step=3
            )
            for rows in (slice(0, 2), slice(2, 4))
        ]
        assert prefix.computed == 1  # one prefix pass for the step's three batches
        per_token_logps_with_shared_prefix(
            model, ids, mask, keep, compute_entropy=False, prefix=prefix, step=4
        )
        assert prefix.computed == 2  # the weights may have changed: run it again
    assert whole is not None
    assert all(half is not None for half in halves)
    together = torch.cat([half[0] for half in halves if half is not None])
    completion = mask[:, -keep:].bool()
    assert torch.allclose(together[completion], whole[0][completion], atol=1e-5)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_the_loss_runs_in_micro_batches_that_divide_the_batch(tmp_path: Path) -> None:
    import trl

    from conductor.errors import ConfigurationError
    from conductor_trainer.train import TrainOptions, grpo_config

    def config(**options: Any) -> Any:
        return grpo_config(
            TrainOptions(suites=["gsm8k"], out=tmp_path, precision="fp32", **options),
            trl,
            use_cpu=True,
        )

    four_by_eight = config(questions_per_step=4, group_size=8)
    # Sampled and rewarded as one batch of 32, the loss run a group (8 rows) at a time.
    assert four_by_eight.generation_batch_size == 32
    assert four_by_eight.per_device_train_batch_size == 8
    assert four_by_eight.gradient_accumulation_steps == 4
    assert (
        config(questions_per_step=4, group_size=8, loss_micro_batch=32).gradient_accumulation_steps
        == 1
    )
    with pytest.raises(ConfigurationError, match="--loss-micro-batch 5 must divide the batch"):
        config(questions_per_step=4, group_size=8, loss_micro_batch=5)


@pytest.mark.training
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_each_micro_batch_of_the_loss_is_one_questions_group(trainers: tuple[Any, Any]) -> None:
    """TRL shuffles a sampled batch before splitting it into micro-batches; ours keeps each
    question's samples together, so they share their whole prompt (2 questions x 4 samples,
    micro-batches of 4 here)."""
    import torch

    _, ours = trainers
    question_of_row = torch.arange(2).repeat_interleave(4)  # as TRL's sampler orders a batch
    sampled = {"question": question_of_row, "row": torch.arange(8)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ours, "_generate_and_score_completions", lambda _: dict(sampled))
        ours.model.train()
        ours._buffered_inputs = None
        micro_batches = []
        for step in range(2):
            ours._step = step
            micro_batches.append(ours._prepare_inputs([{}] * 8))
    assert [batch["question"].tolist() for batch in micro_batches] == [[0] * 4, [1] * 4]
    rows = [row for batch in micro_batches for row in batch["row"].tolist()]
    assert sorted(rows) == list(range(8))
