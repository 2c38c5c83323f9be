"""The docs hold to the code: every command's flags and make targets exist, every cited file and
test exists, the files keep their budgets, and CONTRIBUTING.md states the rules these tests
enforce (its messages point there)."""
import contextlib
import importlib.util
import inspect
import io
import json
import math
import re
import shutil
import statistics
import string
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, NamedTuple

import eval as evaluator  # eval.py; the alias keeps the builtin eval
import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# the budgets CONTRIBUTING.md states: characters a line and lines a function in every .py file,
# lines a file where it has one
LINE_LIMIT = 100
FUNCTION_LIMIT = 50
FILE_LIMITS = {"fgrpo.py": 1000, "eval.py": 400, "checks/gpu_check.py": 900}


# ---------------------------------------------------------------- the docs' commands
def _doc_command_errors(paths):
    """(commands found, problems): every command line in the markdown files' fenced code blocks
    that runs fgrpo.py, eval.py (python or torchrun) or make, checked against the real parsers'
    flags and the Makefile's targets. Nothing is run."""
    import shlex
    flags = {"fgrpo.py": {s for a in fgrpo.build_parser()._actions for s in a.option_strings},
             "eval.py": {s for a in evaluator.build_parser()._actions for s in a.option_strings}}
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z_][\w.-]*)\s*:(?!=)", makefile, re.M))
    found, problems = [], []
    for path in paths:
        fenced, pending = False, ""
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced and line.endswith("\\"):  # a command continued on the next line
                pending += line[:-1]
                continue
            line, pending = pending + line, ""
            try:
                words = shlex.split(line, comments=True) if fenced else []
            except ValueError:  # an unbalanced quote: output, not a command
                continue
            cmds = [[]]
            for w in words:  # one list per command of `a && b ; c`
                cmds.append([]) if w in (";", "&&", "||", "|") else cmds[-1].append(w)
            for cmd in cmds:
                while cmd and (cmd[0] == "time" or re.fullmatch(r"[A-Za-z_]\w*=\S*", cmd[0])):
                    cmd = cmd[1:]  # an environment prefix: BENCH_QUICK=1 make bench
                where = f"{path.name}:{n}"
                if cmd[:1] == ["make"]:
                    found.append(("make", where))
                    wanted = [t for t in cmd[1:] if not t.startswith("-") and "=" not in t]
                    problems += [f"{where}: make {t}: no such target in the Makefile"
                                 for t in wanted if t not in targets]
                    continue
                script = next((i for i, w in enumerate(cmd) if Path(w).name in flags), None)
                if script is None or cmd[0] not in ("python", "python3", "torchrun"):
                    continue
                name = Path(cmd[script]).name
                found.append((f"{Path(cmd[0]).name.rstrip('3')} {name}", where))
                problems += [f"{where}: {name} has no flag {w.split('=')[0]}"
                             for w in cmd[script + 1:]
                             if w.startswith("--") and w.split("=")[0] not in flags[name]]
    return found, problems


def test_readme_commands_use_real_flags(tmp_path):
    found, problems = _doc_command_errors(DOCS)
    assert not problems, "\n".join(problems)
    in_readme = {what for what, where in found if where.startswith("README.md:")}
    # found them
    assert in_readme == {"make", "python fgrpo.py", "torchrun fgrpo.py", "python eval.py"}, found
    # and the check fails where it should: a made-up flag, target and torchrun flag
    bad = tmp_path / "bad.md"
    bad.write_text("```bash\n"
                   "python fgrpo.py --model tiny --no-such-flag 1  # a comment --not-a-flag\n"
                   "make demo && X=1 make no-such-target\n"
                   "torchrun --nproc_per_node 2 fgrpo.py --algo dapo --gama=1\n"
                   "python eval.py --compare a b --n 4 --nope\n"
                   "python fgrpo.py --algo dapo \\\n    --gamma 1 --continued 2\n```\n--outside\n")
    assert _doc_command_errors([bad])[1] == [
        "bad.md:2: fgrpo.py has no flag --no-such-flag",
        "bad.md:3: make no-such-target: no such target in the Makefile",
        "bad.md:4: fgrpo.py has no flag --gama", "bad.md:5: eval.py has no flag --nope",
        "bad.md:7: fgrpo.py has no flag --continued"]


CITED = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)"  # a markdown link to a file here, or a file
                   r"|`((?:docs|bench|checks|experiments|integrations)/[\w./-]+"
                   r"\.(?:md|json|png|py))`")


NOT_YET_WRITTEN = {"checks/gpu_results.json"}  # make gpu-check's output: no GPU has run it yet


def _cited_files_missing(paths):
    """Every file a markdown file links to (relative to it) or names in backticks (relative to
    the repository) that does not exist, as "file:line: path"."""
    missing = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for link, named in CITED.findall(line):
                target = path.parent / link if link else ROOT / named
                if link.startswith(("http://", "https://")) or target.exists() \
                        or named in NOT_YET_WRITTEN:
                    continue
                missing.append(f"{path.name}:{n}: {link or named}")
    return missing


def test_every_file_the_docs_cite_exists(tmp_path):
    docs = [*DOCS, *sorted((ROOT / "experiments" / "results").glob("*.md"))]
    assert not _cited_files_missing(docs), "\n".join(_cited_files_missing(docs))
    bad = tmp_path / "bad.md"  # and it finds a missing one, either way of citing
    bad.write_text("see [x](docs/nope.md#a), [y](https://e.org) and `bench/gone.json`\n"
                   f"and [z]({ROOT / 'README.md'})\n")
    assert _cited_files_missing([bad]) == ["bad.md:1: docs/nope.md", "bad.md:1: bench/gone.json"]


def test_the_files_keep_their_budgets():
    # CONTRIBUTING.md's budgets: LINE_LIMIT characters a line in every tracked .py file and the
    # Makefile, FUNCTION_LIMIT lines a function in every .py file, FILE_LIMITS' lines a file
    import ast
    tracked = subprocess.run(["git", "ls-files", "*.py", "Makefile"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    long = [f"{name}:{i}" for name in tracked if (ROOT / name).exists()
            for i, line in enumerate((ROOT / name).read_text().splitlines(), 1)
            if len(line) > LINE_LIMIT]
    assert "Makefile" in tracked and not long, \
        f"lines over {LINE_LIMIT} characters (CONTRIBUTING.md): {long}"
    limits = {**dict.fromkeys(n for n in tracked if n.endswith(".py")), **FILE_LIMITS}
    for name, most in limits.items():
        text = (ROOT / name).read_text()
        if most is not None:
            assert len(text.splitlines()) <= most, \
                f"{name}: over its {most:,} lines (CONTRIBUTING.md): make room by simplifying"
        functions = [f for f in ast.walk(ast.parse(text)) if isinstance(f, ast.FunctionDef)]
        over = [f.name for f in functions if f.end_lineno - f.lineno + 1 > FUNCTION_LIMIT]
        assert not over, f"{name}: functions over {FUNCTION_LIMIT} lines (CONTRIBUTING.md): {over}"


def test_contributing_states_the_rules_these_tests_enforce():
    # the budgets as the test above holds them, and each rule's test by name (the cited-tests
    # test checks the names exist)
    text = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())  # lines joined
    stated = [f"at most {LINE_LIMIT} characters", f"none over {FUNCTION_LIMIT} lines",
              *(f"`{name}` at most {most:,} lines" for name, most in FILE_LIMITS.items())]
    assert [phrase for phrase in stated if phrase not in text] == []
    rules = ["test_the_files_keep_their_budgets", "test_readme_commands_use_real_flags",
             "test_every_file_the_docs_cite_exists", "test_every_test_the_docs_cite_exists",
             "test_make_help_lists_every_target", "test_tests_live_by_subject",
             "test_code_and_docs_cite_only_what_a_reader_has",
             "test_the_docs_type_no_counts_a_change_makes_stale",
             "test_every_hook_in_the_repository_takes_the_calls_train_makes",
             "test_the_docs_quote_each_figure_as_its_results_file_has_it",
             "test_no_figure_in_the_docs_without_a_registered_source",
             "test_a_time_measured_by_hand_says_where_and_when",
             "test_every_planted_bug_finds_its_text_once_and_its_file_still_parses"]
    assert [rule for rule in rules if f"`{rule}`" not in text] == []


def test_tests_live_by_subject():
    # tests/test_NAME.py tests NAME, a .py file or a folder of the repository; test_fgrpo.py
    # fgrpo.py and eval.py; the slow marker is registered (pytest.ini)
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    subjects = {Path(n).stem for n in tracked if n.endswith(".py")} | {
        Path(n).parts[0] for n in tracked if len(Path(n).parts) > 1}
    files = [Path(n) for n in tracked if re.fullmatch(r"(tests/)?test_\w+\.py", n)]
    assert Path("test_fgrpo.py") in files and len(files) > 5, files
    strays = [str(f) for f in files if f.stem.removeprefix("test_") not in subjects]
    assert not strays, f"test files named for no file or folder (CONTRIBUTING.md): {strays}"
    assert re.search(r"^\s+slow: ", (ROOT / "pytest.ini").read_text(), re.M)


def test_the_docs_type_no_counts_a_change_makes_stale(tmp_path):
    # a count of tests or planted bugs goes stale with the next test or bug: left out, or read
    # from a results file (FIGURES)
    def counts(path):
        return re.findall(r"\b[\d,]+ (?:fast |slow )?(?:tests|planted bugs|bugs)\b",
                          path.read_text())
    found = {path.name: counts(path) for path in DOCS if counts(path)}
    assert found == {}, f"a hand-typed count (CONTRIBUTING.md): {found}"
    bad = tmp_path / "bad.md"  # and it finds them
    bad.write_text("the fast suite, 131 tests; all 149 tests, and 64 planted bugs; 2 cores\n")
    assert counts(bad) == ["131 tests", "149 tests", "64 planted bugs"]


def _test_names():  # every test function of the suite, by name
    import ast
    files = [ROOT / "test_fgrpo.py", *(ROOT / "tests").glob("test_*.py")]
    return {f.name for path in files for f in ast.walk(ast.parse(path.read_text()))
            if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}


def _cited_tests_missing(paths, names):
    """Every test_name a markdown file cites (not a file name) that no test file defines."""
    missing = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for name in re.findall(r"\b(test_\w+)\b(?!\.py|/)", line):
                if name not in names:
                    missing.append(f"{path.name}:{n}: {name}")
    return missing


def test_every_test_the_docs_cite_exists(tmp_path):
    docs = [*DOCS, *sorted((ROOT / "experiments" / "results").glob("*.md"))]
    names = _test_names()
    assert len(names) > 90 and "test_focal_weight_by_hand" in names
    assert not _cited_tests_missing(docs, names), "\n".join(_cited_tests_missing(docs, names))
    bad = tmp_path / "bad.md"  # and it finds a made-up name, not a file's
    bad.write_text("`test_focal_weight_by_hand`, test_fgrpo.py, tests/test_docs.py, test_no_such\n")
    assert _cited_tests_missing([bad], names) == ["bad.md:1: test_no_such"]


def test_make_help_lists_every_target():
    # each target of the Makefile says what it does in a ## comment, and make help prints it
    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-z0-9-]+):(?!=)", makefile, re.M)
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    listed = re.findall(r"^  make (\S+) ", out, re.M)
    assert len(targets) > 10 and listed == targets, (targets, listed)


