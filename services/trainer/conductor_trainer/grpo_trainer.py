"""TRL's GRPOTrainer, less the work that is repeated or cannot change the weights.

**The shared prompt prefix is computed once per batch when sampling.** Every Conductor prompt
starts with the same system message (the task, the output form, the examples if any): about
900 of the 1,000 tokens of a prompt with the examples, 330 of 430 without. TRL computes each
sample's whole prompt (32 times per step at 4 questions x 8 samples), and on a CPU that
prefill is most of the time spent sampling. Here the prefix's keys and values are computed
once, the rest of each question's prompt once (its 8 samples share it), and both are copied
to every row; each row's own rest of the prompt is padded on its left, so positions (taken
from the attention mask) are the same as without the cache. The tokens sampled follow the same
distribution; only the arithmetic order differs.

**The shared prefix is computed once per optimizer step in the loss too, without gradient.**
Its keys and values are computed once (no graph kept), held read-only, and every row of every
micro-batch of the step attends to them: the weights do not change between the micro-batches
of one step, so the same keys serve them all. Only the rows' own tokens (the question and the
sampled plan) run with gradients. The cost: the shared system prompt's own keys and values
get no gradient (the gradient reaches the weights through the rows' tokens only). A read-only
cache also lets activation checkpointing recompute a layer in the backward pass (the replay
reads the same prefix; a growing cache would append the rows' keys twice), so checkpointing,
where it is on, covers the rows' tokens only.

**The loss runs in micro-batches of whole groups** (TRL's gradient accumulation over one
generation batch): 4 questions x 8 samples are sampled and rewarded together, then go through
the forward and backward passes one question's 8 samples at a time, so the activations held at
once are a quarter of the batch's. TRL shuffles the rows before splitting them; here they stay
in their groups (the order of micro-batches within one optimizer step cannot change the summed
gradient, so this is exact), and a group's rows share their whole prompt: the frozen prefix is
the prompt, and only the sampled plan's tokens run with gradients. Each micro-batch's
completion columns are cut to its longest plan (the rest is padding, masked out). The loss is
the same: each micro-batch's mean over its sequences, over the number of micro-batches.

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

import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
            )
            if not plain:
                if not hasattr(self, "_frozen_prefix"):
                    self._frozen_prefix = FrozenPrefix()
                with self.accelerator.autocast():
                    shared = per_token_logps_with_shared_prefix(
                        model,
                        input_ids,
                        attention_mask,
                        logits_to_keep,
                        compute_entropy=compute_entropy,
                        prefix=self._frozen_prefix,
                        step=self.state.global_step,
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

        def _prepare_inputs(self, generation_batch: Any) -> Any:
            module: Any = sys.modules[trl.GRPOTrainer.__module__]
            keep_groups = (
                self.model.training
                and self.num_iterations == 1
                and self.args.steps_per_generation == self.args.gradient_accumulation_steps
                and hasattr(module, "shuffle_sequence_dict")
            )
            if not keep_groups:
                return super()._prepare_inputs(generation_batch)
            shuffle = module.shuffle_sequence_dict
            module.shuffle_sequence_dict = _in_order  # rows stay in their groups
            try:
                return super()._prepare_inputs(generation_batch)
            finally:
                module.shuffle_sequence_dict = shuffle

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
            if moving.numel() == batch:  # every row: only the padding columns go
                return super()._compute_loss(model, select_samples(inputs, moving))
            # With nothing to learn one sample still runs (its loss is 0), so the graph, the
            # optimizer step and TRL's per-step metrics stay as they are.
            kept = moving if moving.numel() else torch.zeros(1, dtype=torch.long)
            loss = super()._compute_loss(model, select_samples(inputs, kept.to(advantages.device)))
            return loss * (moving.numel() / batch)

    return ConductorGRPOTrainer


def _in_order(batch: dict[str, Any]) -> dict[str, Any]:
    """In place of TRL's shuffle of a generation batch: the rows as sampled, each question's
    samples together."""
    return batch


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


class FrozenPrefix:
    """The keys and values of a prompt prefix, computed without gradient once per optimizer
    step and handed out read-only (``read_only_cache``) to every micro-batch of that step."""

    def __init__(self) -> None:
        self._key: tuple[int, tuple[int, ...]] | None = None
        self._layers: list[tuple[Any, Any]] = []
        self.computed = 0  # how many times a prefix was run (tests read it)

    def cache(self, model: Any, prefix_ids: Any, *, step: int) -> Any:
        import torch

        key = (step, tuple(prefix_ids[0].tolist()))
        if key != self._key:
            with torch.no_grad():
                output = model(input_ids=prefix_ids, use_cache=True)
            cache = output.get("cache") or output.get("past_key_values")
            self._layers = [(layer.keys, layer.values) for layer in cache.layers]
            self._key = key
            self.computed += 1
        return read_only_cache(model, self._layers)


def read_only_cache(model: Any, layers: list[tuple[Any, Any]]) -> Any:
    """A KV cache holding ``layers``' keys and values (one row, read by every row of a batch:
    expanded, not copied) that a forward pass reads but never grows: each layer attends to the
    prefix followed by its own keys, and a layer run twice (activation checkpointing's replay)
    sees the same."""
    import torch
    from transformers import DynamicCache

    class ReadOnlyCache(DynamicCache):
        def update(
            self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
        ) -> tuple[Any, Any]:
            layer: Any = self.layers[layer_idx]  # a DynamicLayer: the config's full attention
            width = key_states.size(0)
            keys = layer.keys.expand(width, -1, -1, -1).to(key_states.dtype)
            values = layer.values.expand(width, -1, -1, -1).to(value_states.dtype)
            return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)

    return ReadOnlyCache(ddp_cache_data=layers, config=model.config)


@contextmanager
def checkpointing_reads_the_cache(model: Any) -> Iterator[None]:
    """Lets checkpointed decoder layers keep a (read-only) cache: transformers drops the cache
    of a checkpointed layer, since a cache that grows would be written twice by the replay."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # back to the class's own value


def per_token_logps_with_shared_prefix(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    compute_entropy: bool,
    prefix: FrozenPrefix | None = None,
    step: int = 0,
) -> tuple[Any, Any] | None:
    """What TRL's ``_get_per_token_logps_and_entropies`` returns for left-padded prompts
    followed by ``logits_to_keep`` completion columns, with the prompts' shared prefix run
    once without gradient (by ``prefix``, reused within optimizer step ``step``). Each row is
    laid out as [prefix][padding][own prompt tokens][completion]. None when the prompts share
    too short a prefix to gain from it."""
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
    prefix = prefix or FrozenPrefix()
    cache = prefix.cache(model, ids[:1, :shared], step=step)
    with checkpointing_reads_the_cache(model):
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
    """Samples a completion per prompt, computing their first ``shared`` tokens once, and the
    rest of each distinct prompt once (a question's samples share their whole prompt: GRPO
    samples a group per question). Each completion ends at its first end-of-sequence token
    (kept), as TRL's own generation does."""
    import torch

    input_ids, attention_mask = shared_prefix_rows(prompt_ids, shared, pad_token_id=pad_token_id)
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
    rows, width = input_ids.shape
    distinct: dict[tuple[int, ...], int] = {}
    copy_of = [distinct.setdefault(tuple(ids), len(distinct)) for ids in prompt_ids]
    if len(distinct) == rows or width - 1 <= shared:
        cache = prefix_cache(model, input_ids[:1, :shared], rows)
    else:
        # The prefix once, each distinct prompt's own tokens (all but its last: generate needs
        # one token not in the cache) once, then the cache rows copied to every sample.
        firsts = torch.tensor([copy_of.index(i) for i in range(len(distinct))])
        cache = prefix_cache(model, input_ids[:1, :shared], len(distinct))
        mask = attention_mask[firsts, : width - 1]
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        model(
            input_ids=input_ids[firsts, shared : width - 1],
            attention_mask=mask,
            position_ids=positions[:, shared:],
            use_cache=True,
            **{cache_keyword(model): cache},
        )
        cache.batch_select_indices(torch.tensor(copy_of, device=input_ids.device))
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
