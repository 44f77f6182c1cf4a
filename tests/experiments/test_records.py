"""Run records and the reproduction regenerated from them: deterministic bytes, the same
output, links that resolve.

``tests/data/records/`` holds a small set of records made from the recorded traces of
``tests/data/traces/`` (:func:`make_fixture`; the numbers mean nothing) and what
``python -m emulator.experiments.paper --from-records`` writes from them (``expected/``). Both
are checked here against a fresh build, byte for byte; so are docs/reproduction's records and
the results.md regenerated from them. Figures are compared as pictures: the same size and the
same pixels up to anti-aliasing. The same records drawn by the same pinned matplotlib on two
machines differed in 19 of 645,120 pixels, by at most 3 of 255 levels (the edges of a few lines;
every text and every other pixel equal), while any change to what a figure shows (a point moved,
a line or label more or less) changes hundreds of pixels by far more.
"""

from __future__ import annotations

import filecmp
import re
from pathlib import Path

import pytest

from conftest import ROOT
from emulator.experiments.records import SUFFIX, make_record, read_record, read_records, record_bytes, record_path, write_record

TRACES = ROOT / "tests" / "data" / "traces"
FIXTURE = ROOT / "tests" / "data" / "records"
DOCS = ROOT / "docs"
REPRODUCTION = DOCS / "reproduction"
COMMAND = "python -m emulator.experiments.paper --from-records records --out expected"
# (experiment, kind, label, repetition, grid, recorded trace): a comparison of two methods over two
# repetitions, one of whose runs diverged and one died, and a two-point sweep.
PLAN = (
    ("methods", "compare", "adacomp:c=0.01", 0, {}, "healthy-faults"),
    ("methods", "compare", "comp_c:c=0.01", 0, {}, "diverged-nan"),
    ("methods", "compare", "adacomp:c=0.01", 1, {}, "server-crash"),
    ("methods", "compare", "comp_c:c=0.01", 1, {}, "dead-before-fix"),
    ("crash", "sweep", "adacomp", 0, {"faults.crash.rate_per_hour": 0}, "server-crash"),
    ("crash", "sweep", "adacomp", 0, {"faults.crash.rate_per_hour": 60}, "healthy-faults"),
)


def make_fixture(folder: Path) -> None:
    """The fixture's records under ``folder`` (``python -c "from tests... import make_fixture"``)."""
    for order, (experiment, kind, label, repeat, grid, trace) in enumerate(PLAN):
        record = make_record(TRACES / trace, experiment=experiment, label=label, repeat=repeat, kind=kind, grid=grid,
                             command=f"(recorded trace tests/data/traces/{trace})", commit="fixture",
                             extra={"order": order})
        write_record(record_path(folder, experiment, f"{order:02d}-{trace}"), record)


def test_a_record_is_the_same_bytes_every_time():
    first = make_record(TRACES / "healthy-faults", experiment="x", label="adacomp", commit="c")
    again = make_record(TRACES / "healthy-faults", experiment="x", label="adacomp", commit="c")
    assert record_bytes(first) == record_bytes(again)
    assert record_bytes(first)[4:8] == b"\0\0\0\0"  # gzip header: no timestamp


def test_a_record_holds_what_the_tables_need(tmp_path):
    record = make_record(TRACES / "diverged-nan", experiment="methods", label="comp_c:c=0.01", repeat=1, commit="c")
    assert record["row"]["outcome"] == "diverged" and record["row"]["status"] == "completed"
    assert record["repeat"] == 1 and record["seed"] is not None
    e = record["evaluations"]
    assert len(e["version"]) == len(e["accuracy"]) == len(e["loss"]) == len(e["bytes"]) >= 2
    assert sum(record["staleness"]["d_histogram"].values()) == record["staleness"]["updates"]
    assert len(record["traffic"]["up"]) == len(record["traffic"]["second"]) > 0
    assert sum(record["worker_updates"].values()) == record["staleness"]["updates"]
    path = write_record(tmp_path / f"a{SUFFIX}", record)
    assert read_record(path) == record


def test_the_committed_fixture_is_made_from_the_recorded_traces(tmp_path):
    make_fixture(tmp_path)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob(f"*{SUFFIX}"))
    committed = sorted(p.relative_to(FIXTURE / "records") for p in (FIXTURE / "records").rglob(f"*{SUFFIX}"))
    assert made == committed
    assert all((tmp_path / p).read_bytes() == (FIXTURE / "records" / p).read_bytes() for p in made)


def _regenerated(records: Path, out: Path, command: str) -> set[Path]:
    from emulator.experiments.paper.regenerate import regenerate

    regenerate(records, out, command)
    return {p.relative_to(out) for p in out.rglob("*") if p.is_file()}


ANTIALIAS_LEVELS = 16  # the most a pixel of a figure may differ by, of 255
ANTIALIAS_SHARE = 0.001  # the share of a figure's pixels that may differ at all


def _same_picture(a: Path, b: Path) -> bool:
    """Two PNGs that show the same figure: the same size, at most ANTIALIAS_SHARE of the pixels
    different, none by more than ANTIALIAS_LEVELS."""
    import numpy as np
    from PIL import Image

    x, y = (np.asarray(Image.open(p).convert("RGBA"), dtype=np.int16) for p in (a, b))
    if x.shape != y.shape:
        return False
    differ = np.abs(x - y).max(axis=-1)
    return int((differ > 0).sum()) <= ANTIALIAS_SHARE * differ.size and int(differ.max()) <= ANTIALIAS_LEVELS


def _same(made: Path, committed: Path) -> bool:
    """Text byte for byte; a figure as a picture (:func:`_same_picture`)."""
    if filecmp.cmp(made, committed, shallow=False):
        return True
    return made.suffix == ".png" and _same_picture(made, committed)


