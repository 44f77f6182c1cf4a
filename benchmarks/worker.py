"""Worker-side costs for the paper's CNN: one gradient step, compression, encoding, and their floors.

Floors: a batch-10 gradient step of the same model on one core (what compression must stay
small beside) and a plain copy of the gradient (the memory-bandwidth floor of any pass over it).
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.common import cnn_layout, measure

METHODS = {
    "topk c=1% (adacomp, comp_c)": ("topk", {"c": 0.01}),
    "topk c=0.1%": ("topk", {"c": 0.001}),
    "dense (asgd)": ("dense", {}),
}


def gradient_of_the_cnn(threads: int = 1):
    """A real gradient of the paper's CNN on real digits, and the step's timing."""
    from emulator import datasets
    from emulator.runtime.data import standardize
    from emulator.runtime.models import TFModel, get, initial_parameters

    data = datasets.load("mnist-5k")
    x = standardize(data.x_train[:10])
    y = data.y_train[:10].astype(np.int32)
    model = TFModel(get("mnist_cnn"), x.shape[1:], 10, threads)
    params = initial_parameters(model.layout, 0)
    model.warm_up(params, x, y)
    _, grad = model.gradient(params, x, y)
    step = measure(lambda: model.gradient(params, x, y), repeat=100)
    return grad, step


def run(quick: bool = False) -> dict:
    import compression

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    layout = cnn_layout()
    grad, step = gradient_of_the_cnn()
    splits = np.split(grad, np.array(layout.offsets[1:]))
    repeat = 30 if quick else 200
    copy = measure(lambda: grad.copy(), repeat=repeat)
    out = {"parameters": layout.total, "gradient_step_ms": step, "gradient_copy_ms": copy, "methods": {}}
    for label, (name, params) in METHODS.items():
        comp = compression.build(name, params, layout)
        parts = comp.compress(splits)
        message = compression.encode(parts, layout)
        select = measure(lambda: comp.compress(splits), repeat=repeat)
        encode = measure(lambda: compression.encode(parts, layout), repeat=repeat)
        both = measure(lambda: compression.encode(comp.compress(splits), layout), repeat=repeat)
        out["methods"][label] = {
            "compress_ms": select, "encode_ms": encode, "compress_encode_ms": both, "message_bytes": len(message),
            "share_of_gradient_step": both["median_ms"] / step["median_ms"],
            "times_copy_floor": both["median_ms"] / copy["median_ms"],
        }
    return out


def markdown(result: dict) -> list[str]:
    step = result["gradient_step_ms"]["median_ms"]
    lines = [
        f"Gradient step (batch 10, one core): **{step:.2f} ms**; plain copy of the gradient: "
        f"{result['gradient_copy_ms']['median_ms']:.3f} ms.",
        "",
        "| method | compress + encode (ms) | share of a gradient step | x copy floor | message bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, row in result["methods"].items():
        lines.append(f"| {label} | {row['compress_encode_ms']['median_ms']:.3f} | {row['share_of_gradient_step']:.1%} | "
                     f"{row['times_copy_floor']:.1f} | {row['message_bytes']:,} |")
    return lines
