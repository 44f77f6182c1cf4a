"""The servers experiment's table and verdict, from run records (emulator.experiments.paper.servers)."""

from __future__ import annotations

from emulator.experiments.paper.servers import server_load_table, servers_table

ADACOMP = "adacomp:c=0.01:training.learning_rate=0.02"


def _record(label: str, seed: int, rate: float, shards: int, cpu_each: float | None = 20.0, status: str = "completed") -> dict:
    duration = 200.0
    updates = int(rate * duration)
    ingress = 1_000_000 * shards
    servers = [] if shards == 1 else [{"name": f"server-{i}", "ingress_payload_bytes": ingress // shards} for i in range(shards)]
    names = ["server"] if shards == 1 else [s["name"] for s in servers]
    return {"label": label, "seed": seed, "row": {"status": status},
            "summary": {"updates_per_s": rate, "duration_s": duration, "updates_applied": updates, "ingress_payload_bytes": ingress,
                        "compressor": "adacomp" if label.startswith("adacomp") else "none", **({"servers": servers} if servers else {})},
            "server_cpu_s": {} if cpu_each is None else {n: cpu_each for n in names},
            "step_phases": {"compute_ms": 200.0, "compress_ms": 30.0, "network_ms": 600.0 / shards}}


def _records(rates: dict[tuple[str, int], list[float]]) -> list[dict]:
    return [_record(label, seed, rate, shards) for (label, shards), values in rates.items() for seed, rate in enumerate(values, 1)]


def test_the_verdict_names_the_fewest_servers_that_beat_adacomp_and_what_they_cost():
    records = _records({(ADACOMP, 1): [100, 102, 98], ("asgd", 1): [50, 52, 49], ("asgd:server.shards=2", 2): [80, 83, 78],
                        ("asgd:server.shards=4", 4): [130, 135, 128]})
    text = "\n".join(servers_table(records))
    assert "faster than AdaComp on one with 4 servers" in text
    assert "`asgd` (1 server(s)): -49.7" in text and ": slower" in text
    row = next(line for line in text.splitlines() if line.startswith("| `asgd:server.shards=4`"))
    # 4 servers of 20 CPU s each over 200 s: 0.40 cores; 80 CPU s over about 26,200 updates: 3.05 ms
    assert "| 4 |" in row and "0.40 ± 0.00 (3)" in row and "3.05 ±" in row
    assert "0.020 ± 0.000 (3)" in row  # all four links: 4 MB over 200 s; the busiest 0.005
    assert "0.005 ± 0.000 (3)" in row
    assert row.endswith("| 200 / 30 / 150 |")  # a worker's step: gradient / compression / exchange


def test_overlapping_rates_are_cant_tell_and_unsampled_cpu_is_not_invented():
    records = _records({(ADACOMP, 1): [100, 80, 120], ("asgd:server.shards=2", 2): [95, 110, 90]})
    records.append(_record("asgd:server.shards=2", 4, 99, 2, cpu_each=None))
    text = "\n".join(servers_table(records))
    assert "can't tell" in text and "may match AdaComp: 2" in text
    row = next(line for line in text.splitlines() if line.startswith("| `asgd:server.shards=2`"))
    assert row.count("(3)") == 2 and "(4)" in row  # CPU from the three sampled runs only; rates from all four


def test_one_seed_a_configuration_names_no_number_of_servers():
    """The fast profile's one seed: differences are shown, untested, and the verdict is can't tell."""
    records = _records({(ADACOMP, 1): [42.3], ("asgd", 1): [12.5], ("asgd:server.shards=2", 2): [13.9],
                        ("asgd:server.shards=4", 4): [13.7]})
    text = "\n".join(servers_table(records))
    assert "Verdict: can't tell: 1 paired seed(s) a configuration, too few for a paired test" in text
    assert "may match" not in text and "slower" not in text.split("Verdict:")[1]


def test_the_fewest_servers_that_may_match_says_which_fewer_were_slower():
    records = _records({(ADACOMP, 1): [100, 102, 98], ("asgd", 1): [50, 52, 49], ("asgd:server.shards=2", 2): [95, 110, 90]})
    text = "\n".join(servers_table(records))
    assert "with 2 servers (`asgd:server.shards=2`) dense ASGD was not shown slower" in text
    assert "; with 1 server it was slower. The fewest servers that may match AdaComp: 2" in text


def test_a_configuration_with_one_paired_seed_is_left_out_of_the_verdict_and_named():
    records = _records({(ADACOMP, 1): [100, 102, 98], ("asgd", 1): [50, 52, 49], ("asgd:server.shards=4", 4): [130, 135, 128]})
    records.append(_record("asgd:server.shards=2", 1, 99, 2))  # its other seeds failed: one pair, no test
    text = "\n".join(servers_table(records)).split("Verdict: ")[1]
    assert text.startswith("dense ASGD updated the model faster than AdaComp on one with 4 servers (`asgd:server.shards=4`), "
                           "and more slowly with 1 server:")
    assert "Not tested, fewer than two paired seeds: `asgd:server.shards=2` (n = 1)" in text


def test_failed_runs_are_left_out_and_no_adacomp_says_so():
    records = [_record("asgd", 1, 50, 1), _record("asgd", 2, 0, 1, status="failed")]
    text = "\n".join(servers_table(records))
    assert "no completed AdaComp run" in text
    assert "50.0 (1)" in text


def test_make_reproduction_renders_the_servers_experiment_with_its_own_section():
    from emulator.experiments.paper.regenerate import renderer, servers_section

    assert renderer("servers", [{"kind": "compare"}]) is servers_section
    assert renderer("claim6", [{"kind": "compare"}]).__name__ == "compare_section"


def test_the_server_load_per_method_is_its_cpu_against_its_quota_with_the_loops_that_ran():
    """Issue 30's "server CPU share during the methods runs": per method, cores, share of the quota, ms per update."""
    records = _records({(ADACOMP, 1): [100, 100, 100], ("asgd", 1): [50, 50, 50], ("asgd:server.shards=2", 2): [80, 80, 80]})
    for r in records:
        r["plan"] = {"server": {"cpus": 0.5}}
        r["summary"]["server_kernels"] = "numba 0.68.1" if r["label"] == ADACOMP else "numpy (numba unavailable: x)"
    records.append(_record("asgd", 4, 50, 1, status="failed"))
    lines = server_load_table(records)
    rows = {line.split("`")[1]: line for line in lines if line.startswith("| `")}
    assert set(rows) == {ADACOMP, "asgd"}  # a sharded run has its own table, per server; a failed run is left out
    # 20 CPU s over 200 s: 0.100 cores, 20 % of a 0.5-core quota; 20 s over 20,000 updates: 1.000 ms
    assert rows[ADACOMP] == f"| `{ADACOMP}` | numba 0.68.1 | 100.0 ± 0.0 (3) | 0.100 ± 0.000 (3) | 20.0 ± 0.0 % (3) | 1.000 ± 0.000 (3) |"
    assert "| numpy (numba unavailable: x) |" in rows["asgd"] and rows["asgd"].endswith("| 2.000 ± 0.000 (3) |")
    assert server_load_table([_record("asgd", 1, 50, 1, cpu_each=None)]) == []  # nothing sampled: no table
