"""Local steps: a worker trains its own copy for H steps (or E epochs) and pushes the model delta.

The delta is ``theta_pulled - theta_after`` in float32, the sign of a gradient, so every
compressor, error feedback and every rule that takes a model delta (``UpdateRule.takes_model_delta``)
treat it as they treat one gradient. Plain SGD on the client, as FedAvg's clients do:
``theta <- theta - eta_l * g`` per mini-batch, the batches drawn by the worker's seeded sampler.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from emulator.runtime.config import LocalConfig

Gradient = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[float, np.ndarray]]


def steps_per_push(local: LocalConfig, shard_size: int, batch_size: int) -> int:
    """H: ``steps``, or ``epochs`` passes over the shard in the sampler's whole batches."""
    if local.steps is not None:
        return local.steps
    return local.epochs * max(1, shard_size // max(1, min(batch_size, shard_size)))


def local_delta(params: np.ndarray, gradient: Gradient, batches: Callable[[], tuple[np.ndarray, np.ndarray]],
                steps: int, learning_rate: float) -> tuple[np.ndarray, float]:
    """``steps`` of SGD from ``params`` (left as it was): the delta ``params - theta_after`` and the mean loss."""
    rate = np.float32(learning_rate)
    theta = np.array(params, np.float32, copy=True)
    loss = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            x, y = batches()
            step_loss, grad = gradient(theta, x, y)
            theta -= rate * np.asarray(grad, np.float32)
            loss += float(step_loss)
        return params - theta, loss / max(1, steps)


__all__ = ["steps_per_push", "local_delta"]
