"""TRL's GRPOTrainer, less the work that is repeated or cannot change the weights.

**The shared prompt prefix is computed once per batch when sampling.** Every Conductor prompt
starts with the same system message (the task, the output form, the examples if any): about
900 of the 1,000 tokens of a prompt with the examples, 330 of 430 without. TRL computes each
sample's whole prompt (32 times per step at 4 questions x 8 samples), and on a CPU that
prefill is most of the time spent sampling. Here the prefix's keys and values are computed
once and copied to every row; each row's own rest of the prompt follows, padded on its left,
so positions (taken from the attention mask) are the same as without the prefix cache. The
tokens sampled follow the same distribution; only the arithmetic order differs.

**The shared prefix is computed once per batch in the loss too**, where activation
checkpointing is off (checkpointing recomputes each layer in the backward pass, which would
append the rows' keys to the shared cache a second time; TRL's own computation runs instead).
The prefix runs once with gradients, its keys and values are copied to every row, and each
row's own tokens attend to them: gradients from every row flow back into the one prefix pass.

**Zero-advantage samples are left out of the loss.** A sample whose advantage is 0 (every
sample of a group rewarded alike: all invalid, all wrong, all right) adds nothing to the
gradient: with no KL term its per-token loss is exactly 0. With the "grpo" loss (each
sequence's mean, then the mean over sequences) the loss of the batch is then (samples kept /
batch) x the loss of the samples kept, exactly. So only those samples go through the forward
and backward pass, and the columns of completion padding that only the dropped samples needed
are cut. Early in training most groups are rewarded alike (a small model writes no valid plan
until it has learnt the format), and such a step costs its sampling and scoring only.

TRL has no option for either (its ``mask_truncated_completions`` and DAPO's dynamic sampling
filter differently, and its generation pads each prompt whole), so the trainer is subclassed
here. Anything else (vLLM, continuous batching, several processes, multimodal inputs, other loss
settings) falls back to TRL's own code untouched.
"""

from __future__ import annotations

from typing import Any

from conductor_trainer.checkpointing import checkpointing_is_on

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
# Below this many shared tokens the prefix cache saves less than its copies cost.
MIN_SHARED_PREFIX = 32


def grpo_trainer_class(trl: Any) -> Any:
    """A GRPOTrainer subclass that samples with the prompts' shared prefix computed once and
    leaves zero-advantage samples out of the loss (see above)."""
    import torch
    from trl.models.utils import unwrap_model_for_generation

    class ConductorGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        def _generate_single_turn(
            self,
            prompt_ids: list[list[int]],
            images: Any,
            multimodal_fields: dict[str, Any],
            num_generations: int,
            has_tool_images: bool = False,
        ) -> tuple[list[list[int]], Any]:
            shared = shared_prefix_length(prompt_ids)
            plain = (
                self.use_vllm
                or getattr(self, "use_transformers_continuous_batching", False)
                or self.accelerator.num_processes > 1
                or images is not None
                or multimodal_fields
                or shared < MIN_SHARED_PREFIX
            )
            if plain:
                return super()._generate_single_turn(  # type: ignore[no-any-return]
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
            with (
                unwrap_model_for_generation(
                    self.model_wrapped,
                    self.accelerator,
                    generation_kwargs=self.generation_kwargs,
                    gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
                ) as model,
                torch.no_grad(),
            ):
                completions = generate_with_shared_prefix(
                    model,
                    prompt_ids,
                    shared,
                    generation_config=self.generation_config,
                    pad_token_id=self._tokenizer.pad_token_id,
                    eos_token_ids=self.eos_token_ids,
                )
            return completions, None

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **multimodal: Any,
        ) -> tuple[Any, Any, Any]:
            plain = (
                compute_aux_loss
                or any(value is not None for value in multimodal.values())
                or (batch_size is not None and batch_size < input_ids.size(0))
                or self.accelerator.num_processes > 1
                or checkpointing_is_on(model)
            )
            if not plain:
                with self.accelerator.autocast():
                    shared = per_token_logps_with_shared_prefix(
                        model,
                        input_ids,
                        attention_mask,
                        logits_to_keep,
                        compute_entropy=compute_entropy,
                    )
                if shared is not None:
                    return (*shared, None)
            return super()._get_per_token_logps_and_entropies(  # type: ignore[no-any-return]
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )

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


