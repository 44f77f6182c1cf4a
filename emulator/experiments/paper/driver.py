"""The command behind `make figures`: choose the backend and the dataset, run every experiment of the
profile, write results.md, and say in the exit status whether everything completed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from emulator.experiments.paper.experiments import EXPERIMENTS
from emulator.experiments.paper.profiles import PROFILES
from emulator.experiments.paper.results import Section, write_results

DESCRIPTION = "``make figures``: run the paper's experiments and draw its figures, from scratch."
DATASET_PREFERENCE = ("mnist", "fashion-mnist", "mnist-5k")


def choose_dataset(say) -> tuple[str, str]:
    """The largest real dataset that loads here: (name, where it came from). Each one passed over
    is said with every place tried, so a user sees what to install for a better one."""
    from emulator import datasets

    found = datasets.best_available(DATASET_PREFERENCE, say=say)
    return found.name, f"{found.train_examples:,} training and {found.test_examples:,} test images from {found.source}"


def main(argv=None) -> int:
    """Exit 0 when every experiment and every run completed; 1 when any failed (results.md is
    written all the same, marked incomplete, each failure with its cause); 2 when no dataset or
    backend is usable here."""
    parser = argparse.ArgumentParser(prog="python -m emulator.experiments.paper", description=DESCRIPTION)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--backend", choices=("auto", "docker", "local"), default="auto")
    parser.add_argument("--out", default="figures")
    parser.add_argument("--only", nargs="*", choices=tuple(EXPERIMENTS), default=None)
    parser.add_argument("--records", default=None,
                        help="where each run's compact record goes (default: <out>/records; docs/reproduction/records "
                             "is the committed copy)")
    parser.add_argument("--from-records", default=None, metavar="DIR",
                        help="run nothing: regenerate results.md and every figure under --out from the records in DIR")
    parser.add_argument("--budget", action="store_true",
                        help="run nothing: print each experiment's runs and estimated minutes on this machine")
    args = parser.parse_args(argv)
    if args.budget:
        from emulator.experiments.paper.claims import budget_text

        print(f"Profile {args.profile}" + (f", only {' '.join(args.only)}" if args.only else "")
              + ": runs and minutes estimated from the run times measured here (emulator/experiments/paper/claims.py)\n")
        print(budget_text(PROFILES[args.profile], args.only))
        return 0
    if args.from_records:
        from emulator.experiments.paper.regenerate import regenerate

        command = f"python -m emulator.experiments.paper --from-records {args.from_records} --out {args.out}"
        path = regenerate(Path(args.from_records), Path(args.out), command)
        print(f"wrote {path} from the records in {args.from_records}", file=sys.stderr)
        return 0
    from emulator.backends import BackendUnavailable, choose
    from emulator.datasets import DatasetUnavailable

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.monotonic()
    profile = PROFILES[args.profile]
    try:
        backend = choose(args.backend, say=say).name
        dataset, source = choose_dataset(say)
    except (BackendUnavailable, DatasetUnavailable) as exc:
        say(f"error: {exc}")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say(f"paper figures: profile {args.profile}, backend {backend}, dataset {dataset}: {source}")
    if args.records and Path(args.records).is_dir():  # what earlier runs recorded (step grids) is known here too
        _copy_missing(Path(args.records), out / "records")
    sections = []
    try:
        for name, experiment in EXPERIMENTS.items():
            if args.only and name not in args.only:
                continue
            began = time.monotonic()
            try:
                section = experiment(profile, out, backend, dataset, say)
            except Exception as exc:  # noqa: BLE001 - a failed experiment is a marked section, and exit 1
                cause = (str(exc).strip().splitlines() or [""])[0]
                say(f"{name}: experiment failed: {type(exc).__name__}: {cause}")
                section = Section(name, [f"**FAILED**: {type(exc).__name__}: {cause}"], [], "-",
                                  [f"{name}: the experiment failed: {type(exc).__name__}: {cause}"])
            section.seconds = time.monotonic() - began
            sections.append(section)
    except KeyboardInterrupt:  # one line, not a traceback; the records are kept below
        say("interrupted: the runs that finished are kept; the same command goes on from them")
        return 130
    finally:  # Ctrl-C too: the comparisons that finished keep their records (a later session goes on from them)
        if args.records and (out / "records").is_dir():  # the committed copy: every record this output folder holds
            import shutil

            shutil.copytree(out / "records", Path(args.records), dirs_exist_ok=True)
            say(f"records copied to {args.records}")
    meta = {"profile": args.profile, "backend": backend, "dataset": dataset, "dataset_source": source,
            "when": time.strftime("%Y-%m-%d %H:%M"), "seconds": time.monotonic() - started}
    path = write_results(out, meta, sections)
    failures = [f for section in sections for f in section.failures]
    say(f"wrote {path} and {len(list(out.glob('*.png')))} figures in {meta['seconds']:.0f} s")
    if failures:
        say(f"INCOMPLETE: {len(failures)} experiment(s) or run(s) failed (listed at the top of {path}):")
        for failure in failures:
            say(f"  {failure}")
        return 1
    return 0


def _copy_missing(source: Path, target: Path) -> None:
    """Copy the records under ``source`` that ``target`` does not hold (a record made here is newer)."""
    import shutil

    from emulator.experiments.records import SUFFIX

    for path in source.rglob(f"*{SUFFIX}"):
        to = target / path.relative_to(source)
        if not to.exists():
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, to)
