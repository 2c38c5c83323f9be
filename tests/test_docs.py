"""The docs hold to the code: every command's flags and make targets exist, every cited file and
test exists, the files keep their budgets, and CONTRIBUTING.md states the rules these tests
enforce (its messages point there)."""
import re
import subprocess
from pathlib import Path

import eval as evaluator  # eval.py; the alias keeps the builtin eval
import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# the budgets CONTRIBUTING.md states: characters a line and lines a function in every .py file,
# lines a file where it has one
LINE_LIMIT = 100
FUNCTION_LIMIT = 50
FILE_LIMITS = {"fgrpo.py": 1000, "eval.py": 400}


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
                   r"|`((?:docs|bench|experiments|integrations)/[\w./-]+\.(?:md|json|png|py))`")


NOT_YET_WRITTEN = {"bench/gpu_results.json"}  # make gpu-check's output: no GPU has run it yet


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
             "test_code_and_docs_cite_the_paper_not_the_projects_spec_or_issues",
             "test_the_readme_types_no_counts_a_change_makes_stale",
             "test_every_hook_in_the_repository_takes_the_calls_train_makes"]
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


def test_the_readme_types_no_counts_a_change_makes_stale(tmp_path):
    # a count of tests or planted bugs goes stale with the next test or bug: left out
    def counts(path):
        return re.findall(r"\b[\d,]+ (?:fast |slow )?(?:tests|planted bugs|bugs)\b",
                          path.read_text())
    assert counts(ROOT / "README.md") == [], "a hand-typed count in README.md (CONTRIBUTING.md)"
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


# what a reader cannot open: the project's own spec and issues, and who lends it machines
UNSEEN = re.compile(r"\bSPEC\b|\b[Ii]ssues? \d+\b|\blent\b|\bdevice tool\b")


def _unseen_citations(paths):
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{n}: {line.strip()[:80]}"
            for p in paths
            for n, line in enumerate(p.read_text().splitlines(), 1) if UNSEEN.search(line)]


def test_code_and_docs_cite_the_paper_not_the_projects_spec_or_issues(tmp_path):
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
