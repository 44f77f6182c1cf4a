"""Bytes on the wire per kept entry, against the information floor of the index set.

For each tensor the floor of an index set is log2(n choose k) bits; values are 4 bytes
(lossless) or 2 (f16). Frame overhead is the fixed header plus the codec's per-part framing.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.common import cnn_layout, realistic_gradient


def log2_binomial(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def run(quick: bool = False) -> dict:
    import compression
    from compression import elias_fano
    from emulator.runtime import protocol

    layout = cnn_layout()
    grad = realistic_gradient(layout)
    splits = np.split(grad, np.array(layout.offsets[1:]))
    out = {"by_c": {}}
    for c in (0.01, 0.001):
        comp = compression.build("topk", {"c": c}, layout)
        parts = comp.compress(splits)
        k_total = sum(p.entries for p in parts)
        floor_bits = sum(log2_binomial(n, p.entries) for n, p in zip(layout.sizes, parts))
        index_bytes = sum(elias_fano.encoded_size(n, p.entries) for n, p in zip(layout.sizes, parts))
        row = {"kept": k_total, "index_floor_bytes": floor_bits / 8, "index_bytes": index_bytes,
               "index_vs_floor": index_bytes * 8 / floor_bits, "index_bits_per_entry": index_bytes * 8 / k_total}
        for values in ("f32", "f16"):
            message = compression.encode(parts, layout, compression.WireFormat(values=values))
            frame = len(message) + protocol.HEADER.size
            value_bytes = k_total * (4 if values == "f32" else 2)
            row[values] = {"frame_bytes": frame, "value_bytes": value_bytes,
                           "overhead_bytes": frame - value_bytes - index_bytes,
                           "overhead_share": (frame - value_bytes - index_bytes) / frame,
                           "bytes_per_entry": frame / k_total,
                           "ratio_to_dense": (layout.total * 4 + protocol.HEADER.size + 3 + 6 * len(layout)) / frame}
        raw = compression.encode(parts, layout, compression.WireFormat(indices="raw32"))
        row["raw32_frame_bytes"] = len(raw) + protocol.HEADER.size
        out["by_c"][f"c={c:g}"] = row
    return out


def markdown(result: dict) -> list[str]:
    lines = ["| c | kept | index bytes (Elias-Fano) | floor log2 C(n,k) | ratio to floor | bits/index | frame f32 | frame f16 | raw32 frame | overhead share | ratio to dense (f32) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, row in result["by_c"].items():
        lines.append(f"| {c} | {row['kept']:,} | {row['index_bytes']:,} | {row['index_floor_bytes']:,.0f} | {row['index_vs_floor']:.3f} | "
                     f"{row['index_bits_per_entry']:.2f} | {row['f32']['frame_bytes']:,} | {row['f16']['frame_bytes']:,} | "
                     f"{row['raw32_frame_bytes']:,} | {row['f32']['overhead_share']:.2%} | {row['f32']['ratio_to_dense']:.1f}x |")
    return lines
