"""``report.html`` in a real browser: headless Chromium opens it and every figure must have loaded.

The check runs the report's own markup: a copy of ``report.html`` with a script that, on the
page's ``load`` event, lists every ``<img>`` with ``complete`` and ``naturalWidth`` into a
``<pre id="image-check">`` element; Chromium's ``--dump-dom`` prints the DOM after loading, and
the test reads that list. A negative control (a figure file removed) shows that a missing
image is caught. Needs Debian's ``chromium`` package; skipped without it, except under CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.report import build_report
from conftest import TEST_SCENARIOS, run_scenario
from support.runs import write_synthetic_run

CHECK_SCRIPT = """<script>
window.addEventListener('load', function () {
  var images = Array.from(document.images).map(function (img) {
    return {src: img.getAttribute('src'), complete: img.complete, naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight};
  });
  var out = document.createElement('pre');
  out.id = 'image-check';
  out.textContent = JSON.stringify(images);
  document.body.appendChild(out);
});
</script>"""
MARKER = re.compile(r'<pre id="image-check">(.*?)</pre>', re.S)

@pytest.fixture(scope="session")
def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("headless Chromium is required under CI: apt-get install chromium")
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")


def loaded_images(chromium: str, report: Path, tmp_path: Path) -> list[dict]:
    """Open a copy of ``report/report.html`` in headless Chromium; returns what it says of each <img>."""
    copy = tmp_path / "report-copy"
    shutil.copytree(report, copy, dirs_exist_ok=True)
    page = copy / "report.html"
    html = page.read_text()
    assert html.count("</body>") == 1
    page.write_text(html.replace("</body>", CHECK_SCRIPT + "</body>"))
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    match = MARKER.search(done.stdout)
    assert match, f"no image check in Chromium's DOM (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def assert_every_figure_loaded(chromium: str, report: Path, tmp_path: Path) -> list[dict]:
    images = loaded_images(chromium, report, tmp_path)
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert pngs, "the report has no figure"
    assert sorted(i["src"] for i in images) == pngs, "every PNG is shown, and nothing else"
    broken = [i for i in images if not (i["complete"] and i["naturalWidth"] > 0 and i["naturalHeight"] > 0)]
    assert not broken, f"images that did not load: {broken}"
    return images


def test_every_figure_of_a_run_report_loads_in_chromium(chromium, tmp_path):
    report = build_report(write_synthetic_run(tmp_path / "run"))
    images = assert_every_figure_loaded(chromium, report, tmp_path)
    assert len(images) == 9  # docker backend: link utilisation too; both directions of traffic
    assert all(i["naturalWidth"] >= 600 for i in images)


def test_a_missing_figure_is_caught(chromium, tmp_path):
    report = build_report(write_synthetic_run(tmp_path / "run", backend="local"))
    shutil.copytree(report, tmp_path / "damaged")
    (tmp_path / "damaged" / "staleness.png").unlink()
    images = loaded_images(chromium, tmp_path / "damaged", tmp_path)
    failed = [i["src"] for i in images if i["naturalWidth"] == 0]
    assert failed == ["staleness.png"]


def test_every_figure_of_a_sweep_report_loads_in_chromium(chromium, tmp_path):
    from support.runs import FakeRunner

    from emulator.experiments.sweep import Sweep, run_sweep

    sweep = Sweep.from_options(TEST_SCENARIOS / "tiny-sweep.yaml", ["faults.crash.rate_per_hour=0,60"], repeat=1)
    run_sweep(sweep, tmp_path / "sweep", runner=FakeRunner(), say=lambda m: None)
    report = build_report(tmp_path / "sweep", per_run=True)
    images = assert_every_figure_loaded(chromium, report, tmp_path)
    assert any(i["src"].startswith("sweep_") for i in images)
    for run in (tmp_path / "sweep").glob("*-r0"):  # each run's own report, linked from the runs table
        assert f"../{run.name}/report/report.html" in (report / "report.html").read_text()
        assert (run / "report" / "report.html").exists()


@pytest.mark.slow
def test_the_report_of_a_real_run_loads_in_chromium(chromium, tmp_path):
    """A real training run on the local backend (MLP, digits, 3 workers, 40 updates), then its report."""
    summary, run = run_scenario(TEST_SCENARIOS / "report-html.yaml", tmp_path / "runs", backend="local", check_fidelity=False)
    assert summary["status"] == "completed" and summary["updates_applied"] == 40
    report = build_report(run)
    images = assert_every_figure_loaded(chromium, report, tmp_path)
    assert {"accuracy_ingress.png", "accuracy_time.png", "accuracy_updates.png", "staleness.png", "worker_share.png"} <= {i["src"] for i in images}
    md = (report / "report.md").read_text()
    assert f"| `{summary['run_id']}` | completed | adacomp | 3 | {summary['final_accuracy']:.4f} | 40 |" in md
    assert "net.jsonl is written by the docker backend only" in md
