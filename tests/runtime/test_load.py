"""Load: 64 synthetic workers against a real parameter-server process, bounded to about 30 s.

The full run is ``python -m benchmarks.load --seconds 300`` (see docs/RELIABILITY.md).
"""

from __future__ import annotations

import os

import pytest

from benchmarks import load

pytestmark = pytest.mark.slow
LOAD_SECONDS = float(os.environ.get("EMU_LOAD_SECONDS", 30))


def test_sixty_four_pushers_every_push_answered_and_memory_flat():
    result = load.run_load(LOAD_SECONDS, pushers=64)
    print("\n" + "\n".join(load.markdown(result)))
    assert load.check(result) == []
    assert result["answered"] > 64 * 10  # every pusher got well past its first push
    memory = result["memory"]
    # The per-worker AdaComp snapshots appear once, when the workers first pull (and a bit more:
    # each connection's buffers); nothing like one snapshot per update.
    assert memory["all_pulled"]["rss_bytes"] - memory["before"]["rss_bytes"] < 3 * result["snapshot_bytes_expected"]
