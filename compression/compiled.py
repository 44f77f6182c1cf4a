"""Compiled loops (numba) for the parameter server's hot path; the numpy code stays the reference.

Why: at hundreds of updates per second the server's time goes to numpy's cost per call and to
passes over whole arrays that one loop does at once. Compiled: a top-k push (dense and sparse
float32 parts) decoded to one flat index array and applied by the rule in one loop each
(:func:`compression.codec.decode_flat`, :meth:`~emulator.runtime.rules.UpdateRule.apply_flat`);
the union of the latest updates' index sets behind a delta pull; a float32 delta read under the
lock and encoded outside it in one loop each; AdaComp's touch counters copied at a pull only
where the model changed since the worker's previous one; and Elias-Fano blocks wherever the
codec meets them. Each loop returns exactly what the numpy code it replaces returns (the tests
compare models, counters and bytes over random inputs), except one traced figure: AdaComp's mean
scale of an update is summed in float64, numpy's in float32 (they agree to about 1e-6); a message the compiled decoder does not
take, malformed or of another kind, goes to the numpy decoder, so rejections keep their reasons.

Off until a process turns it on with :func:`enable`: importing numba costs a process about
180 MB, which the one parameter server can afford and a device cannot; workers stay on numpy.
``EMULATE_COMPILED=0`` keeps the numpy code everywhere (for A/B measurements); without numba
:func:`enable` says so and the numpy code runs.
"""

from __future__ import annotations

import os

import numpy as np

_kernels = None  # the compiled functions, once enable() succeeded
_why_not = "not enabled"


def enable() -> str:
    """Compile (or load from numba's cache) the kernels for this process; returns what runs."""
    global _kernels, _why_not
    if _kernels is not None:
        return describe()
    if os.environ.get("EMULATE_COMPILED", "1") == "0":
        _why_not = "numpy (EMULATE_COMPILED=0)"
        return _why_not
    _seed_cache()
    try:
        from compression import _numba_kernels as kernels
    except ImportError as exc:
        _why_not = f"numpy (numba unavailable: {exc})"
        return _why_not
    kernels.warm_up()
    _kernels = kernels
    return describe()


def _seed_cache() -> None:
    """Where the runtime image compiled the kernels at build (``EMULATE_NUMBA_PREBUILT``), copy that cache
    to numba's own, writable one (``NUMBA_CACHE_DIR``, under the container's /tmp) unless it is there:
    numba only uses a cache folder it can write to, and the image's files are read-only."""
    prebuilt, target = os.environ.get("EMULATE_NUMBA_PREBUILT"), os.environ.get("NUMBA_CACHE_DIR")
    if prebuilt and target and os.path.isdir(prebuilt) and not os.path.exists(target):
        import shutil

        try:
            shutil.copytree(prebuilt, target)
        except OSError:
            pass  # numba compiles instead, as without an image's cache


def describe() -> str:
    if _kernels is None:
        return _why_not
    import numba

    return f"numba {numba.__version__}"


def kernels():
    """The compiled module, or None where the numpy code runs."""
    return _kernels


def disable() -> None:
    """Back to numpy (tests compare both in one process)."""
    global _kernels, _why_not
    _kernels, _why_not = None, "not enabled"


__all__ = ["describe", "disable", "enable", "kernels"]
