"""Per-process CPU and memory readings from /proc, as the backends sample them each second."""

from __future__ import annotations


def test_memory_reads_rss_each_time_and_pss_at_most_every_interval(monkeypatch):
    # smaps_rollup costs ~18 ms for a TensorFlow process: sampled each second for every
    # device it took a share of the CPUs the devices emulate. RSS stays fresh (statm is cheap).
    import os

    from emulator.host import procstats

    opened = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    clock = [1000.0]
    monkeypatch.setattr(procstats.time, "monotonic", lambda: clock[0])
    procstats._pss_seen.clear()
    pid = os.getpid()
    first = procstats.memory(pid)
    assert first["rss_bytes"] > 0 and first["pss_bytes"] > 0
    clock[0] += procstats.PSS_EVERY_S / 2
    second = procstats.memory(pid)
    assert second["pss_bytes"] == first["pss_bytes"]
    clock[0] += procstats.PSS_EVERY_S
    procstats.memory(pid)
    assert sum(p.endswith("/smaps_rollup") for p in opened) == 2
    assert sum(p.endswith("/statm") for p in opened) == 3
    procstats.memory(pid, pss_every_s=0)  # asked for fresh: read now
    assert sum(p.endswith("/smaps_rollup") for p in opened) == 3
    assert procstats.memory(2**22 + 12345) is None  # no such process