def cache_keyword(model: Any) -> str:
    """The name under which this transformers version passes a KV cache to a model."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    parameters = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def prefix_cache(model: Any, prefix_ids: Any, rows: int) -> Any:
    """The keys and values of ``prefix_ids`` (one row), computed once and copied to ``rows``."""
    output = model(input_ids=prefix_ids, use_cache=True)
    cache = output.get("cache") or output.get("past_key_values")
    cache.batch_repeat_interleave(rows)
    return cache


def per_token_logps_with_shared_prefix(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    compute_entropy: bool,
) -> tuple[Any, Any] | None:
    """What TRL's ``_get_per_token_logps_and_entropies`` returns for left-padded prompts
    followed by ``logits_to_keep`` completion columns, with the prompts' shared prefix run
    once. Each row is laid out as [prefix][padding][own prompt tokens][completion]. None
    when the prompts share too short a prefix to gain from it."""
    import torch

    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    prompts = [
        input_ids[row, :prompt_width][attention_mask[row, :prompt_width].bool()].tolist()
        for row in range(rows)
    ]
    shared = shared_prefix_length(prompts)
    if shared < MIN_SHARED_PREFIX:
        return None
    prompt_ids, prompt_mask = shared_prefix_rows(prompts, shared, pad_token_id=0)
    ids = torch.cat([prompt_ids.to(input_ids), input_ids[:, -logits_to_keep:]], dim=1)
    mask = torch.cat([prompt_mask.to(attention_mask), attention_mask[:, -logits_to_keep:]], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-logits_to_keep] = -100
    cache = prefix_cache(model, ids[:1, :shared], rows)
    outputs = model(
        input_ids=ids[:, shared:],
        attention_mask=mask,
        position_ids=positions[:, shared:],
        labels=labels[:, shared:],
        fused_lm_head=True,
        **{cache_keyword(model): cache},
    )
    logps = outputs.log_probs[:, -logits_to_keep:]
    entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
    return logps, entropies


def shared_prefix_rows(
    prompt_ids: list[list[int]], shared: int, *, pad_token_id: int
) -> tuple[Any, Any]:
    """Token ids and attention mask laid out as [shared prefix][padding][own tokens]: the
    prefix at the same columns in every row (so one cached copy serves them all), each row's
    own tokens right-aligned after it. Positions must come from the mask."""
    import torch

    own = [ids[shared:] for ids in prompt_ids]
    width = shared + max(len(tokens) for tokens in own)
    ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    ids[:, :shared] = torch.tensor(prompt_ids[0][:shared])
    mask[:, :shared] = 1
    for row, tokens in enumerate(own):
        ids[row, width - len(tokens) :] = torch.tensor(tokens)
        mask[row, width - len(tokens) :] = 1
    return ids, mask


def shared_prefix_length(prompt_ids: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one of its own (generation
    needs one token not in the cache)."""
    shortest = min(len(ids) for ids in prompt_ids)
    length = 0
    first = prompt_ids[0]
    while length < shortest - 1 and all(ids[length] == first[length] for ids in prompt_ids):
        length += 1
    return length


def generate_with_shared_prefix(
    model: Any,
    prompt_ids: list[list[int]],
    shared: int,
    *,
    generation_config: Any,
    pad_token_id: int,
    eos_token_ids: list[int],
) -> list[list[int]]:
    """Samples a completion per prompt, computing their first ``shared`` tokens once. Each
    completion ends at its first end-of-sequence token (kept), as TRL's own generation does."""

    input_ids, attention_mask = shared_prefix_rows(prompt_ids, shared, pad_token_id=pad_token_id)
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
    rows, width = input_ids.shape
    cache = prefix_cache(model, input_ids[:1, :shared], rows)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=generation_config,
        **{cache_keyword(model): cache},
    )
    completions = []
    eos = set(eos_token_ids)
    for row in output[:, width:].tolist():
        ends = [i for i, token in enumerate(row) if token in eos]
        completions.append(row[: ends[0] + 1] if ends else row)
    return completions
