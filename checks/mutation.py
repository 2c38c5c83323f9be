"""make mutation: plant each bug of checks/mutants.py in a scratch copy and see the tests catch it.

    python checks/mutation.py                 # every planted bug, against make test's suite
    python checks/mutation.py --only gamma    # those whose name contains "gamma"
    python checks/mutation.py --list          # the planted bugs, without running anything

A planted bug is one exact edit of fgrpo.py, eval.py or a file of checks/, integrations/ or
experiments/
(checks/mutants.py says which and why it is plausible). For each, the tracked files are copied to
a scratch folder, the edit is made there, and `pytest -x -m "not slow"` runs in it: `make test`'s
fast suite, which leaves out the slow tests (whole runs, vLLM engines, torchrun: pytest.ini). The
bug is caught if a test fails, survives if every test passes; a run past --timeout is neither,
and counts as not caught. The unchanged copy runs first and must pass. Exit status 1 if a bug
was not caught or an edit's text is no longer in its file (checks/mutants.py then needs updating).
The full run's table is checks/mutation_results.json, the committed record; a run of --only
writes runs/mutation_only.json instead, unless --out says where.

Why not mutmut: it mutates every operator and constant (hundreds of mutants of fgrpo.py, hours
of the suite on 2 cores) and cannot plant the named wiring bugs this list keeps.
"""
import argparse
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the fast test that each planted bug's text is in its file: a planted copy fails it by design
FINDS_ITS_TEXT = ("tests/test_checks.py::"
                  "test_every_planted_bug_finds_its_text_once_and_its_file_still_parses")


def load_mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "checks" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


def scratch_copy():
    """The tracked files and the working tree's edits of them, in a new folder."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    folder = Path(tempfile.mkdtemp(prefix="fgrpo-mutant-"))
    for name in files:
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    # a git checkout of its own: the tests that read the tracked files (git ls-files) see these
    for cmd in (["init", "-q"], ["add", "-A"]):
        subprocess.run(["git", *cmd], cwd=folder, check=True, capture_output=True)
    return folder


def planted(folder, mutant):
    """(the mutant's file in `folder` with its edit made, None) or (None, why it is stale): its
    text must occur once, and a planted .py file must still parse (a bug, not a syntax error)."""
    text = (folder / mutant["file"]).read_text()
    found = text.count(mutant["find"])
    if found != 1:
        return None, f"its text occurs {found} times in {mutant['file']}: update checks/mutants.py"
    edited = text.replace(mutant["find"], mutant["replace"])
    try:
        if mutant["file"].endswith(".py"):
            ast.parse(edited)
    except SyntaxError as e:
        return None, f"planted, {mutant['file']} no longer parses (line {e.lineno}): {e.msg}"
    return edited, None


def plant(folder, mutant):
    """Make the mutant's edit in the copy; an error message if it is stale (planted)."""
    edited, error = planted(folder, mutant)
    if edited is not None:
        (folder / mutant["file"]).write_text(edited)
    return error


def run_suite(folder, timeout, threads):
    """(passed, seconds, the first failing test's name or the tail of the output); passed is
    None if the suite ran past the timeout: a hang is not a failing test."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
           "--deselect", FINDS_ITS_TEXT]
    start = time.time()
    try:
        out = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.time() - start, f"timed out after {timeout} s"
    failed = [line.split(" ")[1] for line in out.stdout.splitlines() if line.startswith("FAILED ")]
    detail = failed[0].split("::")[-1] if failed else out.stdout.strip().splitlines()[-1:]
    return out.returncode == 0, time.time() - start, str(detail)


def check(mutant, timeout, threads):
    folder = scratch_copy()
    try:
        error = mutant and plant(folder, mutant)
        if error:
            return {"status": "stale", "detail": error, "seconds": 0.0}
        passed, seconds, detail = run_suite(folder, timeout, threads)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if passed is None:  # neither caught nor survived: counted as not caught
        status = "TIMEOUT"
    elif mutant is None:
        status = "passes" if passed else "FAILS"
    else:
        status = "SURVIVED" if passed else "caught"
    return {"status": status, "detail": detail, "seconds": round(seconds, 1)}


def record_path(only):
    """Where a run's table goes by default: the committed record holds the full run alone."""
    if only:
        return ROOT / "runs" / "mutation_only.json"
    return ROOT / "checks" / "mutation_results.json"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--only", nargs="+", default=[], help="plant only bugs whose name contains one")
    p.add_argument("--list", action="store_true", help="print the planted bugs and stop")
    p.add_argument("--jobs", type=int, default=2, help="copies tested at once (one thread each)")
    p.add_argument("--timeout", type=int, default=900, help="seconds for one run of the suite")
    p.add_argument("--out", help="where the table goes as JSON; default: "
                   "checks/mutation_results.json, or runs/mutation_only.json with --only")
    args = p.parse_args()
    args.out = args.out or record_path(args.only)
    mutants = [m for m in load_mutants()
               if not args.only or any(word in m["name"] for word in args.only)]
    if args.list:
        for m in mutants:
            print(f"{m['name']:32} {m['file']:9} {m['why']}")
        return 0
    print(f"the unchanged copy first, then {len(mutants)} planted bugs, {args.jobs} at a time",
          flush=True)
    baseline = check(None, args.timeout, max(1, 2 // args.jobs))
    print(f"unchanged: {baseline['status']} in {baseline['seconds']} s", flush=True)
    if baseline["status"] != "passes":
        sys.exit(f"error: the fast suite fails without any planted bug: {baseline['detail']}")
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = [(m, pool.submit(check, m, args.timeout, 1)) for m in mutants]
        results = []
        for m, job in jobs:
            r = {"name": m["name"], "file": m["file"], "why": m["why"], **job.result()}
            results.append(r)
            print(f"{r['status']:8} {r['seconds']:6.1f} s {r['name']:32} {r['detail']}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    record = {"commit": commit.stdout.strip(), "baseline": baseline, "mutants": results}
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"the table: {args.out}")
    bad = [r["name"] for r in results if r["status"] != "caught"]
    print(f"{len(results) - len(bad)} of {len(results)} caught" +
          (f"; not caught: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