def _differences(made: Path, committed: Path, files: set[Path]) -> list[str]:
    return [str(f) for f in sorted(files) if not (committed / f).is_file() or not _same(made / f, committed / f)]


def test_figures_equal_up_to_antialiasing_and_no_further(tmp_path):
    """A few edge pixels a few levels off is the same figure; a moved line, a darker patch or another size is not."""
    import numpy as np
    from PIL import Image

    base = np.full((200, 300, 3), 255, dtype=np.uint8)
    base[100, 20:280] = (31, 119, 180)  # a line

    def saved(name: str, pixels: np.ndarray) -> Path:
        Image.fromarray(pixels).save(tmp_path / name)
        return tmp_path / name

    original = saved("a.png", base)
    edges = base.copy()
    edges[99, 50:60] -= 3  # ten pixels at a line's edge, 3 levels darker
    moved = base.copy()
    moved[100, 20:280], moved[104, 20:280] = 255, (31, 119, 180)
    patch = base.copy()
    patch[0:2, 0:10] -= 40  # few pixels, far off
    assert _same_picture(original, saved("edges.png", edges))
    assert not _same_picture(original, saved("moved.png", moved))
    assert not _same_picture(original, saved("patch.png", patch))
    assert not _same_picture(original, saved("wider.png", np.full((200, 301, 3), 255, dtype=np.uint8)))
    text = tmp_path / "a.md"
    text.write_text("x\n")
    (tmp_path / "b.md").write_text("y\n")
    assert not _same(text, tmp_path / "b.md")


def test_the_fixture_regenerates_what_is_committed(tmp_path):
    files = _regenerated(FIXTURE / "records", tmp_path / "out", COMMAND)
    expected = {p.relative_to(FIXTURE / "expected") for p in (FIXTURE / "expected").rglob("*") if p.is_file()}
    assert files == expected
    assert _differences(tmp_path / "out", FIXTURE / "expected", files) == []
    results = (tmp_path / "out" / "results.md").read_text()
    assert "1 of 2 (50%; 1%-99%)" in results  # comp_c: one diverged, one dead-before-fix with no outcome recorded
    assert "Fisher" in results and "Holm" in results


def test_docs_reproduction_is_regenerated_from_its_records(tmp_path):
    records = REPRODUCTION / "records"
    assert read_records(records), "docs/reproduction/records holds no records"
    command = "python -m emulator.experiments.paper --from-records docs/reproduction/records --out docs/reproduction"
    files = _regenerated(records, tmp_path / "out", command)
    assert "results.md" in {str(f) for f in files}
    assert _differences(tmp_path / "out", REPRODUCTION, files) == []


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _documents() -> list[Path]:
    return sorted([*DOCS.glob("*.md"), *REPRODUCTION.rglob("*.md"), ROOT / "README.md"])


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert broken == [], f"{document.relative_to(ROOT)} links to what does not exist: {broken}"


def test_a_section_says_how_many_runs_the_fidelity_check_flagged():
    from emulator.experiments.paper.regenerate import _fidelity

    clean = {"fidelity": {"checked": True, "ok": True, "failures": 0, "first_failures": [], "tolerance": 0.1}}
    flagged = {"fidelity": {"checked": True, "ok": False, "failures": 38, "tolerance": 0.1,
                            "first_failures": ["worker-0.cpu_share", "worker-1.cpu_share", "worker-2.cpu_share", "worker-3.cpu_share"]}}
    text = _fidelity([clean, flagged, clean, {}])
    assert text.startswith("Fidelity check (each run, before training): 1 of 3 runs flagged a property off by more than 10%")
    assert "at most 38 properties in one run, e.g. worker-0.cpu_share, worker-1.cpu_share, worker-2.cpu_share)" in text
    assert text.endswith("1 record written before the check was kept in them.")


def test_a_step_grids_section_says_which_step_it_chose_and_not_from_part_of_the_grid(tmp_path):
    """alphas and claim6-steps end with the step ``make figures`` chose per method; a step with fewer
    runs than the others (the grid still running) makes the section say nothing is chosen yet."""
    from analysis import figures
    from emulator.experiments.paper.regenerate import renderer, steps_section

    def record(alpha, repeat, trace="healthy-faults"):
        return make_record(TRACES / trace, experiment="alphas", label=f"m:training.learning_rate={alpha}", repeat=repeat,
                           command="(recorded trace)", commit="c")

    whole = [record(0.1, 0), record(0.01, 0), record(0.1, 1), record(0.01, 1)]
    part = whole[:3]
    assert renderer("alphas", whole) is steps_section and renderer("claim6-steps", whole) is steps_section
    styles = figures.Styles(["m:training.learning_rate=0.1", "m:training.learning_rate=0.01"])
    chosen = steps_section("alphas", whole, tmp_path / "whole", styles).body
    assert "### Step chosen per method" in chosen and chosen[-1].startswith("| `m` | 0.1: ") and "2 run(s) a step" in "\n".join(chosen)
    assert chosen[-1].endswith(" (at the edge of the grid: extend it) |")
    waiting = steps_section("alphas", part, tmp_path / "part", styles).body
    assert waiting[-1].endswith("| not chosen yet: 1 run(s) of the grid still to make |")
    first = [make_record(TRACES / "healthy-faults", experiment="alphas", label=f"m:training.learning_rate={alpha}", repeat=0,
                         command="emulate compare scenarios/paper/methods.yaml --repeat 2", commit="c") for alpha in (0.1, 0.01)]
    asked = steps_section("alphas", first, tmp_path / "first", styles).body  # every step once, of the two runs asked
    assert asked[-1].endswith("| not chosen yet: 2 run(s) of the grid still to make |")