# what a reader cannot open: the project's own notes, its tracker's threads, how it was hosted
UNSEEN = re.compile(r"\bSPEC\b|\b[Ii]ssues? \d+\b|\blent\b|\bdevice tool\b")


def _unseen_citations(paths):
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{n}: {line.strip()[:80]}"
            for p in paths
            for n, line in enumerate(p.read_text().splitlines(), 1) if UNSEEN.search(line)]


def test_code_and_docs_cite_only_what_a_reader_has(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.md", "Makefile", "*.ini", ".ci/run"],
                             cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert len(tracked) > 30, tracked  # (a git checkout)
    found = _unseen_citations([ROOT / name for name in tracked if (ROOT / name).exists()])
    assert not found, "\n".join(found)
    bad = tmp_path / "bad.md"  # and it finds each kind
    # not this file's own
    words = ["SP" + "EC Sec. 3", "is" + "sue 20", "no GPU was " + "le" + "nt"]
    bad.write_text("\n".join(words) + "\nSec. 4, Eq. 12 and pytorch#120601\n")
    assert [x.split(": ")[0] for x in _unseen_citations([bad])] == [f"{bad}:{n}" for n in (1, 2, 3)]

# ---------------------------------------------------------------- the figures the docs quote
# The figures the README and docs/ quote from a results file are that file's: each is read from
# the file, formatted as printed and looked for in the page, so a figure changed by hand in the
# text, or in the file, fails here. And a time measured by hand says where and when.
# 
# To add a figure: a line in FIGURES, Figure(page, the words as printed with a {} where each figure
# stands, the results file, what reads the figures from it). `at("rows/2/ratio")` reads a path of
# keys and list indices; anything else is a function of the file's JSON.
BENCH = "bench/results.json"
VERIFY = "bench/verify_results.json"
CALIBRATION = "checks/compare_calibration.json"
PARITY = "checks/parity_results.json"
MUTATION = "checks/mutation_results.json"
PEERS = "experiments/results/peers.json"


def peer_gap(gap):  # a peer's gap to F-DAPO as the README's table prints it
    if gap is None:
        return "no seed matched"
    return f"{gap['mean']:+.3f} [{gap['lo']:+.3f}, {gap['hi']:+.3f}]"
TWO = "experiments/results/two_strategy.json"
TINY = "experiments/results/table1_tiny.json"
CAT_LR3 = "experiments/results/categorical_adamw_lr0.001.json"
CAT_LR2 = "experiments/results/categorical_adamw_lr0.01_sgd_lr5000.json"
CI3 = "{:+.3f} [{:+.3f}, {:+.3f}]"  # a paired summary, mean [95% t interval]
DEMO = "docs/demo_output.json"  # make demo's output, as the README shows it
PROTOCOL = "experiments/see_it_happen_protocol.toml"
FLAGS = "fgrpo.py's flags"  # their defaults
PLAN = "experiments/table1.py --plan"  # its printed estimate
SEEN = "experiments/results/see_it_happen_confirmation.json"  # seeds 10-19, the protocol's
SHAPED = "experiments/results/see_it_happen_exploration.json"  # seeds 0-9


class Figure(NamedTuple):
    page: str  # README.md or docs/NAME.md
    text: str  # as printed, a {} (with its format) where each figure stands
    file: str  # the results file, from the repository's root (or a tuple of them)
    read: Callable  # the file's JSON (each file's) -> the figures, in the order of the {}s


def at(*paths):
    """A reader of paths like "rows/2/ratio": keys, and indices into lists."""
    def get(data, path):
        for key in path.split("/"):
            data = data[int(key)] if isinstance(data, list) else data[key]
        return data
    return lambda data: tuple(get(data, path) for path in paths)


# ---------------------------------------------------------------- readers of the files' parts
def bench_row(i, fmt_met=lambda met: {True: "yes", False: "**no**", None: "-"}[met]):
    """bench/results.json's row i: ours, alternative, ratio, target, met, as the table shows."""
    return lambda d: (*at(f"rows/{i}/ours", f"rows/{i}/alternative", f"rows/{i}/ratio")(d),
                      d["rows"][i]["target"] or "-", fmt_met(d["rows"][i]["met"]))


def parity(select):
    """The largest value and gradient differences of the parity rows `select` picks, and whether
    every one is equal, as integrations.md's table shows them."""
    def read(d):
        rows = [r for r in d["rows"] if select(r)]
        assert rows
        grads = [r["grad_diff"] for r in rows if r["grad_diff"] is not None]
        equal = {r["equal"] for r in rows}
        assert len(equal) == 1
        return (max(r["value_diff"] for r in rows), *([max(grads)] if grads else []),
                "yes" if equal.pop() else "no")
    return read


def calibration(d, n, test, setting):  # one row of checks/compare_calibration.json's results
    return next(r for r in d["results"]
                if (r["n"], r["test"], r["setting"]) == (n, test, setting))


def shown(row, k, band):  # a share at k as eval.md's table prints it: 3.6% (2.6-4.9)
    i = row["k"].index(k)
    low, high = row["wilson95"][i]
    return f"{100 * row['measured'][i]:.1f}%" + (f" ({100 * low:.1f}-{100 * high:.1f})"
                                                  if band else "")


def _z(d):  # the normal quantile of a two-sided test at the calibration's alpha
    return statistics.NormalDist().inv_cdf(1 - d["settings"]["alpha"] / 2)


def null_share(d, wide):  # normal theory: how often p < alpha when delta* is `wide` times too wide
    return 2 * (1 - statistics.NormalDist().cdf(_z(d) * wide))


def shrunk_spread(d):  # delta*'s spread at k = m = 256 of n = 1,024, shrunk by sqrt(m/(n - m))
    return calibration(d, 1024, "subsampling", "null")["spread_factor"][-1] / 3 ** 0.5


def paper_m(ev):  # eval.py's default m of --test subsampling at its default n (App. Q's)
    n = ev.build_parser().get_default("n")
    with contextlib.redirect_stdout(io.StringIO()):  # its note that m < n/2 is conservative
        return ev.subsample_size(SimpleNamespace(m=None, test="subsampling"), n), n


def calibration_row(n, test, setting, ks, band, last_band):
    """eval.md's cells of one row: the share at each of ks, then at the largest k."""
    def read(d):
        row = calibration(d, n, test, setting)
        return (*(shown(row, k, band) for k in ks), row["k"][-1],
                shown(row, row["k"][-1], last_band))
    return read


def shares(test, setting, key="measured", k=None):
    """Every n's shares (every k, or at k alone) of one test and setting, in %."""
    return lambda d: [100 * x for r in d["results"] if (r["test"], r["setting"]) == (test, setting)
                      for kk, x in zip(r["k"], r[key]) if k in (None, kk)]


def lowest_highest(read):
    return lambda d: (min(read(d)), max(read(d)))


def gap(optim, mix, arm, gamma):  # two_strategy.json: F minus gamma 0, mean [lo, hi]
    return at(*(f"runs/{optim}/mixes/{mix}/{arm}/{gamma}/gap/{x}" for x in ("mean", "lo", "hi")))


def every_two_strategy(part, mixes=("tie", "rare"), key="mean"):
    return lambda d: [d["runs"][o]["mixes"][m][arm][g][part][key] for o in ("adamw", "sgd")
                      for m in mixes for arm in ("sampled", "exact") for g in ("0.5", "1")]


def m_ret(optim, n, gamma, what="m_ret"):
    """A categorical run's mean and std over seeds at (N, gamma), as experiments/categorical.py's
    table computes them."""
    def read(d):
        runs = [r[what] for r in d["runs"]
                if r["optim"].startswith(optim + " ") and (r["n"], r["gamma"]) == (n, gamma)]
        return statistics.fmean(runs), statistics.stdev(runs)
    return read


def m_ret_row(n):  # a row of why-focal.md's App. J table: lr 1e-2 then lr 1e-3, gamma 0 then 1
    return Figure("docs/why-focal.md", f"| {n} |" + " {:.3f} +- {:.3f} |" * 4, (CAT_LR2, CAT_LR3),
                  lambda *runs: tuple(x for d in runs for g in (0.0, 1.0)
                                      for x in m_ret("adamw", n, g)(d)))


def weights(table, gamma, p, ns):  # two_strategy.json's w_N / limit at each N
    return at(*(f"derivation/{table}/{gamma}/{p}/{n}" for n in ns))


def clip(kind, gamma, logit):  # two_strategy.json: a logit's expected update, unclipped, clipped
    def read(d):
        row = next(c for c in d["derivation"]["clip"] if (c["kind"], c["gamma"]) == (kind, gamma))
        return row["unclipped"][logit], row["clipped"][logit]
    return read


def monte_carlo_z(d):  # the largest |Monte Carlo - prediction| / se over every check and logit
    return max(abs(m - p) / s for c in d["derivation"]["checks"]
               for m, p, s in zip(c["monte_carlo"], c["prediction"], c["se"]))


def seen(*path):  # a see_it_happen result's rare/tie condition, at a path of keys and indices
    def read(d):
        d = d["summary"]["conditions"]["rare/tie"]
        for key in path:
            d = d[key]
        return d
    return read


def seen_ci(*path):  # its paired summary at path: mean, lo, hi
    return lambda d: tuple(seen(*path, x)(d) for x in ("mean", "lo", "hi"))


def seen_focal_row(k):  # why-focal.md's table row at k: N 8, exact, N 8 minus exact
    return lambda d: (*seen_ci("frontier", "1/8", f"pass@{k}", "gap")(d),
                      *seen_ci("frontier", "1/exact", f"pass@{k}", "gap")(d),
                      *seen_ci("n_minus_exact", "1", f"pass@{k}")(d))


SEEN_KS = (2, 4, 8, 16, 32, 64, 128, 256)  # the k past 1 of every see_it_happen result
WORDS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def seen_ks(keep, *path):  # the first and last k whose paired summaries at path/pass@k keep holds
    def read(d):
        ks = [k for k in SEEN_KS if keep(seen(*path, f"pass@{k}")(d))]
        assert ks == [k for k in SEEN_KS if ks[0] <= k <= ks[-1]], ks  # a range: "k A to B"
        return ks[0], ks[-1]
    return read


def seen_arms(key, *arms):  # the value at key of each arm of the summary's "Every arm" table
    return lambda d: [seen("arms", arm, key)(d) for arm in arms]


def seen_above(d):  # why-focal.md: where F at N 8 is above DAPO, on seeds and on levels
    n = seen("frontier", "1/8", "pass@16", "gap", "n")(d)
    by_k = {k: seen("frontier", "1/8", f"pass@{k}")(d) for k in SEEN_KS}
    return (*seen_ks(lambda c: c["gap"]["lo"] > 0, "frontier", "1/8")(d), n, n,
            *seen_ks(lambda c: c["gap"]["positive"] == n, "frontier", "1/8")(d),
            *sorted(sorted(SEEN_KS, key=lambda k: -by_k[k]["gap"]["mean"])[:2]),
            *seen_ks(lambda c: all(s["lo"] > 0 for s in c["by_level"]), "frontier", "1/8")(d),
            WORDS[sum(s["lo"] <= 0 for s in by_k[64]["by_level"])])


def tiny_pass256(d):  # table1_tiny.json: pass@256 (%) of the base model and every run
    return [100 * r["mean"]["math_avg"]["256"] for r in d["runs"].values()]


def demo_line(start):  # the line of make demo's output that starts so
    return lambda d: next(line for line in d["stdout"] if line.startswith(start))


def demo_summary(d):  # the README's reading of the demo's output: reward and held-out pass@k
    base, after = (demo_line(f"| {m} |")(d).split(" | ")[1].split("/")
                   for m in ("runs/demo/tiny_seed0/model", "runs/demo/step_000150"))
    rewards = [float(demo_line(f"step {k}/150 ")(d).split()[3]) for k in (1, 150)]
    return (*rewards, base[0], after[0], base[1], after[1], d["wall_s"], d["commit"])


def paper_run(table1):  # the paper's run by table1.py's constants: minutes, hours, disk
    steps = 10 * table1.DEEPSCALER // 256
    hours = [steps * minutes / 60 for minutes in table1.PLAN_STEP_MIN]
    return (*table1.PLAN_STEP_MIN, *hours, *(table1.PLAN_GPUS * h for h in hours), steps,
            table1.PLAN_CKPT_BYTES * table1.PLAN_PARAMS_B)


def plan_estimate(printed):  # --plan's GPU-hours (to hundreds), days and disk, as printed
    hours = re.search(r"~([\d,]+)-([\d,]+) GPU-hours", printed).groups()
    return (*(round(int(h.replace(",", "")), -2) for h in hours),
            *re.search(r"~(\d+)-(\d+) days", printed).groups(),
            *re.search(r"~(\d+) GB of disk \(~(\d+) GB more", printed).groups())


def plan_evaluation(table1):  # table1.py's estimate of one evaluation of the six math benchmarks
    args = SimpleNamespace(params_b=None, model="Qwen/Qwen2.5-7B", eval_flags="")
    cost = table1.estimate(SimpleNamespace(kind="eval"), args)
    problems = sum(table1.BENCH_SIZES[name] for name in table1.SIX_MATH.split(","))
    n = evaluator.build_parser().get_default("n")
    return (problems, n, *cost.gpu_hours, cost.disk_gb,
            cost.disk_gb * 1e9 / (problems * n * table1.PLAN_TOKENS[1]))


GPU_CHECK = "checks/gpu_check.py"
REHEARSAL = "checks/gpu_rehearsal.json"  # make gpu-check's CPU rehearsal, on the one-GPU stack


def gpu_plan_minutes(g):  # gpu_check.py's plan in minutes, without vLLM and with its starts
    plan = sum(g.PLAN_S.values())
    return plan / 60, (plan + g.VLLM_START_S + g.VLLM_COMMAND_S) / 60


def check_gpus_bytes(code):  # the bytes a parameter fgrpo.check_gpus plans for
    return int(re.search(r"return (\d+) \* params", inspect.getsource(code.gpu_plan_gib))[1])


def collective_hours(code):  # how long a collective of fgrpo.train waits
    return int(re.search(r"timedelta\(hours=(\d+)\)", inspect.getsource(code))[1])


# docs/paper-run.md's memory and time plan for Qwen2.5-7B, redone from the code: table1.py's plan
# constants and model size, gpu_check.py's Qwen2.5-7B shapes, fgrpo.py's defaults and check_gpus
PAPER_RUN = ("experiments/table1.py", GPU_CHECK, FLAGS, "fgrpo.py")
CARDS_GB = (80, 141)  # an H100's and an H200's memory, as NVIDIA's data sheets name the cards
CUDA_CONTEXT_GB = 3  # "a few GB of CUDA context", as the page's formula says it


def saves(steps, minutes_a_step, every, save_minutes):  # checkpoints --save-* write in a run
    count, last = 0, 0
    for step in range(1, steps + 1):
        if step % every == 0 or step == steps or (step - last) * minutes_a_step >= save_minutes:
            count, last = count + 1, step
    return count


def paper_sizes(table1, gpu_check, flags, code):  # bytes, minutes and counts, by name
    shape, params, gpus = gpu_check.QWEN25_7B, table1.PARAMS_B["Qwen/Qwen2.5-7B"], table1.PLAN_GPUS
    hidden, vocab, layers = shape["hidden_size"], shape["vocab_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * hidden // shape["num_attention_heads"]
    attention = 2 * (hidden * hidden + hidden * kv + kv) + hidden  # q, o; k, v; q, k, v's biases
    tokens = flags["--max-prompt-len"] + flags["--max-new-tokens"]
    steps = flags["--epochs"] * table1.DEEPSCALER // flags["--prompts"]
    per_param = check_gpus_bytes(code)
    assert per_param == 4 + 4 + 8  # fp32 weights, gradients, AdamW's two moments
    s = dict(params=params, gpus=gpus, per_param=per_param, tokens=tokens, steps=steps,
             fp32=4 * params, optimizer=8 * params, bf16=2 * params,
             shard=4 * params / gpus, adam=8 * params / gpus,
             layer=2 * (attention + 3 * hidden * shape["intermediate_size"] + 2 * hidden) / 1e9,
             root=2 * 2 * vocab * hidden / 1e9, kv_token=layers * 2 * kv * 2,
             activations=layers * flags["--micro-batch"] * tokens * hidden * 2 / 1e9,
             chunk=inspect.signature(code.token_logprobs).parameters["chunk"].default,
             completions=flags["--prompts"] * flags["--n"] // gpus)
    s["chunk_gb"] = s["chunk"] * vocab * 4 * 2 / 1e9  # fp32 logits and their log-softmax
    s["logits"] = flags["--micro-batch"] * tokens * vocab * 4 / 1e9
    s["training"] = (2 * s["shard"] + s["adam"] + 2 * s["layer"] + s["root"] + s["activations"]
                     + s["chunk_gb"])
    s["resident"] = s["shard"] + s["adam"]
    s["rollout"] = [s["completions"] * n / rate / 60
                    for n, rate in zip(table1.PLAN_TOKENS, reversed(table1.PLAN_DECODE))]
    s["hours"] = [steps * minutes / 60 for minutes in table1.PLAN_STEP_MIN]
    s["saves"] = [saves(steps, m, flags["--save-every"], flags["--save-minutes"])
                  for m in table1.PLAN_STEP_MIN]
    s["every_50th"] = saves(steps, 1, flags["--save-every"], 100000)  # --save-minutes 100000
    s["disk_tb"] = [(n * s["fp32"] + s["optimizer"]) / 1e3 for n in (*s["saves"], s["every_50th"])]
    return s


def card(s, flags, gb):  # on a card of gb: the largest safe --vllm-mem, vLLM's share, KV cache
    share = flags["--vllm-mem"] * gb
    return ((gb - s["resident"] - CUDA_CONTEXT_GB) / gb, share, share - s["bf16"],
            round((share - s["bf16"]) * 1e9 / s["kv_token"], -4) / 1e3)


def sized(read):  # a reader of PAPER_RUN's sources through paper_sizes: read(sizes, t1, flags)
    return lambda t1, gc, flags, code: read(paper_sizes(t1, gc, flags, code), t1, flags)


W8 = (2, 4, 8, 16, 64)
FIGURES = [
    # ------------------------------------------------ README.md: make demo's output, the code
    *(Figure("README.md", "{}", DEMO, demo_line(f"step {k}/150 ")) for k in (1, 2, 50, 150)),
    *(Figure("README.md", "{}", DEMO, demo_line(f"| {m} |"))
      for m in ("runs/demo/tiny_seed0/model", "runs/demo/step_000150")),
    Figure("README.md", "In 150 steps the reward goes from {:.2f} to {:.2f}, and held-out pass@1 "
           "from {} to {} (pass@8: {} to {}); `make demo` took {} s on 2 shared cores at commit "
           "{}.", DEMO, demo_summary),
    Figure("README.md", "about {}-{} minutes a step on 8 H100s, so {:.0f}-{:.0f} hours, {:.0f}-"
           "{:,.0f} GPU-hours, for the {:,} steps of 10 epochs; {:.0f} GB of disk",
           "experiments/table1.py", paper_run),
    Figure("README.md", "{:,}-{:,} GPU-hours for the six trainings and seven evaluations, **about "
           "{}-{} days on one 8-GPU node**; about {} GB of disk, {} GB more", PLAN, plan_estimate),
    Figure("README.md", "| " + " | ".join(["{} / {}"] * 6) + " |", "experiments/table1.py",
           lambda t: tuple(x for run in ("grpo", "f-grpo", "dapo", "f-dapo", "cispo", "f-cispo")
                           for x in t.PAPER[run])),
    Figure("README.md", "**GRPO {:.1f}, DAPO {:.1f}, CISPO {:.1f}**", "fgrpo.py",
           lambda m: tuple(m.PAPER_GAMMA[a] for a in ("grpo", "dapo", "cispo"))),
    Figure("README.md", "in a plan of {:.0f} minutes ({:.0f} with vLLM)", GPU_CHECK,
           gpu_plan_minutes),
    Figure("README.md", "Both are accepted on {:.0%} of the problems, only the last on {:.0%}, "
           "only the first on {:.0%}", PROTOCOL,
           at("mixes/tie/both", "mixes/tie/rare", "mixes/tie/common")),
    Figure("README.md", "the confirmation: {:.0f} h on 2 cores", SEEN,
           lambda d: d["times"]["wall_s"] / 3600),

    # ------------------------------------------------ docs/bench.md: make bench's table
    Figure("docs/bench.md", "(AMD EPYC, {:.1f} GB), torch {}, in a fresh clone and virtual "
           "environment at commit {}", BENCH, lambda d: (
               d["machine"]["memory_gb"], d["machine"]["versions"]["torch"],
               d["machine"]["commit"].split("+")[0])),
    Figure("docs/bench.md", "| log-probs 4 x 1024, vocab 151,936: peak memory | {:,.0f} MB | "
           "{:,.0f} MB | {:.3f} | {} | {} |", BENCH, bench_row(0)),
    Figure("docs/bench.md", "| log-probs 4 x 1024: forward + backward time | {:.1f} s | {:.1f} s "
           "| {:.2f} | {} | {} |", BENCH, bench_row(1)),
    Figure("docs/bench.md", "| verify 200 x 256 against verl's reward called serially | {:,.0f} /s "
           "| {:,.0f} /s | {:.2f} | {} | {} |", BENCH, bench_row(2)),
    Figure("docs/bench.md", "| training step vs TRL GRPOTrainer: wall time | {:.3f} s/step | "
           "{:.3f} s/step | {:.3f} | {} | {} |", BENCH, bench_row(3)),
    Figure("docs/bench.md", "| training step vs TRL GRPOTrainer: peak memory | {:.1f} MB | "
           "{:.1f} MB | {:.2f} | {} | {} |", BENCH, bench_row(4)),
    Figure("docs/bench.md", "| rollout 32 x 8, demo model, 6 new tokens: vLLM vs generate() | "
           "{:,.0f} tok/s | {:,.0f} tok/s | {:.3f} | {} | {} |", BENCH, bench_row(5)),
    Figure("docs/bench.md", "| rollout 256 x 8, demo model, 6 new tokens | {:,.0f} tok/s | "
           "{:,.0f} tok/s | {:.3f} | {} | {} |", BENCH, bench_row(6)),
    Figure("docs/bench.md", "| rollout 8 x 8, random-init tiny, <= 256 new tokens | {:,.0f} tok/s "
           "| {:,.0f} tok/s | {:.2f} | {} | {} |", BENCH, bench_row(7)),
    Figure("docs/bench.md", "| rollout 32 x 8, random-init tiny, <= 256 new tokens | {:,.0f} "
           "tok/s | {:,.0f} tok/s | {:.2f} | {} | {} |", BENCH, bench_row(8)),
    Figure("docs/bench.md", "response-only logits | {:.1f} s | {:.1f} s | {:.3f} | {} | {} |",
           BENCH, bench_row(9)),
    Figure("docs/bench.md", "The table's commit is `{}` in `bench/results.json`", BENCH,
           at("machine/commit")),
    # ... and its rows' reading
    Figure("docs/bench.md", "so {:,} of the {:,} (completion, gold) pairs are distinct", BENCH,
           at("raw/verify/distinct_pairs", "raw/verify/completions")),
    Figure("docs/bench.md", "The time ratio was 0.994 at commit 25a3776 and is {:.2f} at 561a9ef",
           BENCH, at("rows/1/ratio")),
    Figure("docs/bench.md", "On the demo's 6-token answers vLLM is about {:.1f}x slower", BENCH,
           lambda d: 1 / d["rows"][5]["ratio"]),
    Figure("docs/bench.md", "On the demo's 6-token answers vLLM is about {:.1f}x slower", BENCH,
           lambda d: 1 / d["rows"][6]["ratio"]),
    Figure("docs/bench.md", "it wins, {:.2f}x at 8 prompts x 8 and {:.1f}x at 32 x 8", BENCH,
           at("rows/7/ratio", "rows/8/ratio")),
    Figure("docs/bench.md", "drawn with Zipf weights; {:.0%} long-tail answers; {:.0%} without "
           "`\\boxed{{}}`)", "bench/verify.py", lambda m: (m.TAIL, m.NO_BOX)),
    Figure("docs/bench.md", "the row measures the workers alone, and {} workers on {} cores can "
           "give at most {}x", BENCH, lambda d: (d["machine"]["usable_cores"],) * 3),
    Figure("docs/bench.md", "far more than in a 7B (about {:.0%} of its forward FLOPs)",
           "checks/gpu_check.py", lambda g: g.QWEN25_7B["vocab_size"] * g.QWEN25_7B["hidden_size"]
           / g.QWEN25_7B_PARAMS),
    Figure("docs/bench.md", "{:.1%} of the forwards' positions are padding against {:.1%}", BENCH,
           at("raw/lengths/fgrpo/0/pad_frac", "raw/lengths/plain/0/pad_frac")),
    # ------------------------------------------------ docs/gpu-check.md: gpu_check.py's plan, its
    # CPU rehearsal's results
    Figure("docs/gpu-check.md", "in a plan of {:.0f} minutes ({:.0f} with vLLM) counted from the "
           "process's start", GPU_CHECK, gpu_plan_minutes),
    *(Figure("docs/gpu-check.md", "| {} s | {:.0f} s |", (GPU_CHECK, REHEARSAL),
             lambda g, d, n=name: (g.PLAN_S[n], d["seconds"][n]))
      for name in ("setup", "logprobs", "step", "command")),
    Figure("docs/gpu-check.md", "| total | | | {} s | {:.0f} s |", (GPU_CHECK, REHEARSAL),
           lambda g, d: (sum(g.PLAN_S.values()), sum(d["seconds"].values()))),
    Figure("docs/gpu-check.md", "at commit {}, on 2 shared CPU cores, torch {} and transformers {} "
           "without vLLM; `make gpu-check` took {:.0f} s in all", REHEARSAL,
           lambda d: (d["rehearsal"]["commit"], d["torch"], d["setup"]["transformers"],
                      d["rehearsal"]["make_wall_s"])),
    Figure("docs/gpu-check.md", "the plan adds its starts, {} s to the step part and {} s to the "
           "command part", GPU_CHECK, lambda g: (g.VLLM_START_S, g.VLLM_COMMAND_S)),
    Figure("docs/gpu-check.md", "in a share of its own, {} s", GPU_CHECK, lambda g: g.COMMAND_S),
    # ------------------------------------------------ docs/verification.md: verify's own run
    Figure("docs/verification.md", "at commit {} on 2 idle Intel Xeon cores, 16 a message gave "
           "{:.2f}x of verl's serial reward", VERIFY,
           lambda d: (d["machine"]["commit"].split("+")[0], d["rows"][0]["ratio"])),
    Figure("docs/verification.md", "(`timeout`, {:g} s by default", "fgrpo.py",
           lambda m: inspect.signature(m.verify).parameters["timeout"].default),
    # ------------------------------------------------ README.md: the peers' verdicts
    Figure("README.md", "at pass@{} at matched pass@1, Holm-adjusted over the peers: {}.", PEERS,
           lambda d: (d["summary"]["headline_k"], "; ".join(
               f"{peer}: {r['verdict']}" for peer, r in d["summary"]["primary"].items()))),
    *(Figure("README.md", "| " + peer + " | {} | {:.3f} | {} |", PEERS, lambda d, peer=peer: (
        peer_gap(d["summary"]["primary"][peer]["gap"]), d["summary"]["top_pass1"][peer]["mean"],
        d["summary"]["primary"][peer]["verdict"]))
      for peer in ("pkpo", "passk_training", "unlikeliness", "w_reinforce", "maxrl", "darling")),
    Figure("README.md", "| f_dapo | (itself) | {:.3f} |", PEERS,
           lambda d: d["summary"]["top_pass1"]["f_dapo"]["mean"]),
    # ------------------------------------------------ docs/verified-where.md
    Figure("docs/verified-where.md", "| pytest {:.0f} s (the unchanged copy", MUTATION,
           lambda d: float(re.search(r" in ([\d.]+)s ", d["baseline"]["detail"]).group(1))),
    Figure("docs/verified-where.md", "| {} of {} caught, {} timed out", MUTATION, lambda d: (
        sum(m["status"] == "caught" for m in d["mutants"]), len(d["mutants"]),
        sum(m["status"] == "TIMEOUT" for m in d["mutants"]))),
    Figure("docs/verified-where.md", "| {} of {} rows as expected", PARITY, lambda d: (
        sum(r["equal"] == r["expect_equal"] for r in d["rows"]), len(d["rows"]))),
    # ------------------------------------------------ docs/integrations.md: the parity table
    Figure("docs/integrations.md", "norm_adv_by_std_in_grpo True | 0 | {:.3g} | {} |", PARITY,
           parity(lambda r: r["quantity"] == "advantages" and r["peer"].startswith("verl"))),
    Figure("docs/integrations.md", "| `group_advantages` | TRL's formula with its nanstd | "
           "scale_rewards 'group' (std + 1e-4) | 0 | {:.3g} | {} |", PARITY,
           parity(lambda r: r["quantity"] == "advantages" and r["peer"].startswith("TRL"))),
    Figure("docs/integrations.md", "| `group_advantages(eps=1e-4)` | TRL's formula with its nanstd "
           "| scale_rewards 'group' (std + 1e-4) | 0 | {:.3g} | {} |", PARITY,
           parity(lambda r: r["quantity"] == "advantages, fgrpo eps=1e-4")),
    Figure("docs/integrations.md", "clip_ratio_c 1e9 (dual clip off) | 0, 0.5, 1 | {:.3g} / {:.3g} "
           "| {} |", PARITY, parity(lambda r: "1e9" in r["settings"])),
    Figure("docs/integrations.md", "clip_ratio_c 3 (verl's default) | 0, 0.5, 1 | {:.3g} / {:.3g} "
           "| {} |", PARITY, parity(lambda r: "dual_clip=3" in r["quantity"])),
    Figure("docs/integrations.md", "| grpo, dapo | TRL `_compute_loss` | loss_type 'dapo', "
           "epsilon/epsilon_high = `PAPER_EPS` | 0, 0.5, 1 | {:.3g} / {:.3g} | {} |", PARITY,
           parity(lambda r: "loss_type 'dapo'" in r["settings"])),
    Figure("docs/integrations.md", "clip_ratio_low 1.0, clip_ratio_high 5.0 | 0, 0.5, 1 | "
           "{:.3g} / {:.3g} | {} |", PARITY,
           parity(lambda r: r["settings"] == "clip_ratio_low 1.0, clip_ratio_high 5.0")),
    Figure("docs/integrations.md", "loss_type 'cispo', epsilon_high 6.0 | 0, 0.5, 1 | {:.3g} / "
           "{:.3g} | {} |", PARITY, parity(lambda r: r["settings"].endswith("epsilon_high 6.0"))),
    Figure("docs/integrations.md", "clip_ratio_c left at 3 (dual clip on) | 0 | {:.3g} / {:.3g} | "
           "{} |", PARITY, parity(lambda r: "left at 3" in r["settings"])),
    Figure("docs/integrations.md", "loss_type 'grpo' (a mean per sequence) | 0 | {:.3g} / {:.3g} "
           "| {} |", PARITY, parity(lambda r: "loss_type 'grpo'" in r["settings"])),
    Figure("docs/integrations.md", "clip_ratio_low left at 0.2, clip_ratio_high 5.0 | 0 | {:.3g} / "
           "{:.3g} | {} |", PARITY, parity(lambda r: "low left at 0.2" in r["settings"])),
    Figure("docs/integrations.md", "epsilon_high 5.0 (TRL's documented value) | 0 | {:.3g} / "
           "{:.3g} | {} |", PARITY, parity(lambda r: "documented" in r["settings"])),
    Figure("docs/integrations.md", "epsilon_high unset (= epsilon, 0.2) | 0 | {:.3g} / {:.3g} | "
           "{} |", PARITY, parity(lambda r: "unset" in r["settings"])),
    # ------------------------------------------------ docs/eval.md: --compare's calibration
    Figure("docs/eval.md", "at k = 1 it is {:.1%}, {:.1%}, {:.1%} and {:.1%} at n = 16, 64, 256 "
           "and 1,024", CALIBRATION, lambda d: tuple(
               r["exact_level_k1"] for r in d["results"] if "exact_level_k1" in r)),
    Figure("docs/eval.md", "pass@k only asks whether a problem was ever solved, {:.0f} to {:.0f}% "
           "(measured)", CALIBRATION, lambda d: lowest_highest(lambda d: [
               100 * r["measured"][-1] for r in d["results"]
               if (r["test"], r["setting"]) == ("permutation", "null")])(d)),
    Figure("docs/eval.md", "(commit 0d38fc3; {:,} s of wall clock (its `seconds`)", CALIBRATION,
           at("seconds")),
    Figure("docs/eval.md", "the process group's timeout is {} days", "eval.py",
           lambda m: int(re.search(r"timedelta\(days=(\d+)\)", inspect.getsource(m)).group(1))),
    Figure("docs/eval.md", "n/4 by default (the paper's {} of {:,})", "eval.py", paper_m),
    Figure("docs/eval.md", "At the paper's m = n/4 delta* is sqrt(3) = {:.2f} times too wide, so "
           "p < 0.05 needs |delta| above {:.2f} * {:.2f} = {:.2f} of its standard deviations: "
           "equally good checkpoints get p < 0.05 about {:.1%} of the time, not {:.0%}.",
           CALIBRATION, lambda d: (3 ** 0.5, _z(d), 3 ** 0.5, _z(d) * 3 ** 0.5,
                                   null_share(d, 3 ** 0.5), d["settings"]["alpha"])),
    Figure("docs/eval.md", "too often (about {:.0%} at m = 3n/4, by the same theory)", CALIBRATION,
           lambda d: null_share(d, (1 / 3) ** 0.5)),
    Figure("docs/eval.md", "the test would stay conservative there ({:.2f} times too wide: about "
           "{:.1%} for {:.0%})", CALIBRATION, lambda d: (
               shrunk_spread(d), null_share(d, shrunk_spread(d)), d["settings"]["alpha"])),
    Figure("docs/eval.md", "draws {:,} pairs of folders per row, {} problems at rates spaced "
           "geometrically from {:g} to {:g}", CALIBRATION,
           at("settings/repeats", "settings/problems", "settings/low", "settings/high")),
    Figure("docs/eval.md", "runs --compare's own steps on each with {:,} redraws", CALIBRATION,
           at("settings/iters")),
    Figure("docs/eval.md", "B's odds of a right answer {:g}^sqrt(1024/n) times A's ({:g} at n = "
           "1,024, {:.2f} at 16", CALIBRATION, lambda d: (
               d["settings"]["odds"], d["settings"]["odds"], d["settings"]["odds"] ** 8)),
    Figure("docs/eval.md", "where a calibrated {:.0%} test finds the difference {:.0f} to {:.0f}% "
           "of the time at k = 1 (normal theory, exact variances)", CALIBRATION, lambda d: (
               d["settings"]["alpha"],
               *lowest_highest(shares("permutation", "power", "predicted", k=1))(d))),
    Figure("docs/eval.md", "| 16 | permutation | equally good | {} | {} | {} | k = {}: {} |",
           CALIBRATION, calibration_row(16, "permutation", "null", (1, 4, 16), True, False)),
    Figure("docs/eval.md", "| 16 | permutation | B better | {} | {} | {} | k = {}: {} |",
           CALIBRATION, calibration_row(16, "permutation", "power", (1, 4, 16), False, False)),
    Figure("docs/eval.md", "| 16 | subsampling (4) | equally good | {} | {} | | k = {}: {} |",
           CALIBRATION, calibration_row(16, "subsampling", "null", (1, 4), True, False)),
    Figure("docs/eval.md", "| 16 | subsampling (4) | B better | {} | {} | | k = {}: {} |",
           CALIBRATION, calibration_row(16, "subsampling", "power", (1, 4), False, False)),
    *(Figure("docs/eval.md", f"| {n} | permutation | equally good | {{}} | {{}} | {{}} | "
             "k = {}: {} |", CALIBRATION,
             calibration_row(n, "permutation", "null", (1, 4, 16), True, True))
      for n in (64, 256, 1024)),
    *(Figure("docs/eval.md", f"| {n} | {test} | {setting} | {{}} | {{}} | {{}} | k = {{}}: {{}} |",
             CALIBRATION, calibration_row(n, test.split()[0], key, (1, 4, 16), key == "null",
                                          False))
      for n, m in ((64, 16), (256, 64), (1024, 256))
      for test, setting, key in (("permutation", "B better", "power"),
                                 (f"subsampling ({m})", "equally good", "null"),
                                 (f"subsampling ({m})", "B better", "power"))),
    Figure("docs/eval.md", "Over every k, the permutation test's null shares lie between {:.1f}% "
           "and {:.1f}%", CALIBRATION, lowest_highest(shares("permutation", "null"))),
    Figure("docs/eval.md", "a calibrated test's count of 1,000 falls in {} to {} (its 95%",
           CALIBRATION, lambda d: tuple(calibration(d, 16, "permutation", "null")
                                        ["calibrated_band95"])),
    Figure("docs/eval.md", "and at k = 1 of n = 16, whose exact level is {:.1%}", CALIBRATION,
           lambda d: calibration(d, 16, "permutation", "null")["exact_level_k1"]),
    Figure("docs/eval.md", "({:.0f} to {:.0f}% at k = 1, {:.0f} to {:.0f}% at k = 4, {:.0f} to "
           "{:.0f}% at k = 16)", CALIBRATION, lambda d: tuple(
               x for k in (1, 4, 16)
               for x in lowest_highest(shares("permutation", "power", "predicted", k))(d))),
    Figure("docs/eval.md", "says p < 0.05 for equally good checkpoints {:.1f} to {:.1f}% of the "
           "time and finds the difference {:.0f} to {:.0f}% of the time at k = 1 where the "
           "permutation test finds it {:.0f} to {:.0f}%", CALIBRATION, lambda d: (
               *lowest_highest(shares("subsampling", "null"))(d),
               *lowest_highest(shares("subsampling", "power", k=1))(d),
               *lowest_highest(shares("permutation", "power", k=1))(d))),
    Figure("docs/eval.md", "({:.2f} times at k = m = 256 of n = 1,024", CALIBRATION,
           lambda d: calibration(d, 1024, "subsampling", "null")["spread_factor"][-1]),
    Figure("docs/eval.md", "(pass@1 {:.1f}%, pass@256 {:.1f}%); DAPO's run never finds it on one "
           "of the 64 problems (pass@256 {:.1f}%)", TINY, lambda d: (
               *(100 * d["runs"]["base"]["mean"]["held_out"][k] for k in ("1", "256")),
               100 * d["runs"]["dapo"]["mean"]["held_out"]["256"])),
    Figure("docs/eval.md", "F-DAPO minus DAPO is {:+.1f} points of pass@1 (p {:.3f}) and {:+.1f} "
           "at k = 256 (p {:.3f})", TINY, lambda d: tuple(
               x for k in ("1", "256") for x in (
                   100 * d["pairs"]["dapo"]["columns"]["held_out"]["mean"][k][0],
                   d["pairs"]["dapo"]["columns"]["held_out"]["p"][k][0]))),
    # ------------------------------------------------ docs/paper-run.md: the memory and time plan
    Figure("docs/paper-run.md", "instead of copying {:.0f} GB to pinned host memory", PAPER_RUN,
           sized(lambda s, t1, f: s["bf16"])),
    Figure("docs/paper-run.md", "Memory and time: Qwen2.5-7B on {} x {} GB or {} x {} GB Per GPU, "
           "with FSDP2 over {} ranks ({:g}B parameters)", PAPER_RUN,
           sized(lambda s, t1, f: (s["gpus"], CARDS_GB[0], s["gpus"], CARDS_GB[1], s["gpus"],
                                   s["params"]))),
    Figure("docs/paper-run.md", "| fp32 master weights (sharded) | {:g}B x {} B / {} = {:.1f} GB | "
           "| fp32 gradients (sharded) | {:.1f} GB | | AdamW moments, fp32 (sharded) | {:.1f} GB |",
           PAPER_RUN, sized(lambda s, t1, f: (s["params"], 4, s["gpus"], s["shard"], s["shard"],
                                              s["adam"]))),
    Figure("docs/paper-run.md", "one decoder layer at a time ({:.1f} GB, plus one prefetched), and "
           "the root's embedding and lm_head ({:.1f} GB) | | activations, micro-batch {} x {:,} "
           "tokens, checkpointed | about {:.0f} GB of layer inputs", PAPER_RUN,
           sized(lambda s, t1, f: (s["layer"], s["root"], f["--micro-batch"], s["tokens"],
                                   s["activations"]))),
    Figure("docs/paper-run.md", "one {}-position chunk of fp32 logits and its log-softmax: {:.1f} "
           "GB (the full logits alone would be {:.0f} GB) | | vLLM while awake (`--vllm-mem "
           "{:g}`) | {:.0f} GB: bf16 weights {:.0f} GB, the rest KV cache ({:.0f} KB per token: "
           "about {:.0f}k tokens) |", PAPER_RUN, sized(lambda s, t1, f: (
               s["chunk"], s["chunk_gb"], s["logits"], f["--vllm-mem"], card(s, f, CARDS_GB[0])[1],
               s["bf16"], s["kv_token"] / 1e3, card(s, f, CARDS_GB[0])[3]))),
    Figure("docs/paper-run.md", "So training holds about {:.0f} GB, plus one layer's "
           "recomputation.", PAPER_RUN, sized(lambda s, t1, f: s["training"])),
    Figure("docs/paper-run.md", "resident fp32 weight and AdamW shards ({:.1f} GB): that share "
           "plus those {:.1f} GB and a few GB of CUDA context must fit, so the largest safe "
           "`--vllm-mem` is about ({} - {:.1f} - {}) / {} = {:.1f} on {} GB.", PAPER_RUN,
           sized(lambda s, t1, f: (s["resident"], s["resident"], CARDS_GB[0], s["resident"],
                                   CUDA_CONTEXT_GB, CARDS_GB[0], card(s, f, CARDS_GB[0])[0],
                                   CARDS_GB[0]))),
    Figure("docs/paper-run.md", "| at the default {:g}: vLLM's share, KV cache after {:.0f} GB of "
           "weights |", PAPER_RUN, sized(lambda s, t1, f: (f["--vllm-mem"], s["bf16"]))),
    *(Figure("docs/paper-run.md", f"| {{}} GB ({names}) | about {{:.1f}} | {{:.0f}} GB, {{:.0f}} "
             "GB (about {:.0f}k tokens) |", PAPER_RUN,
             sized(lambda s, t1, f, gb=gb: (gb, *card(s, f, gb)))) for gb, names in zip(
                 CARDS_GB, ("A100, H100", "H200"))),
    Figure("docs/paper-run.md", "One GPU alone does not hold a 7B run: {} bytes a parameter is "
           "{:.0f} GB before vLLM's share", PAPER_RUN,
           sized(lambda s, t1, f: (s["per_param"], s["per_param"] * s["params"]))),
    Figure("docs/paper-run.md", "rank 0 alone loads the fp32 model ({:.0f} GB;", PAPER_RUN,
           sized(lambda s, t1, f: s["fp32"])),
    Figure("docs/paper-run.md", "gathers the full fp32 model on rank 0 ({:.0f} GB).", PAPER_RUN,
           sized(lambda s, t1, f: s["fp32"])),
    Figure("docs/paper-run.md", "each rank samples {} completions; at {:,}-{:,} tokens each and a "
           "few thousand tokens/s of vLLM decode per GPU, the rollout takes {:.1f}-{:.0f} minutes.",
           PAPER_RUN, sized(lambda s, t1, f: (s["completions"], *t1.PLAN_TOKENS, *s["rollout"]))),
    Figure("docs/paper-run.md", "So roughly {}-{} minutes per step, over the paper's {} epochs "
           "({:,} steps: {} x {:,} problems // {} prompts)", PAPER_RUN, sized(lambda s, t1, f: (
               *t1.PLAN_STEP_MIN, f["--epochs"], s["steps"], f["--epochs"], t1.DEEPSCALER,
               f["--prompts"]))),
    Figure("docs/paper-run.md", "At Qwen2.5-7B ({:g}B parameters) the model is {:.0f} GB in fp32 "
           "and the optimizer state {:.0f} GB, so the latest checkpoint is {:.0f} GB and each kept "
           "one adds {:.0f} GB. Every saved step is kept, and a step is saved every `--save-every` "
           "({}) steps *and* whenever `--save-minutes` ({:g}) have passed since the last save: at "
           "{}-{} minutes a step (the estimate above) that is a save every {} to {} steps, about "
           "{:.0f}-{:.0f} checkpoints over the paper's {:,} steps, {:.1f}-{:.1f} TB a run.",
           PAPER_RUN, sized(lambda s, t1, f: (
               s["params"], s["fp32"], s["optimizer"], t1.PLAN_CKPT_BYTES * s["params"],
               s["fp32"], f["--save-every"], f["--save-minutes"], *t1.PLAN_STEP_MIN,
               *(math.ceil(f["--save-minutes"] / m) for m in reversed(t1.PLAN_STEP_MIN)),
               *(round(n, -1) for n in s["saves"]), s["steps"], *s["disk_tb"][:2]))),
    Figure("docs/paper-run.md", "with `--save-minutes 100000` only every {}th step and the last "
           "are saved ({} kept, about {:.0f} TB), at the price of losing up to {} steps "
           "({:.0f}-{:.0f} hours) to a kill.", PAPER_RUN, sized(lambda s, t1, f: (
               f["--save-every"], s["every_50th"], s["disk_tb"][2], f["--save-every"],
               *(f["--save-every"] * m / 60 for m in t1.PLAN_STEP_MIN)))),
    Figure("docs/paper-run.md", "a checkpoint of a 7B writes about {:.0f} GB", PAPER_RUN,
           sized(lambda s, t1, f: t1.PLAN_CKPT_BYTES * s["params"])),
    Figure("docs/paper-run.md", "(`--grace`, {:g} s by default", FLAGS, lambda f: f["--grace"]),
    Figure("docs/paper-run.md", "a collective waits up to {} hours", "fgrpo.py", collective_hours),
    Figure("docs/paper-run.md", "downloads a 7B or writes a {:.0f} GB checkpoint", PAPER_RUN,
           sized(lambda s, t1, f: s["fp32"])),
    # ------------------------------------------------ docs/table1.md: the estimate, the tiny run
    Figure("docs/table1.md", "On disk one checkpoint ({:.0f} GB)", "experiments/table1.py",
           lambda t: t.PLAN_CKPT_BYTES * t.PLAN_PARAMS_B),
    Figure("docs/table1.md", "The six math benchmarks ({:,} problems) at n = {}: {:.0f}-{:.0f} "
           "GPU-hours, and up to {:.0f} GB of samples (about {:.0f} bytes of JSON a token)",
           "experiments/table1.py", plan_evaluation),
    Figure("docs/table1.md", "`k` [{}, {}], {}", TINY,
           lambda d: (*d["k"], "a note" if d["note"] else "no note")),
    Figure("docs/table1.md", "pass@1 is {:.1f}% to {:.1f}% for every trained run", TINY,
           lowest_highest(lambda d: [100 * r["mean"]["math_avg"]["1"]
                                     for name, r in d["runs"].items() if name != "base"])),
    Figure("docs/table1.md", "each F-run's pass@1 minus its base run's is {:+.1f} (GRPO), {:+.1f} "
           "(DAPO) and {:+.1f} (CISPO) points", TINY, lambda d: tuple(
               100 * d["pairs"][a]["columns"]["math_avg"]["mean"]["1"][0]
               for a in ("grpo", "dapo", "cispo"))),
    Figure("docs/table1.md", "pass@256 is {:.0f} to {:.0f}% for every run and for the base model",
           TINY, lowest_highest(tiny_pass256)),
    # ------------------------------------------------ docs/why-focal.md: Lemma 3.1's table
    Figure("docs/why-focal.md", "(mu_pos = {:g}) still updates while missing a rare {:.0%} mode "
           "{:.0%} of the time", "experiments/categorical.py",
           lambda m: (0.9, 0.05, m.tail_miss_probability(8, 0.9, 0.05))),
    # ------------------------------------------------ docs/why-focal.md: two_strategy.json
    Figure("docs/why-focal.md", "| 0 | 0.05 or 0.95 | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |",
           TWO, weights("weight_ratio", 0, 0.05, W8)),
    Figure("docs/why-focal.md", "| 0 | 0.05 or 0.95 | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |",
           TWO, weights("weight_ratio", 0, 0.95, W8)),
    Figure("docs/why-focal.md", "| 0 | 0.3 or 0.7 | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |",
           TWO, weights("weight_ratio", 0, 0.3, W8)),
    Figure("docs/why-focal.md", "| 0 | 0.3 or 0.7 | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |",
           TWO, weights("weight_ratio", 0, 0.7, W8)),
    Figure("docs/why-focal.md", "| 1 | 0.05 | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |", TWO,
           weights("weight_ratio", 1, 0.05, W8)),
    Figure("docs/why-focal.md", "| 1 | 0.95 | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |", TWO,
           weights("weight_ratio", 1, 0.95, W8)),
    *(Figure("docs/why-focal.md", "N = 8 halves the weight of nearly unsolved and nearly solved "
             "prompts ({:.2f} at p 0.05 and at 0.95)", TWO, weights("weight_ratio", 0, p, [8]))
      for p in (0.05, 0.95)),
    Figure("docs/why-focal.md", "N 8 gives p 0.05 {:.2f} of its limit weight and p 0.95 {:.2f} "
           "times it", TWO, lambda d: (*weights("weight_ratio", 1, 0.05, [8])(d),
                                       *weights("weight_ratio", 1, 0.95, [8])(d))),
    *(Figure("docs/why-focal.md", f"| {g} | {label} | " + " | ".join(["{:.3f}"] * 6) + " |", TWO,
             weights("weight_ratio_no_std", g, p, (*W8, 1024)))
      for g, p, label in ((0, 0.05, "any"), (1, 0.05, "0.05"), (1, 0.3, "0.3"), (1, 0.7, "0.7"),
                          (1, 0.95, "0.95"))),
    Figure("docs/why-focal.md", "({:.3f} times the limit at p 0.95)", TWO,
           weights("weight_ratio_no_std", 1, 0.95, [8])),
    Figure("docs/why-focal.md", "200,000 groups, within {:.1f} standard errors on every logit",
           TWO, monte_carlo_z),
    Figure("docs/why-focal.md", "Take the model's start (first {:g}, last {:g})", TWO,
           at("config/init/0", "config/init/1")),
    Figure("docs/why-focal.md", "raised the rare answer's ratio to {:.2f} (the others' to {:.3f})",
           TWO, at("derivation/clip/0/ratios/1", "derivation/clip/0/ratios/0")),
    Figure("docs/why-focal.md", "the rare logit's component falls from {:+.4f} without the clip to "
           "{:+.4f} with it", TWO, clip("both", 1.0, 1)),
    Figure("docs/why-focal.md", "On a \"rare\" problem at gamma 0 it falls from {:+.3f} to {:+.3f}",
           TWO, clip("rare", 0.0, 1)),
    Figure("docs/why-focal.md", "`python experiments/two_strategy.py --out runs/two` ({:.0f} "
           "minutes on 2 shared cores, its results' `wall_s`", TWO, lambda d: d["wall_s"] / 60),
    *(Figure("docs/why-focal.md", f"| {optim} | " + " | ".join(["{:+.3f} [{:+.3f}, {:+.3f}]"] * 4)
             + " |", TWO, lambda d, o=optim.lower(): tuple(
                 x for g in ("0.5", "1") for arm in ("sampled", "exact")
                 for x in gap(o, "tie", arm, g)(d)))
      for optim in ("AdamW", "SGD")),
    Figure("docs/why-focal.md", "N 8 minus exact is {:+.3f} to {:+.3f} with AdamW (intervals "
           "holding 0) and {:+.3f} and {:+.3f} with SGD", TWO, at(
               "runs/adamw/mixes/tie/difference/0.5/mean", "runs/adamw/mixes/tie/difference/1/mean",
               "runs/sgd/mixes/tie/difference/0.5/mean", "runs/sgd/mixes/tie/difference/1/mean")),
    Figure("docs/why-focal.md", "Every F arm reaches a slightly lower highest pass@1 ({:+.3f} to "
           "{:+.3f})", TWO, lambda d: (max(every_two_strategy("ceiling")(d)),
                                        min(every_two_strategy("ceiling")(d)))),
    Figure("docs/why-focal.md", "rare mix: small gains ({:+.3f} to {:+.3f})", TWO,
           lowest_highest(every_two_strategy("gap", ("rare",)))),
    # ------------------------------------------------ docs/why-focal.md: the App. J simulation
    Figure("docs/why-focal.md", "initial correct mass {:.3f})", CAT_LR2,
           at("settings/initial_correct_mass")),
    Figure("docs/why-focal.md", "# {:.0f} s + {:.0f} s, 2 busy cores", CAT_LR2,
           at("settings/wall_s/adamw lr=0.01", "settings/wall_s/sgd lr=5000")),
    Figure("docs/why-focal.md", "# {:.0f} s, 2 busy cores", CAT_LR3,
           at("settings/wall_s/adamw lr=0.001")),
    *(m_ret_row(n) for n in (2, 4, 8, 16, 32, 64, 128, 512, 1024, 131072)),
    Figure("docs/why-focal.md", "The effects are small: at most about {:.0%} of the mass is lost",
           CAT_LR3, lambda d: 1 - min(m_ret("adamw", n, g)(d)[0] for n in d["settings"]["n"]
                                      for g in (0.0, 1.0))),
    Figure("docs/why-focal.md", "AdamW runs: {:.3f} vs {:.3f} at lr 1e-2", CAT_LR2,
           lambda d: (m_ret("adamw", 8, 1.0)(d)[0], m_ret("adamw", 8, 0.0)(d)[0])),
    Figure("docs/why-focal.md", "and {:.3f} vs {:.3f} at lr 1e-3", CAT_LR3,
           lambda d: (m_ret("adamw", 8, 1.0)(d)[0], m_ret("adamw", 8, 0.0)(d)[0])),
    Figure("docs/why-focal.md", "(M_ret {:.3f} to {:.3f}), while total correct mass grows to "
           "{:.3f} to {:.3f}", CAT_LR2, lambda d: (
               *lowest_highest(lambda d: [m_ret("adamw", n, 0.0)(d)[0]
                                          for n in d["settings"]["n"] if n >= 128])(d),
               *lowest_highest(lambda d: [m_ret("adamw", n, 0.0, "correct_mass")(d)[0]
                                          for n in d["settings"]["n"] if n >= 128])(d))),
    Figure("docs/why-focal.md", "depend on the seed (std {:.1f} to {:.1f})", CAT_LR2,
           lowest_highest(lambda d: [m_ret("adamw", n, g)(d)[1]
                                     for n in (32, 64) for g in (0.0, 1.0)])),
    Figure("docs/why-focal.md", "gamma = 1 is not better ({:.3f} vs {:.3f})", CAT_LR2,
           lambda d: (m_ret("adamw", 64, 1.0)(d)[0], m_ret("adamw", 64, 0.0)(d)[0])),

    # ------------------------------------------------ why-focal.md section 6: the confirmation
    Figure("docs/why-focal.md", "it is lost (share under {:.0%}) on {:.0%} of the prompts", SEEN,
           lambda d: (seen("constants", "lost")(d),
                      seen("arms", "dapo_g0_lr3e-05_n8", "rare lost")(d))),
    Figure("docs/why-focal.md", "**At k 128 and 256 it is not above**: {:+.3f} (the interval holds "
           "0) and {:+.3f} averaged", SEEN, lambda d: tuple(
               seen_ci("frontier", "1/8", f"pass@{k}", "gap")(d)[0] for k in (128, 256))),
    *(Figure("docs/why-focal.md", f"| {k} | " + " | ".join([CI3] * 3) + " |", SEEN,
             seen_focal_row(k)) for k in (2, 4, 8, 16, 32, 64, 128, 256)),
    Figure("docs/why-focal.md", "is confirmed: " + CI3 + ", {} of {} seeds (seeds 0-9: {:+.3f})",
           (SEEN, SHAPED), lambda a, b: (*seen_ci("frontier", "1/8", "pass@16", "gap")(a),
                                         *(seen("frontier", "1/8", "pass@16", "gap", x)(a)
                                           for x in ("positive", "n")),
                                         seen("frontier", "1/8", "pass@16", "gap", "mean")(b))),
    Figure("docs/why-focal.md", "F reaches {:.3f} and DAPO {:.3f} (" + CI3, SEEN, lambda d: (
        seen("ceilings", "means", "1/8", "pass@1")(d),
        seen("ceilings", "means", "0/8", "pass@1")(d),
        *seen_ci("ceilings", "1/8 minus base", "pass@1")(d))),
    Figure("docs/why-focal.md", "reach pass@1 {:.3f}, F's {:.3f} (" + CI3 + ", {} of {} seeds "
           "above)", SEEN, lambda d: (
        *seen("frontier", "1/8", "pass@1", "ceilings")(d),
        *seen_ci("frontier", "1/8", "pass@1", "ceiling")(d),
        seen("frontier", "1/8", "pass@1", "ceiling", "positive")(d),
        seen("frontier", "1/8", "pass@1", "ceiling", "n")(d))),
    # ------------------------------------------------ why-focal.md section 6, the rest
    Figure("docs/why-focal.md", "it copies the first digit with mass {:.2f} and the last", SEEN,
           lambda d: statistics.fmean(statistics.fmean(s["base"]["rare/tie"]["first"])
                                      for s in d["seeds"])),  # the summary's base has no first
    Figure("docs/why-focal.md", "with {:.3f} ± {:.3f} on the confirmation seeds, {:.1f} times a "
           "wrong digit's; pass@1 {:.3f}", SEEN, lambda d: (
               *seen("base", "rare mass")(d), seen("base", "rare ratio", 0)(d),
               seen("base", "pass@1", 0)(d))),
    Figure("docs/why-focal.md", "at p = {:.3f} it is solved at k 256", SEEN,
           seen("base", "rare mass", 0)),
    Figure("docs/why-focal.md", "The base model's pass@k is {:.2f} at k 2, {:.2f} at 16, {:.2f} "
           "at 32, {:.2f} at 64, {:.3f} at 128 and {:.3f} at 256", SEEN,
           lambda d: tuple(seen("base", f"pass@{k}", 0)(d) for k in (2, 16, 32, 64, 128, 256))),
    Figure("docs/why-focal.md", "(the largest k whose base pass@k is at most {:g}), is {}.", SEEN,
           lambda d: (seen("constants", "headline_max")(d), seen("headline_k")(d))),
    Figure("docs/why-focal.md", "(N 8: pass@1 {:.3f} to {:.3f}; exact: {:.3f} to {:.3f}), mean "
           "[95% t interval] over the {} confirmation seeds", SEEN, lambda d: (
               *(seen("frontier", n, "pass@1", "level_pass@1", j)(d)
                 for n in ("1/8", "1/exact") for j in (0, -1)),
               seen("frontier", "1/8", "pass@16", "gap", "n")(d))),
    Figure("docs/why-focal.md", "**F at N 8 is above DAPO at k {} to {}** ({} of {} seeds at k {} "
           "to {}), most at k {} and {}; at every level for k {} to {}, while at k 64 the "
           "interval holds 0 at {} level of ten", SEEN, seen_above),
    Figure("docs/why-focal.md", "about two thirds of its mean over levels (k 16: {:+.3f})", SEEN,
           seen("frontier", "1/8", "pass@16", "by_level", -1, "mean")),
    Figure("docs/why-focal.md", "pass@1 rises from {:.3f} to {:.3f}, and at the end the rare "
           "strategy's share of the correct mass is {:.3f}", SEEN, lambda d: (
               seen("base", "pass@1", 0)(d),
               *at("pass@1", "rare share")(seen("arms", "dapo_g0_lr3e-05_n8")(d)))),
    Figure("docs/why-focal.md", "F at the same lr: pass@1 {:.3f}, share {:.3f}, lost on {:.0%}",
           SEEN, lambda d: at("pass@1", "rare share", "rare lost")(
               seen("arms", "dapo_g1_lr3e-05_n8")(d))),
    Figure("docs/why-focal.md", "go from {:.2f} (DAPO) and {:.2f} (F) at the first level to {:.2f} "
           "and {:.2f} at the top; F minus DAPO, paired, is " + CI3, SEEN, lambda d: (
               *seen("frontier", "1/8", "rare lost", "medians_by_level", 0)(d),
               *seen("frontier", "1/8", "rare lost", "medians_by_level", -1)(d),
               *seen_ci("frontier", "1/8", "rare lost", "gap")(d))),
    Figure("docs/why-focal.md", "({:+.2f} [{:+.2f}, {:+.2f}]; the medians meet at the top level, "
           "{} each)", SEEN, lambda d: (  # one figure where both medians round alike
               *seen_ci("frontier", "1/8", "rare share", "gap")(d), " and ".join(sorted(
                   {f"{v:.3f}" for v in
                    seen("frontier", "1/8", "rare share", "medians_by_level", -1)(d)})))),
    Figure("docs/why-focal.md", "over the same levels ({:+.2f} to {:+.2f} at k 2 to 32)", SEEN,
           lambda d: (lambda v: (max(v), min(v)))(
               [seen("n_minus_exact", "1", f"pass@{k}", "mean")(d) for k in (2, 4, 8, 16, 32)])),
    Figure("docs/why-focal.md", "(lr 3e-5: share {:.3f}, lost on {} prompt at step 96", SEEN,
           lambda d: (lambda share, lost: (share, "every" if lost == 1 else f"{lost:.0%} of the"))(
               *at("rare share", "rare lost")(seen("arms", "dapo_g0_lr3e-05_exact")(d)))),
    Figure("docs/why-focal.md", "climbs pass@1 further ({:.3f} against {:.3f}): at matched pass@1 "
           "the two lose it alike (lost on {:.2f} of the prompts at pass@1 {:.3f} at N 8, "
           "on {:.2f} at {:.3f} exact)", SEEN, lambda d: (
               *(seen("arms", f"dapo_g0_lr3e-05_{n}", "pass@1")(d) for n in ("exact", "n8")),
               seen("frontier", "1/8", "rare lost", "medians_by_level", 3, 0)(d),
               seen("frontier", "1/8", "pass@1", "level_pass@1", 3)(d),
               seen("frontier", "1/exact", "rare lost", "medians_by_level", -1, 0)(d),
               seen("frontier", "1/exact", "pass@1", "level_pass@1", -1)(d))),
    Figure("docs/why-focal.md", "(DAPO at N 8 minus its exact update: " + CI3.replace("3f", "4f")
           + " at k 32 to {:+.4f} at k 128", SEEN, lambda d: (
               *seen_ci("versus_exact", "0/8 - 0/exact", "pass@32", "gap")(d),
               seen("versus_exact", "0/8 - 0/exact", "pass@128", "gap", "mean")(d))),
    Figure("docs/why-focal.md", "(share {:.2f} to {:.2f} at lr 1e-4 to 3e-4)", SEEN,
           lowest_highest(seen_arms("rare share", *(f"dapo_g1_lr{lr}_exact"
                                                     for lr in ("0.0001", "0.0002", "0.0003"))))),
    Figure("docs/why-focal.md", "above DAPO's exact update at k {} to {} (k 16: " + CI3 + ")", SEEN,
           lambda d: (*seen_ks(lambda c: c["gap"]["lo"] > 0, "versus_exact", "1/8 - 0/exact")(d),
                      *seen_ci("versus_exact", "1/8 - 0/exact", "pass@16", "gap")(d))),
    Figure("docs/why-focal.md", "with the exact update {:.3f} and {:.3f} ({:+.3f})", SEEN,
           lambda d: (*seen("frontier", "1/exact", "pass@1", "ceilings")(d),
                      seen("frontier", "1/exact", "pass@1", "ceiling", "mean")(d))),
    Figure("docs/why-focal.md", "{} of DAPO's {} long runs break down, {} of F's", SEEN,
           lambda d: (lambda runs: tuple(WORDS[x] for x in (
               sum(r["broke down"] for r in runs["0/8"].values()), len(runs["0/8"]),
               sum(r["broke down"] for r in runs["1/8"].values()))))(
               seen("ceilings", "runs")(d))),
    Figure("docs/why-focal.md", "{} of the {} runs of the confirmation", SEEN, lambda d: (
        sum(len(a["broke down"]) for a in seen("arms")(d).values()),
        len(seen("arms")(d)) * len(d["seeds"]))),
    Figure("docs/why-focal.md", "at {} of {} seed-levels (on the confirmation seeds at {} of {})",
           (SEEN, SHAPED), lambda a, b: tuple(
               f(seen("frontier_lrs", "1/8", 0, "counts")(d)) for d in (b, a)
               for f in (lambda c: c["dapo_g0_lr3e-05_n8"], lambda c: sum(c.values())))),
    Figure("docs/why-focal.md", "lifts no arm's frontier by more than {:.4f} at any k", SEEN,
           lambda d: max(c[f"pass@{k}"]["gap"]["mean"] for c in
                         seen("bracket", "lifted")(d).values() for k in SEEN_KS)),
    Figure("docs/why-focal.md", "DAPO's clip takes {:.2%} to {:.2%} of the sampled arms' tokens",
           SEEN, lowest_highest(seen_arms("clip_frac", *(
               f"dapo_g{g}_lr{lr}_n8" for g in (0, 1)
               for lr in ("3e-05", "0.0001", "0.0002", "0.0003"))))),
    Figure("experiments/results/see_it_happen.md", "{:.1f} min wall and {:.1f} CPU-min on 2 cores "
           "shared with other work (load {:.1f} at the start, {:.1f} at the end)", SEEN,
           lambda d: (d["times"]["wall_s"] / 60, d["times"]["cpu_s"] / 60, *d["times"]["load"])),
    Figure("README.md", "the confirmation: 2 h on 2 cores ({:.0f} CPU-min)", SEEN,
           lambda d: d["times"]["cpu_s"] / 60),
    Figure("experiments/results/see_it_happen.md", "the arms took {:.1f} CPU-min as they ran",
           SHAPED, lambda d: sum(x.get("cpu_s", 0) for s in d["seeds"] for x in [
               *(a for arms in s["arms"].values() for a in arms.values()), *s["base"].values()])
           / 60),
    Figure("experiments/results/see_it_happen.md", "keeps more pass@16 than DAPO, {:+.4f} "
           "[{:+.4f}, {:+.4f}], 10 of 10 seeds (exploration: {:+.4f})", (SEEN, SHAPED),
           lambda a, b: (*seen_ci("frontier", "1/8", "pass@16", "gap")(a),
                         seen("frontier", "1/8", "pass@16", "gap", "mean")(b))),
]


def _files(figure):
    return figure.file if isinstance(figure.file, tuple) else (figure.file,)


def _load(name, root=ROOT):
    """A figure's source: a results file's JSON, a TOML file, or the code: a module (its
    constants, the paper's tables among them), the flags' defaults, what --plan prints."""
    if name.endswith(".json"):
        return json.loads((root / name).read_text())
    if name.endswith(".toml"):
        return tomllib.loads((root / name).read_text())
    if name == FLAGS:  # {"--grace": 30.0, ...}
        return {s: a.default for a in fgrpo.build_parser()._actions for s in a.option_strings}
    if name == PLAN:  # experiments/table1.py --plan's estimate, printed
        table1 = _load("experiments/table1.py")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            table1.main(["--plan", "--work", str(ROOT / "runs" / "no-such-campaign")])
        return printed.getvalue()
    module = importlib.util.spec_from_file_location(Path(name).stem, ROOT / name)
    loaded = importlib.util.module_from_spec(module)
    saved = list(sys.path)
    sys.path.insert(0, str((ROOT / name).parent))  # its own folder first, as when it runs
    try:
        module.loader.exec_module(loaded)
    finally:
        sys.path[:] = saved
    return loaded


def _said(figure, files):
    """The figure's words as its sources give them, whitespace runs as one space, and where in
    them each figure read from a source stands: (words, [(start, end)])."""
    values = figure.read(*(files[name] for name in _files(figure)))
    values = list(values) if isinstance(values, tuple) else [values]
    words, spans = "", []
    for literal, field, spec, _ in string.Formatter().parse(figure.text):
        words += literal
        if field is not None:
            value = " ".join(format(values.pop(0), spec).split())
            spans.append((len(words), len(words) + len(value)))
            words += value
    assert not values and "  " not in words and "\n" not in words, figure.text
    return words, spans


def _pages_and_sources(figures, root):
    pages = {f.page: " ".join((root / f.page).read_text().split()) for f in figures}
    names = {name for f in figures for name in _files(f)}
    return pages, {name: _load(name, root) for name in names}


def figures_missing(figures, root=ROOT):
    """Each figure whose words, formatted from its file as it is now, are not in its page (its
    line breaks as spaces), as "page: the words (file)"."""
    pages, files = _pages_and_sources(figures, root)
    missing = []
    for figure in figures:
        said = _said(figure, files)[0]
        if said not in pages[figure.page]:
            missing.append(f"{figure.page}: {said!r} ({figure.file})")
    return missing


def test_the_docs_quote_each_figure_as_its_results_file_has_it():
    assert all("{" in f.text for f in FIGURES)  # each entry holds a figure read from its file
    missing = figures_missing(FIGURES)
    assert not missing, "the text or the file changed:\n" + "\n".join(missing)


def test_a_figure_changed_in_the_readme_a_page_or_a_results_file_fails(tmp_path):
    def copy():  # the pages and the results files, as they are, into a fresh folder
        root = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        names = {f.page for f in FIGURES} | {n for f in FIGURES for n in _files(f)}
        for name in (n for n in names if (ROOT / n).is_file()):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, root / name)
        return root

    def edit(root, name, old, new):
        text = (root / name).read_text()
        assert text.count(old) == 1, (name, old)
        (root / name).write_text(text.replace(old, new))
        return [line.split(": ")[0] for line in figures_missing(FIGURES, root)]

    assert figures_missing(FIGURES, copy()) == []
    assert edit(copy(), "README.md", "pass@1 from 8.8% to 95.7%", "pass@1 from 8.8% to 95.8%") \
        == ["README.md"]
    assert edit(copy(), "docs/bench.md", "| 0.802 |", "| 0.803 |") == ["docs/bench.md"]
    root = copy()  # and a results file: the eps=1e-4 row's difference doubled
    parity_json = json.loads((root / PARITY).read_text())
    parity_json["rows"][2]["value_diff"] *= 2
    (root / PARITY).write_text(json.dumps(parity_json))
    assert [m.split(": ")[0] for m in figures_missing(FIGURES, root)] == ["docs/integrations.md"]


def test_a_results_file_records_its_command_without_a_scratch_path():
    tracked = subprocess.run(["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    commands = {name: json.loads((ROOT / name).read_text()).get("command") for name in tracked}
    absolute = [f"{name}: {c}" for name, c in commands.items()
                if isinstance(c, str) and re.search(r"(?:^|[\s=])/", c)]
    assert not absolute, "bench/run.py records --out relative:\n" + "\n".join(absolute)


# ---------------------------------------------------------------- times measured by hand
MEASURED = re.compile(r"\b\d[\d,.]*\s?(?:s|ms|min|minutes|CPU-min)\b")  # a time ...
ON_CORES = re.compile(r"\b\d+ (?:\w+ ){0,2}cores\b")  # ... on some of this project's cores
WHERE_AND_WHEN = re.compile(r"\b(?:commit|at) [0-9a-f]{7}\b|\.json\b|`seconds`|`wall_s`")


def _undated_times(paths):
    """Every paragraph (fenced code left out) that states a time measured on N cores without a
    commit or a results file in it, in a table before it, or in its section's heading, as
    "page: its first words"."""
    found = []
    for path in paths:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        blocks, heading = re.split(r"\n\s*\n", text), ""
        for i, block in enumerate(blocks):
            heading = block if block.startswith("#") else heading
            context = " ".join([heading, block, blocks[i - 1] if block.startswith("|") else ""])
            if MEASURED.search(block) and ON_CORES.search(context) \
                    and not WHERE_AND_WHEN.search(context):
                found.append(f"{path.name}: {' '.join(block.split())[:70]}")
    return found


def test_a_time_measured_by_hand_says_where_and_when(tmp_path):
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert not _undated_times(pages), "\n".join(_undated_times(pages))
    bad = tmp_path / "bad.md"  # and it finds one, not a dated one nor an estimate
    bad.write_text("## A\n\nIt took 12 s on 2 idle cores.\n\nIt took 12 s on 2 cores at commit "
                   "abc1234.\n\nAbout 4 minutes a step on 8 GPUs.\n\n| a | 3 s |\n")
    assert _undated_times([bad]) == ["bad.md: It took 12 s on 2 idle cores."]


# ---------------------------------------------------------------- no figure without a source
# A figure that looks measured (a time, memory or disk, a ratio "1.4x", a percentage, a signed
# difference, an interval, "N of M") in the README, CONTRIBUTING.md or docs/ stands where FIGURES
# reads it from its source: a results file, the code (a constant, a default, what it prints),
# PAPER_NUMBERS, or arithmetic on those that the reader redoes. One that has none is removed, or
# gets a results file. "95% t interval" names a statistic, not a figure.
NUM = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
SPAN = NUM + r"(?:\s?(?:-|to)\s?\d[\d,]*(?:\.\d+)?)?"  # 4-6, 1.5 to 1.8
LOOKS_MEASURED = re.compile("|".join([
    SPAN + r" ?(?:ms|s|seconds?|min|minutes?|h|hours?|days?|CPU-min|GPU-hours?)\b",
    SPAN + r" ?(?:[KMGT]i?B|bytes|terabytes)\b",
    NUM + r"x\b",
    SPAN + r" ?%(?! (?:t |Student-t )?interval)",
    r"(?<![\w.])[+\-\u2212]\d+\.\d\d+",
    r"\[[+\-\u2212]?\d+\.\d+, [+\-\u2212]?\d+\.\d+\]",
    NUM + r" of (?:the |its )?\d[\d,]*\b"]))


def unregistered_figures(pages, figures, root=ROOT):
    """Each figure of `pages` that looks measured and has a number that no figure of `figures`
    reads from a source where it stands, as "page: the figure in its words around"."""
    texts, files = _pages_and_sources(figures, root)
    fields = {}  # page -> where a figure read from a source stands in it
    for figure in figures:
        said, spans = _said(figure, files)
        at = texts[figure.page].find(said)
        while at >= 0:
            fields.setdefault(figure.page, []).extend((at + a, at + b) for a, b in spans)
            at = texts[figure.page].find(said, at + 1)
    found = []
    for page in pages:
        text = " ".join((root / page).read_text().split())
        for hit in LOOKS_MEASURED.finditer(text):
            numbers = [(hit.start() + m.start(), hit.start() + m.end())
                       for m in re.finditer(r"\d(?:[\d,.]*\d)?", hit.group())]
            if not all(any(a <= x and y <= b for a, b in fields.get(page, ()))
                       for x, y in numbers):
                around = text[max(0, hit.start() - 40):hit.end() + 20]
                found.append(f"{page}: {hit.group()!r} in {around!r}")
    return found


def test_no_figure_in_the_docs_without_a_registered_source():
    found = unregistered_figures([str(p.relative_to(ROOT)) for p in DOCS], FIGURES)
    assert not found, "a figure with no source in FIGURES (CONTRIBUTING.md):\n" + "\n".join(found)


def test_a_planted_or_changed_figure_fails_the_scan(tmp_path):
    names = {f.page for f in FIGURES} | {n for f in FIGURES for n in _files(f)} | {"docs/bench.md"}
    for name in (n for n in names if (ROOT / n).is_file()):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    bench = tmp_path / "docs" / "bench.md"
    bench.write_text(bench.read_text() + "\nA bench run takes 42 s.\n")
    planted = [f for f in unregistered_figures(["docs/bench.md"], FIGURES, tmp_path) if "42" in f]
    assert [f.split(" in ")[0] for f in planted] == ["docs/bench.md: '42 s'"]
    readme = tmp_path / "README.md"  # a figure of the demo's output changed by hand
    line = next(x for x in readme.read_text().splitlines() if x.startswith("step 2/"))
    changed = re.sub(r"loss [+-]\d", "loss -7", line)
    assert changed != line
    readme.write_text(readme.read_text().replace(line, changed))
    found = [f.split(" in ")[0] for f in unregistered_figures(["README.md"], FIGURES, tmp_path)]
    assert f"README.md: '{changed.split('loss ')[1][:5]}'" in found  # and the rest of its line
    assert [m.split(": ")[0] for m in figures_missing(FIGURES, tmp_path)] == ["README.md"]
