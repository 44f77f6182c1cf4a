"""The availability experiment of make figures: its levels per profile and the online share it reports."""

from __future__ import annotations

from emulator.experiments.paper.availability import LEVELS, SCENARIO, levels_for, online_share
from emulator.experiments.paper.profiles import PROFILES
from emulator.planning.loader import load_scenario
from emulator.planning.plan import make_plan


def test_every_profile_runs_levels_whose_files_plan():
    for name, profile in PROFILES.items():
        levels = levels_for(profile)
        assert levels and set(levels) <= set(LEVELS), name
        sizing = [o for o in profile.overrides("crash", "mnist-5k") if not o.startswith("faults.")]
        for level in levels:
            plan = make_plan(load_scenario(SCENARIO, [*sizing, f"workers[0].traces.availability={LEVELS[level]}"])[0])
            share = online_share(plan.to_json())
            assert share is not None and 0 < share <= 1, (name, level)


def test_the_online_share_follows_the_level():
    shares = {level: online_share(make_plan(load_scenario(SCENARIO, [f"workers[0].traces.availability={file}"])[0]).to_json())
              for level, file in LEVELS.items()}
    assert shares[100] == 1.0
    assert shares[100] > shares[70] > shares[40] > 0


def test_the_online_share_counts_pauses_until_resumes_and_the_end():
    plan = {"training": {"duration": 100.0}, "workers": [{"name": "worker-0"}, {"name": "worker-1"}],
            "events": [{"time_s": 10.0, "action": "pause", "target": "worker-0", "source": "trace"},
                       {"time_s": 30.0, "action": "resume", "target": "worker-0", "source": "trace"},
                       {"time_s": 90.0, "action": "crash", "target": "worker-1", "source": "trace"},
                       {"time_s": 50.0, "action": "pause", "target": "worker-1", "source": "schedule"}]}
    assert online_share(plan) == 1 - (20 + 10) / 200
