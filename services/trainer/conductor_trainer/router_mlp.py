"""The networks of the router's ``mlp`` head, trained in torch; the router file keeps their
weights and serving runs them in numpy.

One network reads what the logistic heads read (the domain chances, the embedding, the
standardised text features) and has one output per worker: input dropout, Linear to
MLP_HIDDEN units, GELU, dropout, Linear to the workers, the output bias starting at the logit
of each worker's share of right answers. It learns each worker's share of right answers (binary
cross-entropy on the share, a soft label) where the worker's result is recorded, and nothing
where it is not. Serving averages the chances of MLP_SEEDS networks, each trained from its own
seed. The settings come from an exploratory cross-validation on RouterBench's training split.
``conductor router train --head auto`` chooses between this head and the logistic ones per
table: on RouterBench's training split it chose this one (mean fold area 0.8242 against
0.8231), on RouterDC's the logistic heads (accuracy 0.5295 against 0.5289).

Reproducible: each network is seeded (its initial weights, dropout and batch order), inside a
forked random state, so the caller's torch random state is left as it was, and two trainings on
one machine give the same weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from conductor.errors import ConfigurationError
from conductor_router import MlpWeights

if TYPE_CHECKING:
    import torch

# Only training the mlp head needs torch (serving runs its networks in numpy): the router
# extra leaves it out, the CPU build is enough.
TORCH_INSTALL = "pip install torch"
MLP_HIDDEN = 64
MLP_INPUT_DROPOUT = 0.1
MLP_DROPOUT = 0.3
MLP_LR = 1e-3
MLP_WEIGHT_DECAY = 0.1
MLP_EPOCHS = 20
MLP_BATCH = 256
MLP_SEEDS = (0, 1, 2)
# A worker right (or wrong) on every training item starts its bias at the logit of this (or of
# one minus it), not at infinity.
RATE_FLOOR = 0.01


class TorchMlpFitter:
    """``conductor_router``'s MlpFitter: MLP_SEEDS networks, trained as the module says."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {
            "hidden": MLP_HIDDEN,
            "activation": "gelu",
            "input_dropout": MLP_INPUT_DROPOUT,
            "dropout": MLP_DROPOUT,
            "optimizer": "AdamW",
            "lr": MLP_LR,
            "weight_decay": MLP_WEIGHT_DECAY,
            "epochs": MLP_EPOCHS,
            "batch": MLP_BATCH,
            "seeds": list(MLP_SEEDS),
            "loss": "binary cross-entropy on each recorded share of right answers",
        }

    def __call__(
        self, inputs: npt.NDArray[np.float64], right: npt.NDArray[np.float64]
    ) -> list[MlpWeights]:
        return [fit_network(inputs, right, seed) for seed in MLP_SEEDS]


def build_network(inputs: int, workers: int) -> torch.nn.Sequential:
    """An untrained network (weights from torch's current random state)."""
    from torch import nn

    return nn.Sequential(
        nn.Dropout(MLP_INPUT_DROPOUT),
        nn.Linear(inputs, MLP_HIDDEN),
        nn.GELU(),
        nn.Dropout(MLP_DROPOUT),
        nn.Linear(MLP_HIDDEN, workers),
    )


def network_weights(network: torch.nn.Sequential) -> MlpWeights:
    """The two Linear layers' weights, as the router file keeps them (float32)."""
    hidden, output = _linear(network, 1), _linear(network, 4)

    def array(tensor: torch.Tensor) -> npt.NDArray[np.float32]:
        return tensor.detach().cpu().numpy().astype(np.float32)

    return MlpWeights(
        array(hidden.weight), array(hidden.bias), array(output.weight), array(output.bias)
    )


def fit_network(
    inputs: npt.NDArray[np.float64], right: npt.NDArray[np.float64], seed: int
) -> MlpWeights:
    """One network trained on ``inputs`` (items, inputs) and ``right`` (items, workers: shares
    of right answers, NaN where not recorded), from ``seed``."""
    torch = _torch()
    known = ~np.isnan(right)
    counts = known.sum(axis=0)
    rates = np.where(known, right, 0.0).sum(axis=0) / np.maximum(counts, 1)
    rates = np.clip(np.where(counts > 0, rates, 0.5), RATE_FLOOR, 1 - RATE_FLOOR)
    x = torch.as_tensor(inputs, dtype=torch.float32)
    y = torch.as_tensor(np.where(known, right, 0.0), dtype=torch.float32)
    mask = torch.as_tensor(known, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network = build_network(x.shape[1], y.shape[1])
        with torch.no_grad():
            _linear(network, 4).bias.copy_(torch.as_tensor([math.log(r / (1 - r)) for r in rates]))
        optimizer = torch.optim.AdamW(
            network.parameters(), lr=MLP_LR, weight_decay=MLP_WEIGHT_DECAY
        )
        order = torch.Generator().manual_seed(seed)
        network.train()
        for _ in range(MLP_EPOCHS):
            for batch in torch.randperm(len(x), generator=order).split(MLP_BATCH):
                weight = mask[batch]
                if not weight.any():
                    continue
                losses = torch.nn.functional.binary_cross_entropy_with_logits(
                    network(x[batch]), y[batch], reduction="none"
                )
                loss = (losses * weight).sum() / weight.sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        network.eval()
    return network_weights(network)


def _linear(network: torch.nn.Sequential, index: int) -> torch.nn.Linear:
    return cast("torch.nn.Linear", network[index])


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ConfigurationError(
            f"the router's mlp head is trained with torch: `{TORCH_INSTALL}` (or train with "
            "--head logistic)"
        ) from exc
    return torch
