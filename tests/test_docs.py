"""The docs hold to the code: every command's flags and make targets exist, every cited file and
test exists, the files keep their budgets, and CONTRIBUTING.md states the rules these tests
enforce (its messages point there)."""
import ast
import contextlib
import hashlib
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
# and the docs' words (wc -w): the README, the README, CONTRIBUTING.md and docs/ together, and a
# page rewritten elsewhere (PENDING) once it lands; the README's lines
WORD_LIMITS = {"README.md": 2500, "docs": 13000, "docs/gpu-check.md": 1000}
README_LINES = 300


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


def _headings(path):  # the anchors of a markdown file's headings, as GitHub makes them
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def _anchors_missing(paths):
    """Every link to a heading (file.md#anchor, or #anchor on its own page) with no such heading,
    as "file:line: target"."""
    missing = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", line):
                page = path.parent / target if target else path
                if page.suffix == ".md" and page.exists() and anchor not in _headings(page):
                    missing.append(f"{path.name}:{n}: {target}#{anchor}")
    return missing


def test_every_file_the_docs_cite_exists(tmp_path):
    docs = [*DOCS, *sorted((ROOT / "experiments" / "results").glob("*.md"))]
    assert not _cited_files_missing(docs), "\n".join(_cited_files_missing(docs))
    assert not _anchors_missing(docs), "\n".join(_anchors_missing(docs))
    bad = tmp_path / "bad.md"  # and it finds a missing one, either way of citing, and a heading
    bad.write_text("see [x](docs/nope.md#a), [y](https://e.org) and `bench/gone.json`\n"
                   f"and [z]({ROOT / 'README.md'}), [w]({ROOT / 'README.md'}#no-such-heading)\n"
                   "## A heading, here\n[v](#a-heading-here) [u](#nowhere)\n")
    assert _cited_files_missing([bad]) == ["bad.md:1: docs/nope.md", "bad.md:1: bench/gone.json"]
    assert _anchors_missing([bad]) == [f"bad.md:2: {ROOT / 'README.md'}#no-such-heading",
                                       "bad.md:4: #nowhere"]


def test_the_files_keep_their_budgets():
    # CONTRIBUTING.md's budgets: LINE_LIMIT characters a line in every tracked .py file, the
    # Makefile and the docs, FUNCTION_LIMIT lines a function in every .py file, FILE_LIMITS' lines
    # a file where it has one, and the docs' words (wc -w) within WORD_LIMITS
    import ast
    tracked = subprocess.run(["git", "ls-files", "*.py", "Makefile"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    docs = [str(p.relative_to(ROOT)) for p in DOCS]
    docs = [n for n in docs if _pending(n, (ROOT / n).read_text()) != (ROOT / n).read_text()]
    long = [f"{name}:{i}" for name in [*tracked, *docs] if (ROOT / name).exists()
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
    words = doc_words()
    assert words["README.md"] <= WORD_LIMITS["README.md"], words
    assert sum(words.values()) <= WORD_LIMITS["docs"], (sum(words.values()), words)
    over = [name for name, most in WORD_LIMITS.items() if name in words and words[name] > most
            and _pending(name, (ROOT / name).read_text()) != (ROOT / name).read_text()]
    assert not over, f"over their word budgets (CONTRIBUTING.md): {over}"
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_LINES


def doc_words(root=ROOT):  # each doc's words, as wc -w counts them
    pages = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]
    return {str(path.relative_to(root)): len(path.read_text().split()) for path in pages}


def test_contributing_states_the_rules_these_tests_enforce():
    # the budgets as the test above holds them, and each rule's test by name (the cited-tests
    # test checks the names exist)
    text = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())  # lines joined
    stated = [f"at most {LINE_LIMIT} characters", f"none over {FUNCTION_LIMIT} lines",
              *(f"`{name}` at most {most:,} lines" for name, most in FILE_LIMITS.items()),
              f"the README at most {WORD_LIMITS['README.md']:,} words and {README_LINES} lines",
              f"the docs together at most {WORD_LIMITS['docs']:,} words"]
    assert [phrase for phrase in stated if phrase not in text] == []
    rules = ["test_the_files_keep_their_budgets", "test_readme_commands_use_real_flags",
             "test_every_file_the_docs_cite_exists", "test_every_test_the_docs_cite_exists",
             "test_make_help_lists_every_target", "test_tests_live_by_subject",
             "test_code_and_docs_cite_only_what_a_reader_has",
             "test_the_docs_type_no_counts_a_change_makes_stale",
             "test_every_hook_in_the_repository_takes_the_calls_train_makes",
             "test_every_number_in_the_docs_is_read_from_its_source_or_declared",
             "test_every_results_page_is_its_writers_from_its_json",
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

# ---------------------------------------------------------------- every number, accounted for
# Default-deny: every number of the README, CONTRIBUTING.md, docs/ and `make help` (digits in any
# form: 7, 1,024, 0.5, -0.021, 95.7%, 2x, 2×, 12k, 3.2e5, 1/8, 4-6; and the words for numbers,
# ratios and fractions: one, twice, half, a tenth, ...) stands inside an entry of NUMBERS for its
# page, which either
# - reads it from its source: Figure(the words as printed, a {} with its format where each number
#   stands, the source, what reads the numbers from it): a results file, the code (a constant, a
#   default, what it prints), or arithmetic on them that the reader redoes; or
# - declares it for what it is: Declared(the words as printed, the kind): a value of the paper
#   with its table or equation (paper("Table 1")), a formula's own constants (FORMULA), an
#   example input (EXAMPLE).
# Needing no entry, by their shape alone: a reference (Sec. 4, Eqs. 11-13, Table 1, App. L.2,
# section 6, Lemma 3.1, arXiv 2602.06717), a version (2.13.0), a commit (4224670 aside: all
# digits, it is read), a file, path or identifier (runs/demo, step_000150, fp32, H100, pass@16),
# a name of NAMES, and what fenced or indented code holds outside its comments (the commands'
# flags are test_readme_commands_use_real_flags'). Link targets and URLs are not text.
# An entry that no longer stands in its page fails too: the text changed, or its source did.
class Figure(NamedTuple):
    text: str  # as printed, a {} (with its format) where each number stands
    file: str  # the source, from the repository's root (or a tuple of them)
    read: Callable  # the source (each source) -> the numbers, in the order of the {}s


class Declared(NamedTuple):
    text: str  # as printed; every number in it is of the kind
    kind: str  # paper("Table 1"), FORMULA, EXAMPLE or WORDING


FORMULA = "a formula's own constants"
EXAMPLE = "an example input"
WORDING = "a count the sentence itself shows"
PAPER = re.compile(r"the paper's \((?:Table|Eqs?\.|App\.|Sec\.|Lemma) [\w.-]+\)")


def paper(where):  # a value of the paper, with its table, equation, appendix or section
    return f"the paper's ({where})"


# the names with digits that no shape rule masks: models, and the size that names the 7B
NAMES = ("Llama-3.2-3B-Instruct", "SmolLM2-135M-Instruct", "SmolLM2-135M", "Qwen2.5-7B",
         "Qwen3-4B-Base", "Qwen2.5-0.5B", "MATH-500", "7B", "0.5B")
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                 "fourteen "
         "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
         "eighty ninety hundred hundreds thousand thousands million millions billion billions "
         "dozen dozens twice thrice half halves halve halved double doubled doubles triple "
         "tripled third thirds quarter quarters fifth fifths tenth tenths hundredth").split()
NUMBER = re.compile(  # a digit-led token (its sign, its unit letters aside), or a number's word
    r"(?<![\w.@#])(?P<n>(?:[+\-\u2212\u00b1](?=\d))?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
    r"(?:[eE][+\-\u2212]?\d+)?)[A-Za-z%\u00d7]*|\b(?P<w>" + "|".join(NUMBER_WORDS) + r"|\w+fold)\b",
    re.I)
NO_NUMBER = re.compile("|".join([  # what needs no entry: its numbers are no figures
    *(r"(?<![\w.-])" + re.escape(name) + r"(?![\w.-])" for name in NAMES),  # before identifiers
    r"\b(?:Secs?\.|Eqs?\.|App\.|Tables?|Lemma|Figure|[Ss]ections?)"  # references
    r" (?:[A-Z](?:\.\d+)?|\d+(?:\.\d+)?)(?:(?:-|, | and | or | to )(?:[A-Z]\.)?\d+(?:\.\d+)?)*",
    r"\barXiv \[?\d{4}\.\d{4,5}",  # the paper's, or another's, arXiv id
    r"\b\d+\.\d+\.\d+(?:\+\w+)?",  # a version
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",  # a commit
    r"[\w.@-]*[A-Za-z][\w.@-]*/[\w./@-]*|[\w.@-]*/[\w.@-]*[A-Za-z][\w./@-]*",  # a path
    r"\b[A-Za-z_][A-Za-z_]*\d[\w.]*(?:-\w+)*",  # an identifier: fp32, H100, step_000150
    r"\w#\d+",  # an issue of another repository: pytorch#120601
    r"#+ \d+\."]))  # a numbered heading


def prose(text):
    """A page as its reader reads it, whitespace runs as one space: fenced and indented code
    only as its comments (output blocks whole), no link targets, URLs nor HTML comments."""
    kept, fence = [], None
    for line in re.sub(r"<!--.*?-->", "", text, flags=re.S).splitlines():
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:] if fence is None else None
            continue
        code = fence in ("bash", "python", "sh") or (fence is None and line.startswith("    "))
        comment = re.search(r"(?:^|\s)(#\s.*)$", line)
        line = line if code else re.sub(r"^(\s*)\d+\. ", r"\1", line)  # a numbered list's
        kept.append((comment.group(1) if comment else "") if code else line)
    text = re.sub(r"\]\([^)\s]*\)", "]", "\n".join(kept))
    return " ".join(re.sub(r"https?://\S+", "", text).split())


def numbers(text):
    """(start, end) of every number of `text` that its shape alone does not account for."""
    masked = [(m.start(), m.end()) for m in NO_NUMBER.finditer(text)]
    return [m.span("n") if m["n"] else m.span("w") for m in NUMBER.finditer(text)
            if not any(a <= m.start() and m.end() <= b for a, b in masked)]


# ---------------------------------------------------------------- the sources and their readers
BENCH = "bench/results.json"
CALIBRATION = "checks/compare_calibration.json"
PARITY = "checks/parity_results.json"
MUTATION = "checks/mutation_results.json"
PEERS = "experiments/results/peers.json"
PEERS_PROTOCOL = "experiments/peers_protocol.toml"
PEERS_AMENDMENT = "experiments/results/peers_amendment.json"
PEERS_AMENDMENT_PROTOCOL = "experiments/peers_amendment.toml"
TWO = "experiments/results/two_strategy.json"
TINY = "experiments/results/table1_tiny.json"
CAT_LR3 = "experiments/results/categorical_adamw_lr0.001.json"
CAT_LR2 = "experiments/results/categorical_adamw_lr0.01_sgd_lr5000.json"
DEMO = "docs/demo_output.json"  # make demo's output, as the README shows it
PROTOCOL = "experiments/see_it_happen_protocol.toml"
SEEN = "experiments/results/see_it_happen_confirmation.json"  # seeds 10-19, the protocol's
SHAPED = "experiments/results/see_it_happen_exploration.json"  # seeds 0-9
FLAGS = "fgrpo.py's flags"  # their defaults
EVAL_FLAGS = "eval.py's flags"
PLAN = "experiments/table1.py --plan"  # its printed estimate
THIS = "tests/test_docs.py"  # this file's constants
GPU_CHECK = "checks/gpu_check.py"
TABLE1 = "experiments/table1.py"
CI3 = "{:+.3f} [{:+.3f}, {:+.3f}]"  # a paired summary, mean [95% t interval]
SEEN_KS = (2, 4, 8, 16, 32, 64, 128, 256)  # the k past 1 of every see_it_happen result
WORDS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
# docs/paper-run.md's memory and time plan for Qwen2.5-7B, redone from the code: table1.py's plan
# constants and model size, gpu_check.py's Qwen2.5-7B shapes, fgrpo.py's defaults and check_gpus
PAPER_RUN = (TABLE1, GPU_CHECK, FLAGS, "fgrpo.py")
CARDS_GB = (80, 141)  # an H100's and an H200's memory, as NVIDIA's data sheets name the cards
CUDA_CONTEXT_GB = 3  # "a few GB of CUDA context", as the page's formula says it


def _files(entry):
    return entry.file if isinstance(entry.file, tuple) else (entry.file,)


def _load(name, root=ROOT):
    """A source: a results file's JSON, a TOML file, a file's text ("text:PATH"), or the code: a
    module (its constants, the paper's tables among them), the flags' defaults, what --plan
    prints, this file."""
    if name.endswith(".json"):
        return json.loads((root / name).read_text())
    if name.endswith(".toml"):
        return tomllib.loads((root / name).read_text())
    if name.startswith("text:"):
        return (root / name.removeprefix("text:")).read_text()
    if name in (FLAGS, EVAL_FLAGS):  # {"--grace": 30.0, ...}
        parser = (fgrpo if name == FLAGS else evaluator).build_parser()
        return {s: a.default for a in parser._actions for s in a.option_strings}
    if name == THIS:
        return sys.modules[__name__]
    if name == PLAN:  # experiments/table1.py --plan's estimate, printed
        table1 = _load(TABLE1)
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


def source_of(code, pattern, function=None):
    """The first group of `pattern` in a module's source (or one of its functions')."""
    return re.search(pattern, inspect.getsource(function or code))[1]


def tiny_shape(code):  # build_tiny's layers and vocabulary: its specials, characters and merges
    chars = ast.literal_eval(source_of(code, r'\*("(?:[^"\\]|\\.)*")\]', code.build_tiny))
    layers = source_of(code, r"num_hidden_layers=(\d+)", code.build_tiny)
    return layers, len(["<pad>", "<eos>"]) + len(chars) + len(code.TINY_MERGES)


def sci(x):  # 3e-05 as the docs write it: 3e-5
    mantissa, exponent = f"{x:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def hf_limit(code):  # the parameters above which --rollout hf is refused on GPUs
    return sci(float(source_of(code, r'args\.rollout == "hf" and params > ([\d.e]+)')))


def demo_gamma(makefile, code):  # make demo's --gamma, the largest of the paper's
    gamma = float(re.search(r"fgrpo\.py --model tiny .*--gamma (\S+)", makefile)[1])
    assert gamma == max(code.PAPER_GAMMA.values())
    return gamma


# the peers' reading: experiments/peers.py over the grid's results and the amendment's, as the
# page (peers.md) reads them
PEERS_READ = ("experiments/peers.py", PEERS, PEERS_AMENDMENT)
_PEER_ARMS = {}


def peer_arms(sources):  # {arm: per seed, its runs} of both results files, computed once
    key = tuple(id(s) for s in sources)
    if key not in _PEER_ARMS:
        peers, grid, amendment = sources
        _PEER_ARMS[key] = peers.tradeoff_arms(grid, amendment)
    return _PEER_ARMS[key]


def peer_k(protocol, suffix):  # the k of PKPO and Pass@k Training's arms (one k for both)
    ks = {protocol["arms"][arm + suffix]["k"] for arm in ("pkpo", "passk_training")}
    assert len(ks) == 1
    return ks.pop()


def peer_base(*sources):  # the base model's metrics, mean over the grid's seeds
    return sources[0].base_point(peer_arms(sources))


def peer_ended(sources, arm):  # pass@1 and pass@16 where the arm's runs ended
    peers = sources[0]
    paths = peer_arms(sources)[arm]
    return tuple(peers.tradeoff.ended(paths, f"pass@{k}") for k in (1, peers.TRADEOFF_KS[0]))


def peer_reach(sources, arm, i):  # the arm's reach at the i-th k of the trade-off
    peers = sources[0]
    return peers.tradeoff.summary(peers.points(peer_arms(sources)[arm], peers.TRADEOFF_KS[i]))


def peer_share(sources, arm):  # the rare share where the arm's runs ended; the base model's equal
    share = sources[0].tradeoff.ended(peer_arms(sources)[arm], "rare share")
    assert arm != "f_dapo" or f"{share:.3f}" == f"{peer_base(*sources)['rare share']:.3f}"
    return share


def peer_pair(sources, a, b):  # b against a at pass@16 over all their runs (peers.md's pairs)
    peers = sources[0]
    arms = peer_arms(sources)
    k = peers.TRADEOFF_KS[0]
    return peers.tradeoff.pair(peers.points(arms[a], k), peers.points(arms[b], k))


def peer_primary(sources, run, arm):  # a peer's [primary] row, of the grid or the amendment
    return sources[1 if run == "grid" else 2]["summary"]["primary"][arm]


def peer_gap(sources, run, arm):  # its gap to F-DAPO: mean, lo, hi
    gap = peer_primary(sources, run, arm)["gap"]
    return gap["mean"], gap["lo"], gap["hi"]


def peer_verdict(sources, run, arm):  # its verdict, as the page reads it (the amended rule)
    row = peer_primary(sources, run, arm)
    alpha = (sources[0].PRIMARY if run == "grid" else sources[0].AMENDMENT["primary"])["alpha"]
    return sources[0].verdict(row["gap"], row["p_holm"], alpha)


def at(*paths):
    """A reader of paths like "rows/2/ratio": keys, and indices into lists."""
    def get(data, path):
        for key in path.split("/"):
            data = data[int(key)] if isinstance(data, list) else data[key]
        return data
    return lambda data: tuple(get(data, path) for path in paths)


def bench_row(i):
    """bench/results.json's row i as verification.md's table shows it: a rollout's sizes, ours,
    the alternative, their ratio, and the target where there is one (missed, where missed)."""
    def read(d):
        row = d["rows"][i]
        sizes = re.findall(r"rollout (\d+)x(\d+)", row["measurement"])
        target = [row["target"] + ", **missed**" * (row["met"] is False)] if row["target"] else []
        return (*(int(x) for x in (sizes[0] if sizes else ())), row["ours"], row["alternative"],
                row["ratio"], *target)
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


def weights(table, gamma, p, ns):  # two_strategy.json's w_N / limit at each N
    return at(*(f"derivation/{table}/{gamma}/{p}/{n}" for n in ns))


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


def seen_ks(keep, *path):  # the first and last k whose paired summaries at path/pass@k keep holds
    def read(d):
        ks = [k for k in SEEN_KS if keep(seen(*path, f"pass@{k}")(d))]
        assert ks == [k for k in SEEN_KS if ks[0] <= k <= ks[-1]], ks  # a range: "k A to B"
        return ks[0], ks[-1]
    return read


def seen_arms(key, *arms):  # the value at key of each arm of the summary's "Every arm" table
    return lambda d: [seen("arms", arm, key)(d) for arm in arms]


def demo_line(start):  # the line of make demo's output that starts so
    return lambda d: next(line for line in d["stdout"] if line.startswith(start))


def demo_summary(d):  # the README's reading of the demo's output: reward and held-out pass@k
    base, after = (demo_line(f"| {m} |")(d).split(" | ")[1].split("/")
                   for m in ("runs/demo/tiny_seed0/model", "runs/demo/step_000150"))
    rewards = [float(demo_line(f"step {k}/150 ")(d).split()[3]) for k in (1, 150)]
    return (*rewards, base[0], after[0], base[1], after[1], d["wall_s"], d["commit"],
            d["machine"])


def paper_run(table1, flags):  # the paper's run by table1.py's constants: minutes, hours, disk
    steps = flags["--epochs"] * table1.DEEPSCALER // flags["--prompts"]
    hours = [steps * minutes / 60 for minutes in table1.PLAN_STEP_MIN]
    return (table1.PLAN_GPUS, *table1.PLAN_STEP_MIN, table1.PLAN_GPUS, *hours,
            *(table1.PLAN_GPUS * h for h in hours), steps, flags["--epochs"],
            table1.PLAN_CKPT_BYTES * table1.PLAN_PARAMS_B)


def plan_estimate(printed):  # --plan's GPU-hours (to hundreds), days and disk, as printed
    hours = re.search(r"~([\d,]+)-([\d,]+) GPU-hours", printed).groups()
    return (*(round(int(h.replace(",", "")), -2) for h in hours),
            *re.search(r"~(\d+)-(\d+) days", printed).groups(),
            *re.search(r"~(\d+) GB of disk \(~(\d+) GB more", printed).groups())


REHEARSAL = "checks/gpu_rehearsal.json"  # make gpu-check's CPU rehearsal, on the one-GPU stack


def gpu_plan_minutes(g):  # gpu_check.py's plan in minutes, without vLLM and with its starts
    plan = sum(g.PLAN_S.values())
    return plan / 60, (plan + g.VLLM_START_S + g.VLLM_COMMAND_S) / 60


def check_gpus_bytes(code):  # the bytes a parameter fgrpo.check_gpus plans for
    return int(re.search(r"return (\d+) \* params", inspect.getsource(code.gpu_plan_gib))[1])


def collective_hours(code):  # how long a collective of fgrpo.train waits
    return int(re.search(r"timedelta\(hours=(\d+)\)", inspect.getsource(code))[1])


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
    return s


def card(s, flags, gb):  # on a card of gb: the largest safe --vllm-mem, vLLM's share, KV cache
    share = flags["--vllm-mem"] * gb
    return ((gb - s["resident"] - CUDA_CONTEXT_GB) / gb, share, share - s["bf16"],
            round((share - s["bf16"]) * 1e9 / s["kv_token"], -4) / 1e3)


def sized(read):  # a reader of PAPER_RUN's sources through paper_sizes: read(sizes, t1, flags)
    return lambda t1, gc, flags, code: read(paper_sizes(t1, gc, flags, code), t1, flags)


def plan_evaluation(table1):  # table1.py's estimate of one evaluation of the six math benchmarks
    args = SimpleNamespace(params_b=None, model="Qwen/Qwen2.5-7B", eval_flags="")
    cost = table1.estimate(SimpleNamespace(kind="eval"), args)
    problems = sum(table1.BENCH_SIZES[name] for name in table1.SIX_MATH.split(","))
    n = evaluator.build_parser().get_default("n")
    return (problems, n, *cost.gpu_hours, cost.disk_gb,
            cost.disk_gb * 1e9 / (problems * n * table1.PLAN_TOKENS[1]))

def seed_range(d):  # a see_it_happen result's first and last seed
    return d["seeds"][0]["seed"], d["seeds"][-1]["seed"]


def first_digit_mass(d):  # the base model's mass on the first digit, mean over seeds and prompts
    return statistics.fmean(statistics.fmean(s["base"]["rare/tie"]["first"]) for s in d["seeds"])


def halved(d):  # w_8 / its limit at gamma 0, for nearly unsolved and nearly solved prompts
    low, high = (weights("weight_ratio", 0, p, [8])(d)[0] for p in (0.05, 0.95))
    assert f"{low:.2f}" == f"{high:.2f}" and abs(low - 0.5) < 0.01, (low, high)  # "halves"
    return 8, "halves", low, 0.05, 0.95


def n_minus_exact(d):  # N 8 minus the exact update, both F gammas, AdamW, tie mix; intervals hold 0
    runs = [d["runs"]["adamw"]["mixes"]["tie"]["difference"][g] for g in ("0.5", "1")]
    assert all(r["lo"] <= 0 <= r["hi"] for r in runs)
    return (d["config"]["n"], *sorted(r["mean"] for r in runs))


def above_dapo(d):  # where F at N 8 is above DAPO: on average, on every seed, most, and not
    n = seen("frontier", "1/8", "pass@16", "gap", "n")(d)
    by_k = {k: seen("frontier", "1/8", f"pass@{k}")(d) for k in SEEN_KS}
    low, high = seen_ks(lambda c: c["gap"]["lo"] > 0, "frontier", "1/8")(d)
    return (8, low, high, n, n, *seen_ks(lambda c: c["gap"]["positive"] == n, "frontier", "1/8")(d),
            *sorted(sorted(SEEN_KS, key=lambda k: -by_k[k]["gap"]["mean"])[:2]),
            *(k for k in SEEN_KS if k > high))


def sharpening(d, protocol):  # section 6's bullet on the rare strategy's loss, lr 3e-5, N 8
    lr = protocol["design"]["lrs"][0]
    arm = f"dapo_g{{}}_lr{lr:g}_n8".format
    dapo, focal = (seen("arms", arm(g))(d) for g in (0, 1))
    return (sci(lr), 8, seen("base", "pass@1", 0)(d), dapo["pass@1"], dapo["rare share"],
            seen("constants", "lost")(d), dapo["rare lost"], focal["pass@1"], focal["rare share"],
            focal["rare lost"], *seen("frontier", "1/8", "rare lost", "medians_by_level", 0)(d),
            *seen("frontier", "1/8", "rare lost", "medians_by_level", -1)(d),
            *seen_ci("frontier", "1/8", "rare lost", "gap")(d))


def longer_runs(d, protocol):  # the ceiling runs: steps against the grid's, their seeds, the tops
    ratio = protocol["ceilings"]["steps"] / protocol["design"]["steps"]
    first = d["seeds"][0]["seed"]
    return ({2: "twice"}[ratio], protocol["ceilings"]["steps"], first,
            first + protocol["ceilings"]["seeds"] - 1,
            seen("ceilings", "means", "1/8", "pass@1")(d),
            seen("ceilings", "means", "0/8", "pass@1")(d),
            *seen_ci("ceilings", "1/8 minus base", "pass@1")(d))


def lowest_and_ahead(d):  # lr 1e-3: the N of the least M_ret at gamma 0; gamma 1 ahead below N
    means = {(n, g): m_ret("adamw", n, g)(d)[0] for n in d["settings"]["n"] for g in (0.0, 1.0)}
    ns = d["settings"]["n"]
    full = min(n for n in ns if f"{means[(n, 0.0)]:.3f}" == f"{means[(n, 1.0)]:.3f}" == "1.000")
    assert all(means[(n, 1.0)] > means[(n, 0.0)] for n in ns if n < full)
    return min(ns, key=lambda n: means[(n, 0.0)]), 1, full, 1


def anchor_takes_all(d):  # lr 1e-2, gamma 0: from which N the anchor holds nearly all the mass
    ns = d["settings"]["n"]
    kept = {n: m_ret("adamw", n, 0.0)(d)[0] for n in ns}
    start = min(n for n in ns if all(kept[m] < 0.05 for m in ns if m >= n))
    big = [n for n in ns if n >= start]
    return (start, *lowest_highest(lambda d: [kept[n] for n in big])(d),
            *lowest_highest(lambda d: [m_ret("adamw", n, 0.0, "correct_mass")(d)[0]
                                       for n in big])(d))



# ---------------------------------------------------------------- NUMBERS: each page's entries
README = [
    Declared("`gamma = 0` is the base algorithm exactly", FORMULA),
    Figure("`fgrpo.group_advantages(rewards)` defaults to gamma {:g}", "fgrpo.py",
           lambda m: inspect.signature(m.group_advantages).parameters["gamma"].default),
    Figure("**GRPO {:.1f}, DAPO {:.1f}, CISPO {:.1f}**", "fgrpo.py",
           lambda m: tuple(m.PAPER_GAMMA[a] for a in ("grpo", "dapo", "cispo"))),
    Figure("The demo and the headline command below pass `--gamma {:g}`, the strongest of them.",
           ("text:Makefile", "fgrpo.py"), demo_gamma),
    Figure("a {}-layer Qwen2-architecture model (a real `Qwen2Tokenizer` over a {}-token "
           "vocabulary)", "fgrpo.py", tiny_shape),
    Declared("`max(3,9,1,4,7)=` -> `\\boxed{9}`", EXAMPLE),
    Figure("then eval.py on {} held-out problems", "fgrpo.py",
           lambda m: source_of(m, r"not in digits\]\[:(\d+)\]", m.build_tiny)),
    *(Figure("{}", DEMO, demo_line(f"step {k}/150 ")) for k in (1, 2, 50, 150)),
    *(Figure("{}", DEMO, demo_line(f"| {m} |"))
      for m in ("runs/demo/tiny_seed0/model", "runs/demo/step_000150")),
    Figure("# after {} steps", "fgrpo.py", lambda m: m.TINY["steps"]),
    Figure("The reward goes from {:.2f} to {:.2f}, and held-out pass@1 from {} to {} (pass@8: {} "
           "to {}). That run took {} s at commit {}, on {}.", DEMO, demo_summary),
    Figure("in a plan of {:.0f} minutes ({:.0f} with vLLM)", GPU_CHECK, gpu_plan_minutes),
    Figure("a node of {} GPUs (the paper used 16 H100s, App. L); about {}-{} minutes a step on {} "
           "H100s, so {:.0f}-{:.0f} hours, {:.0f}-{:,.0f} GPU-hours, for the {:,} steps of {} "
           "epochs; {:.0f} GB of disk", (TABLE1, FLAGS), paper_run),
    Declared("the paper used 16 H100s", paper("App. L")),
    Declared("(Table 1, Qwen2.5-7B, N = 8)", paper("Table 1")),
    Figure("| " + " | ".join(["{} / {}"] * 6) + " |", TABLE1,
           lambda t: tuple(x for run in ("grpo", "f-grpo", "dapo", "f-dapo", "cispo", "f-cispo")
                           for x in t.PAPER[run])),
    Declared("`--gamma 0` for the base runs", FORMULA),
    Figure("{:,}-{:,} GPU-hours for the trainings and evaluations, **about {}-{} days on a node of "
           "{} GPUs**; about {} GB of disk, {} GB more", (PLAN, TABLE1),
           lambda printed, t: (*plan_estimate(printed)[:4], t.PLAN_GPUS,
                               *plan_estimate(printed)[4:])),
    Declared("at gamma 0 each equals the plain trainer", FORMULA),
    Declared("Pass `correct=` (0/1)", FORMULA),
    Figure("F (gamma {:g})", PROTOCOL, lambda d: d["design"]["gammas"][-1]),
    Figure("a model over {} parameters is refused", "fgrpo.py", hf_limit),
    Figure("`python fgrpo.py --model tiny --algo dapo --gamma {:g} --out runs/demo`",
           ("text:Makefile", "fgrpo.py"), demo_gamma),
]
# the peers' reading, in the README and docs/why-focal.md's section 8: a group of its own
PEERS_README = [
    Figure("against {} methods built for pass@k", PEERS_PROTOCOL,
           lambda d: WORDS[sum("peer" in arm for arm in d["arms"].values())]),
    Figure("adapted to groups of {}", PEERS_PROTOCOL, lambda d: d["design"]["n"]),
    Figure("shows its gain (seeds {}-{})", SHAPED,
           lambda d: (d["seeds"][0]["seed"], d["seeds"][-1]["seed"])),
    Figure("each peer minus F-DAPO in pass@{} at matched pass@1", PEERS,
           lambda d: d["summary"]["headline_k"]),
    Declared("mean [95% t interval]", FORMULA),
    Figure("over seeds {}-{}", PEERS_PROTOCOL,
           lambda d: (d["seeds"]["all"][0], sum(d["seeds"]["all"]) - 1)),
    Figure("PKPO and Pass@k Training at k {} traded", PEERS_PROTOCOL, lambda d: peer_k(d, "")),
    Figure("the base model's pass@1 ({:.3f})", PEERS_READ, lambda *s: peer_base(*s)["pass@1"]),
    Figure("ran both at k {}", PEERS_AMENDMENT_PROTOCOL, lambda d: peer_k(d, "_k2")),
    Figure("| F-DAPO | (itself) | | {:.3f} / {:.3f} |", PEERS_READ,
           lambda *s: peer_ended(s, "f_dapo")),
    *(Figure(f"| {name}, k {{}} | no seed matched | {{}} | {{:.3f}} / {{:.3f}} |", PEERS_READ,
             lambda *s, arm=arm: (s[1]["config"]["arms"][arm]["k"],
                                  peer_verdict(s, "grid", arm), *peer_ended(s, arm)))
      for name, arm in (("PKPO", "pkpo"), ("Pass@k Training", "passk_training"))),
    *(Figure(f"| {name}, k {{}} (amendment) | {CI3} | {{}} | {{:.3f}} / {{:.3f}} |", PEERS_READ,
             lambda *s, arm=arm: (s[2]["config"]["arms"][arm]["k"], *peer_gap(s, "amendment", arm),
                                  peer_verdict(s, "amendment", arm), *peer_ended(s, arm)))
      for name, arm in (("PKPO", "pkpo_k2"), ("Pass@k Training", "passk_training_k2"))),
    *(Figure(f"| {name} | {CI3} | {{}} | {{:.3f}} / {{:.3f}} |", PEERS_READ,
             lambda *s, arm=arm: (*peer_gap(s, "grid", arm), peer_verdict(s, "grid", arm),
                                  *peer_ended(s, arm)))
      for name, arm in (("unlikeliness reward", "unlikeliness"), ("W-REINFORCE", "w_reinforce"),
                        ("MaxRL", "maxrl"))),
    Figure(f"| DARLING ({{}} seeds matched) | {CI3} | {{}} | {{:.3f}} / {{:.3f}} |", PEERS_READ,
           lambda *s: (s[1]["summary"]["primary"]["darling"]["gap"]["n"],
                       *peer_gap(s, "grid", "darling"), peer_verdict(s, "grid", "darling"),
                       *peer_ended(s, "darling"))),
    Figure("every arm's best pass@{} is within {:.3f} of certainty", PEERS_READ, lambda *s: (
        s[0].TRADEOFF_KS[-1], 1 - min(peer_reach(s, arm, -1)["best"] for arm in peer_arms(s)))),
]
CONTRIBUTING = [
    Figure("at most {} characters in every tracked .py file, the Makefile and the docs; none over "
           "{} lines in a function; `fgrpo.py` at most {:,} lines, `eval.py` at most {} lines and "
           "`checks/gpu_check.py` at most {} lines; the README at most {:,} words and {} lines, "
           "and the docs together at most {:,} words", THIS,
           lambda t: (t.LINE_LIMIT, t.FUNCTION_LIMIT, *t.FILE_LIMITS.values(),
                      t.WORD_LIMITS["README.md"], t.README_LINES, t.WORD_LIMITS["docs"])),
    Figure("pytest {:.0f} s in the unchanged copy", MUTATION,
           lambda d: float(re.search(r" in ([\d.]+)s ", d["baseline"]["detail"])[1])),
    Figure("(planted bugs caught: {} of {}, {} timed out", MUTATION, lambda d: (
        sum(m["status"] == "caught" for m in d["mutants"]), len(d["mutants"]),
        sum(m["status"] == "TIMEOUT" for m in d["mutants"]))),
    Figure("({} of {} rows as expected", PARITY, lambda d: (
        sum(r["equal"] == r["expect_equal"] for r in d["rows"]), len(d["rows"]))),
]
MAKE_HELP = "make help"  # the Makefile's ## comments, as make help prints them
MAKEFILE = [
    Declared("BENCH_QUICK=1", EXAMPLE),
]
EVAL = [
    Figure("(App. L.4): n = {} samples a problem, temperature {:.1f}, top-p {:.1f}, {:,} new "
           "tokens", EVAL_FLAGS, at("--n", "--temperature", "--top-p", "--max-new-tokens")),
    Declared("a two-sided p", FORMULA),
    Declared("p = (1 + the redraws with |delta*| >= |delta|) / (iters + 1)", FORMULA),
    Declared("p = 2 min(share of delta* <= 0, share >= 0)", FORMULA),
    Figure("k runs to m, n/{} by default (App. Q's m of n)", "eval.py",
           lambda m: paper_m(m)[1] // paper_m(m)[0]),
    Declared("by sqrt(n/m - 1), at m = n/4 a factor of sqrt(3)", FORMULA),
    Figure("so p < {:g} needs |delta| above {:.2f} of its standard deviations instead of {:.2f}, "
           "and equally good checkpoints get it far less often than {:.0%}.", CALIBRATION,
           lambda d: (
               d["settings"]["alpha"], _z(d) * 3 ** 0.5, _z(d), d["settings"]["alpha"])),
    Declared("Above m = n/2", FORMULA),
    Figure("share of p < {:g} lies between {:.1f}% and {:.1f}% at every n and k; the paper's test "
           "says p < {:g} for them {:.1f} to {:.1f}% of the time. For B better, it finds the "
           "difference {:.0f} to {:.0f}% of the time at k = {} where the permutation test finds it "
           "{:.0f} to {:.0f}%, at every n: a p below {:g} from it", CALIBRATION, lambda d: (
               d["settings"]["alpha"], *lowest_highest(shares("permutation", "null"))(d),
               d["settings"]["alpha"], *lowest_highest(shares("subsampling", "null"))(d),
               *lowest_highest(shares("subsampling", "power", k=1))(d), 1,
               *lowest_highest(shares("permutation", "power", k=1))(d), d["settings"]["alpha"])),
]
INTEGRATIONS = [
    Declared("0/1", FORMULA), Declared("+-1", FORMULA), Declared("gamma 0", FORMULA),
    Declared("g(x) >= 0", FORMULA), Declared("g >= 0", FORMULA),
    Figure("above a threshold T, {:g} by default", "text:integrations/trl_fgrpo.py",
           lambda text: float(re.search(r"correct_above=([\d.]+)\)", text)[1])),
    Declared("**Plus a format bonus under 0.5**: T = 0.5", FORMULA),
    Declared("T = 0. **Partial credit**", FORMULA),
    Declared("in [-penalty_factor, 0]): T = -0.5 separates right from wrong while penalty_factor "
             "< 1.5", FORMULA),
    Declared("so T = 0 miscounts", FORMULA),
    Declared("at gamma > 0", FORMULA),
    Declared("would give weights above 1", FORMULA),
    Declared("all equal but not 0 or 1", FORMULA),
    Declared("gives it exactly 0", FORMULA),
    Figure("gamma {:g}, {:g} and {:g})", "checks/parity.py", lambda m: m.GAMMAS),
    Declared("`epsilon_high` set to 1 + eps_high", FORMULA),
]
PAPER_RUN_PAGE = [
    Declared("rank 0", FORMULA),
    Figure("a model over {} parameters", "fgrpo.py", hf_limit),
    Figure("| `--prompts` x `--n`, `--mini-batch` | {} x {}, {} prompts | the same |", FLAGS,
           at("--prompts", "--n", "--mini-batch")),
    Figure("| `--epochs`, `--max-new-tokens` | {}, {:,} | the same |", FLAGS,
           at("--epochs", "--max-new-tokens")),
    Figure("| `--micro-batch` | {} sequences per forward and backward |", FLAGS,
           at("--micro-batch")),
    Figure("| `--rollout` | vLLM, `--vllm-mem` {:g} |", FLAGS, at("--vllm-mem")),
    Declared("| GPUs | every GPU of the node | 16 H100s |", paper("App. L")),
    Figure("Arithmetic for Qwen2.5-7B ({:g}B parameters), not measured. Per GPU, with FSDP2 over "
           "{} ranks, the trainer holds its shards of the fp32 weights, gradients and AdamW "
           "moments ({:.1f} + {:.1f} + {:.1f} GB), a bf16 decoder layer gathered at a time "
           "({:.1f} GB, and the next prefetched), the root's embedding and lm_head ({:.1f} GB), "
           "checkpointed activations at micro-batch {} x {:,} tokens (about {:.0f} GB) and a "
           "{}-position chunk of fp32 logits ({:.1f} GB; the full logits would be {:.0f} GB): "
           "about {:.0f} GB. At the weight sync vLLM's share (bf16 weights {:.0f} GB, the rest KV "
           "cache at {:.0f} KB a token) sits beside the resident fp32 weight and AdamW shards "
           "({:.1f} GB)", PAPER_RUN,
           sized(lambda s, t1, f: (
               s["params"], s["gpus"], s["shard"], s["shard"], s["adam"], s["layer"], s["root"],
               f["--micro-batch"], s["tokens"], s["activations"], s["chunk"], s["chunk_gb"],
               s["logits"], s["training"], s["bf16"], s["kv_token"] / 1e3, s["resident"]))),
    Figure("| GPU | largest safe `--vllm-mem` | at the default {:g}:", FLAGS, at("--vllm-mem")),
    *(Figure(f"| {{}} GB ({names}) | about {{:.1f}} | {{:.0f}} GB, {{:.0f}} GB (about {{:.0f}}k "
             "tokens) |", PAPER_RUN, sized(lambda s, t1, f, gb=gb: (gb, *card(s, f, gb))))
      for gb, names in zip(CARDS_GB, ("A100, H100", "H200"))),
    Figure("A single GPU does not hold a 7B run: {} bytes a parameter is {:.0f} GB before vLLM's "
           "share", PAPER_RUN,
           sized(lambda s, t1, f: (s["per_param"], s["per_param"] * s["params"]))),
    Figure("Each rank samples {} completions; at {:,}-{:,} tokens each, decoded at {:,}-{:,} "
           "tokens/s per GPU, the rollout takes {:.1f}-{:.0f} minutes.", PAPER_RUN,
           sized(lambda s, t1, f: (
               s["completions"], *t1.PLAN_TOKENS, *reversed(t1.PLAN_DECODE), *s["rollout"]))),
    Figure("so roughly {}-{} minutes per step, over the paper's {} epochs ({:,} steps: {} x {:,} "
           "problems // {} prompts)", PAPER_RUN, sized(lambda s, t1, f: (
               *t1.PLAN_STEP_MIN, f["--epochs"], s["steps"], f["--epochs"], t1.DEEPSCALER,
               f["--prompts"]))),
    Figure("the latest checkpoint is {:.0f} GB (the fp32 model and the optimizer state)", PAPER_RUN,
           sized(lambda s, t1, f: t1.PLAN_CKPT_BYTES * s["params"])),
    Figure("not resumed from: {:.0f} GB more for each "
           "save", PAPER_RUN, sized(lambda s, t1, f: s["fp32"])),
    Figure("A collective waits up to {} hours", "fgrpo.py", collective_hours),
]
TABLE1_PAGE = [
    Declared("gamma 0", FORMULA),
    Declared("`--train-flags \"--gamma 1\"`", EXAMPLE),
    Figure("is under {}, the largest k", TABLE1, lambda t: t.PAPER_K),
    Figure("n = {}", TABLE1, lambda t: t.TINY_EVAL_N),
]
SMOLLM2 = [
    Declared("gamma 0", FORMULA),
]
VERIFICATION = [
    Declared("`first \\boxed{7}, then finally \\boxed{12}`", EXAMPLE),
    Declared("the gold `12`", EXAMPLE),
    Declared("`10 + 9 = x` for the gold `19`", EXAMPLE),
    Figure("(AMD EPYC, {:.1f} GB, {} cores, torch {}, commit {})", BENCH, lambda d: (
        d["machine"]["memory_gb"], d["machine"]["cores"], d["machine"]["versions"]["torch"],
        d["machine"]["commit"])),
    *(Figure(row, BENCH, bench_row(i)) for i, row in enumerate([
        "| log-probs: peak memory | {:,.0f} MB | {:,.0f} MB | {:.3f} | {} |",
        "| log-probs: time | {:.1f} s | {:.1f} s | {:.2f} | {} |",
        "| verify: completions/s | {:,.0f} | {:,.0f} | {:.2f} | {} |",
        "| training step vs TRL: time | {:.3f} s | {:.3f} s | {:.3f} | {} |",
        "| training step vs TRL: memory | {:.1f} MB | {:.1f} MB | {:.2f} | |",
        "| vLLM vs generate(), demo, {} x {}: tokens/s | {:,.0f} | {:,.0f} | {:.3f} | |",
        "| vLLM vs generate(), demo, {} x {}: tokens/s | {:,.0f} | {:,.0f} | {:.3f} | |",
        "| vLLM vs generate(), long, {} x {}: tokens/s | {:,.0f} | {:,.0f} | {:.2f} | |",
        "| vLLM vs generate(), long, {} x {}: tokens/s | {:,.0f} | {:,.0f} | {:.2f} | |",
        "| updates at RL-like lengths | {:.1f} s | {:.1f} s | {:.3f} | {} |"])),
    Figure("on {} cores, at most {} times as fast", BENCH,
           lambda d: (d["machine"]["usable_cores"],) * 2),
]
WHY_FOCAL = [
    Figure("N {}", PROTOCOL, lambda d: d["design"]["n"]),
    Figure("N = {}", PROTOCOL, lambda d: d["design"]["n"]),
    Figure("groups of {}", PROTOCOL, lambda d: d["design"]["n"]),
    Figure("gamma {:g}", PROTOCOL, lambda d: d["design"]["gammas"][-1]),
    Figure("gamma = {:g}", CAT_LR3, lambda d: d["settings"]["gammas"][-1]),
    *(Declared(x, FORMULA) for x in ("gamma 0", "gamma = 0", "gamma-0", "at ratio 1", "(1/N)",
                                     "(1 - p)^k", "pass@2 / 2", "(b / (1 - b))^gamma",
                                     "pass@(gamma + 1)", "the gap at k = 1 is 0 by construction",
                                     "(intervals holding 0)", "mean [95% t interval]")),
    Figure("at N = {} an easy prompt (mu_pos = {:g}) still updates while missing a rare {:.0%} "
           "mode {:.0%} of the time", "experiments/categorical.py",
           lambda m: (8, 0.9, 0.05, m.tail_miss_probability(8, 0.9, 0.05))),  # an example's inputs
    Figure("agrees within {:.1f} standard errors on every logit", TWO, monte_carlo_z),
    Figure("N = {} {} the weight of nearly unsolved and nearly solved prompts ({:.2f} at p {:g} "
           "and at {:g})", TWO, halved),
    Figure("N {} gives p {:g} {:.2f} of its limit weight and p {:g} {:.2f} times "
           "it", TWO, lambda d: (
        8, 0.05, *weights("weight_ratio", 1, 0.05, [8])(d), 0.95,
        *weights("weight_ratio", 1, 0.95, [8])(d))),
    Figure("from first {:g}, last {:g}", TWO, at("config/init/0", "config/init/1")),
    Figure("AdamW " + CI3 + " at N {} and " + CI3 + " exact", TWO, lambda d: (
        *gap("adamw", "tie", "sampled", "1")(d), d["config"]["n"],
        *gap("adamw", "tie", "exact", "1")(d))),
    Figure("N {} minus exact is {:+.3f} to {:+.3f} with AdamW (intervals holding 0)", TWO,
           n_minus_exact),
    Figure("Every F arm reaches a slightly lower highest pass@1 ({:+.3f} to {:+.3f})", TWO,
           lambda d: (max(every_two_strategy("ceiling")(d)),
                      min(every_two_strategy("ceiling")(d)))),
    Figure("the gains are small ({:+.3f} to {:+.3f})", TWO,
           lowest_highest(every_two_strategy("gap", ("rare",)))),
    Figure("trains tiny's {}-layer transformer", "fgrpo.py", lambda m: tiny_shape(m)[0]),
    Figure("copies the first digit with mass {:.2f}", SEEN, first_digit_mass),
    Figure("with {:.3f} ± {:.3f} on the confirmation seeds", SEEN, seen("base", "rare mass")),
    Figure("before seeds {}-{} ran, and is confirmed: " + CI3 + ", {} of {} seeds (seeds {}-{}: "
           "{:+.3f})", (SEEN, SHAPED), lambda a, b: (
               *seed_range(a), *seen_ci("frontier", "1/8", "pass@16", "gap")(a),
               *(seen("frontier", "1/8", "pass@16", "gap", x)(a) for x in ("positive", "n")),
               *seed_range(b), seen("frontier", "1/8", "pass@16", "gap", "mean")(b))),
    Figure("was shaped on seeds {}-{}", SHAPED, seed_range),
    Figure("at p = {:.3f} it is solved at k {}", SEEN,
           lambda d: (seen("base", "rare mass", 0)(d), SEEN_KS[-1])),
    Figure("The base model's pass@k is " + ", ".join(["{:.2f} at k {}", *["{:.2f} at {}"] * 3]) +
           ", {:.3f} at {} and {:.3f} at {}", SEEN, lambda d: tuple(
               x for k in (2, 16, 32, 64, 128, 256) for x in (seen("base", f"pass@{k}", 0)(d), k))),
    Figure("(the largest k whose base pass@k is at most {:g}), is {};", SEEN,
           lambda d: (seen("constants", "headline_max")(d), seen("headline_k")(d))),
    Figure("**F at N {} is above DAPO at k {} to {}** ({} of {} seeds at k {} to {}), most at k {} "
           "and {}; at k {} and {} it is not", SEEN, above_dapo),
    Figure("At lr {}, N {}, DAPO's pass@1 rises from {:.3f} to {:.3f}, and at the end the rare "
           "strategy's share of the correct mass is {:.3f} and it is lost (share under {:.0%}) on "
           "{:.0%} of the prompts. F at the same lr: pass@1 {:.3f}, share {:.3f}, lost on {:.0%}. "
           "At matched pass@1 the lost fraction goes from {:.2f} (DAPO) and {:.2f} (F) at the "
           "first level to {:.2f} and {:.2f} at the top; F minus DAPO, paired, is " + CI3,
           (SEEN, PROTOCOL), sharpening),
    Figure("F at N {} is still above DAPO's exact update at k {} to {}", SEEN, lambda d: (
        8, *seen_ks(lambda c: c["gap"]["lo"] > 0, "versus_exact", "1/8 - 0/exact")(d))),
    Figure("DAPO's stable runs at N {} reach pass@1 {:.3f}, F's {:.3f} "
           "(" + CI3 + ", {} of {} seeds "
           "above)", SEEN, lambda d: (
               8, *seen("frontier", "1/8", "pass@1", "ceilings")(d),
               *seen_ci("frontier", "1/8", "pass@1", "ceiling")(d),
               seen("frontier", "1/8", "pass@1", "ceiling", "positive")(d),
               seen("frontier", "1/8", "pass@1", "ceiling", "n")(d))),
    Figure("Run {} as long ({} steps, each arm's best stable lr, seeds {}-{}), F reaches {:.3f} "
           "and DAPO {:.3f} (" + CI3 + ")", (SEEN, PROTOCOL), longer_runs),
    Figure("runs the paper's abstraction: {:,} actions, {:,} of them correct (initial correct mass "
           "{:.3f})", CAT_LR2, at("settings/n_actions", "settings/n_correct",
                                 "settings/initial_correct_mass")),
    Figure("lr {}", CAT_LR2, lambda d: sci(d["settings"]["lr"]["adamw lr=0.01"])),
    Figure("lr {}", CAT_LR3, lambda d: sci(d["settings"]["lr"]["adamw lr=0.001"])),
    Figure("weight decay {:g}", CAT_LR2, at("settings/weight_decay")),
    Figure("# {:.0f} s + {:.0f} s", CAT_LR2,
           at("settings/wall_s/adamw lr=0.01", "settings/wall_s/sgd lr=5000")),
    Figure("# {:.0f} s", CAT_LR3, at("settings/wall_s/adamw lr=0.001")),
    Declared("the paper's N = 8", paper("Table 1")),
    Figure("in both AdamW runs: {:.3f} vs {:.3f} at lr {}, and {:.3f} vs {:.3f} at lr {}.",
           (CAT_LR2, CAT_LR3), lambda a, b: tuple(
               x for d, lr in ((a, "adamw lr=0.01"), (b, "adamw lr=0.001"))
               for x in (m_ret("adamw", 8, 1.0)(d)[0], m_ret("adamw", 8, 0.0)(d)[0],
                         sci(d["settings"]["lr"][lr])))),
    Figure("lowest at N = {}, and gamma = {:g} retains more at every N below {}, where both round "
           "to {:.3f}", CAT_LR3, lowest_and_ahead),
    Figure("at most about {:.0%} of the mass is lost", CAT_LR3,
           lambda d: 1 - min(m_ret("adamw", n, g)(d)[0] for n in d["settings"]["n"]
                             for g in (0.0, 1.0))),
    Figure("From N = {} up the anchor takes nearly all of the probability (M_ret {:.3f} to {:.3f}) "
           "while total correct mass grows to {:.3f} to {:.3f}", CAT_LR2, anchor_takes_all),
]
PEERS_WHY_FOCAL = [
    Figure("adapted to groups of {}", PEERS_PROTOCOL, lambda d: d["design"]["n"]),
    *(Declared(x, FORMULA) for x in ("k (1 - mu)^(k-1)", "N (1 - (1 - mu)^(N-1)) / mu",
                                     "N (1 + lambda)",
                                     "give 0 to a group with under k - 1 or under k wrong",
                                     "nearly 0", "at every k past 1")),
    *(Declared(x, WORDING) for x in ("on one direction", "the two regions",
                                     "the one k the two were compared at")),
    Figure("near mu {:.1f} (\"both\", \"common\") and {:.2f} (\"rare\")", SEEN,
           lambda d: (first_digit_mass(d), seen("base", "rare mass", 0)(d))),
    Figure("so near mu {:.1f}", SEEN, first_digit_mass),
    Figure("PKPO and Pass@k Training at k {} pushed", PEERS_PROTOCOL, lambda d: peer_k(d, "")),
    Figure("ended at {:.3f} and {:.3f} (F-DAPO's {:.3f}, the base model's too)", PEERS_READ,
           lambda *s: (*(peer_share(s, arm) for arm in ("pkpo", "passk_training", "f_dapo")),)),
    Figure("At k {} (the amendment)", PEERS_AMENDMENT_PROTOCOL, lambda d: peer_k(d, "_k2")),
    Figure("Pass@k Training's at k {} wherever", PEERS_PROTOCOL, lambda d: peer_k(d, "")),
    Figure("at or above DAPO's on {} of {} seeds", PEERS_READ, lambda *s: (
        peer_pair(s, "f_dapo", "dapo")["a_at_least_b"], peer_pair(s, "f_dapo", "dapo")["overlap"])),
    Figure("PKPO at k {} shares a pass@1 range with F-DAPO on {} seeds of {}; on the other {},",
           PEERS_READ, lambda *s: (s[0].PROTOCOL["arms"]["pkpo"]["k"],
                                   peer_pair(s, "f_dapo", "pkpo")["overlap"], len(s[1]["seeds"]),
                                   peer_pair(s, "f_dapo", "pkpo")["a_range_above"])),
]
GPU_CHECK_PAGE = [
    Figure("runs fgrpo's own code on a node's GPUs, offline, in a plan of {:.0f} minutes ({:.0f} "
           "with vLLM)", GPU_CHECK, gpu_plan_minutes),
    Figure("It downloads nothing (`HF_HUB_OFFLINE={}`)", GPU_CHECK,
           lambda g: source_of(g, r'setdefault\("HF_HUB_OFFLINE", "(\d)"\)')),
    Figure("more than {} bf16 roundings of the largest logit", GPU_CHECK,
           lambda g: WORDS[int(source_of(g, r"tolerance = (\d) \* torch.finfo", g.part_logprobs))]),
    Figure("stopped by SIGTERM once {} its steps are logged", GPU_CHECK,
           lambda g: {2: "half"}[int(source_of(g, r'"--steps"\) \+ 1\]\) // (\d)',
                                               g.run_command))]),
    *(Figure(f"| {name} | {{}} s | {{:.0f}} s |", (GPU_CHECK, REHEARSAL),
             lambda g, d, n=name: (g.PLAN_S[n], d["seconds"][n]))
      for name in ("setup", "logprobs", "step", "command")),
    Figure("| total | {} s | {:.0f} s |", (GPU_CHECK, REHEARSAL),
           lambda g, d: (sum(g.PLAN_S.values()), sum(d["seconds"].values()))),
    Figure("measured at commit {}, on {} shared CPU cores, torch {} and transformers {} without "
           "vLLM; `make gpu-check` took {:.0f} s in all", REHEARSAL,
           lambda d: (d["rehearsal"]["commit"], int(d["rehearsal"]["machine"].split()[0]),
                      d["torch"], d["setup"]["transformers"], d["rehearsal"]["make_wall_s"])),
    Figure("the command on {} gloo ranks", GPU_CHECK, lambda g: WORDS[g.CPU_RANKS]),
    Figure("on every GPU: {} steps of {} prompts a GPU, {} samples each of up to {:,} new tokens",
           GPU_CHECK, lambda g: (g.COMMAND_STEPS, *g.COMMAND_SIZES["cuda"].values())),
    Figure("the demo learning in {} steps", GPU_CHECK, lambda g: g.TINY_STEPS),
    Declared("at the paper's 8,192 tokens", paper("Table 5")),
    Figure("the plan adds its starts, {} s to the step part and {} s to the command part",
           GPU_CHECK, lambda g: (g.VLLM_START_S, g.VLLM_COMMAND_S)),
    Figure("in a share of its own, {} s", GPU_CHECK, lambda g: g.COMMAND_S),
]
NUMBERS = {  # each page's entries together: a page rewritten brings its list along
    "README.md": README + PEERS_README,
    "CONTRIBUTING.md": CONTRIBUTING,
    "docs/eval.md": EVAL,
    "docs/integrations.md": INTEGRATIONS,
    "docs/paper-run.md": PAPER_RUN_PAGE,
    "docs/smollm2.md": SMOLLM2,
    "docs/table1.md": TABLE1_PAGE,
    "docs/verification.md": VERIFICATION,
    "docs/why-focal.md": WHY_FOCAL + PEERS_WHY_FOCAL,
    "docs/gpu-check.md": GPU_CHECK_PAGE,
    MAKE_HELP: MAKEFILE,
}
# Rewritten elsewhere, each exempt from the scan and counted at its word budget while it reads
# exactly as it did: the first change to it brings it under the scan (its NUMBERS entries due).
PENDING = {}


def _text(page, root=ROOT):
    """A page's text: a markdown file, or make help's lines (the Makefile's ## comments)."""
    if page == MAKE_HELP:
        return "\n".join(re.findall(r"^[a-z0-9-]+:.*?## (.*)$", (root / "Makefile").read_text(),
                                    re.M))
    return (root / page).read_text()


def _pending(page, text):  # the part of a page's text still exempt: all, a line, or nothing
    held = PENDING.get(page)
    if held is None:
        return ""
    if hashlib.sha256(text.encode()).hexdigest() == held:
        return text
    return held if held in text.splitlines() else ""


def _said(entry, sources):
    """The entry's words as its sources give them, whitespace runs as one space, and the spans of
    its numbers: each field of a Figure, the whole of a Declared's words."""
    if isinstance(entry, Declared):
        assert entry.kind in (FORMULA, EXAMPLE, WORDING) or PAPER.fullmatch(entry.kind), entry
        return " ".join(entry.text.split()), [(0, len(" ".join(entry.text.split())))]
    values = entry.read(*(sources[name] for name in _files(entry)))
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    words, spans = "", []
    for literal, field, spec, _ in string.Formatter().parse(entry.text):
        words += literal
        if field is not None:
            value = " ".join(format(values.pop(0), spec).split())
            spans.append((len(words), len(words) + len(value)))
            words += value
    assert spans and not values and "  " not in words and "\n" not in words, entry.text
    return words, spans


def _where(words, text):  # every place words stand in text, as a phrase of its own
    at = [m.start() for m in re.finditer(re.escape(words), text)]
    return [a for a in at if not re.match(r"\w", text[a - 1:a] if a else "")
            and not re.match(r"[\w]|[./]\d", text[a + len(words):a + len(words) + 2])]


def unaccounted(registry=None, root=ROOT):
    """Every number of the pages that no entry of its page accounts for, and every entry that no
    longer stands in its page, as "page: ..." lines."""
    registry = NUMBERS if registry is None else registry
    names = {name for entries in registry.values() for e in entries if isinstance(e, Figure)
             for name in _files(e)}
    sources = {name: _load(name, root) for name in names}
    pages = [str(p.relative_to(ROOT)) for p in DOCS] + [MAKE_HELP]
    found = [f"{page}: no entries in NUMBERS" for page in pages
             if page not in registry and page not in PENDING]
    for page in pages:
        raw = _text(page, root)
        exempt = _pending(page, raw)
        text = prose(raw.replace(exempt, "") if exempt != raw else "")
        covered = []
        for entry in registry.get(page, []):
            words, spans = _said(entry, sources)
            places = _where(words, text)
            if not places and exempt != raw:
                found.append(f"{page}: no longer stands: {words!r}")
            covered += [(at + a, at + b) for at in places for a, b in spans]
        for a, b in numbers(text):
            if not any(x <= a and b <= y for x, y in covered):
                found.append(f"{page}: {text[a:b]!r} in {text[max(0, a - 50):b + 20]!r}")
    return found


def test_every_number_in_the_docs_is_read_from_its_source_or_declared():
    found = unaccounted()
    assert not found, "a number with no entry in NUMBERS (CONTRIBUTING.md):\n" + "\n".join(found)


PLANTED = {  # each form a figure takes, and the numbers the scan must find in it
    "twice as fast": ["twice"], "a tenth": ["tenth"], "an hour and a half": ["half"],
    "2\u00d7 and 2x": ["2", "2"], "+3.1 points": ["+3.1"], "p = 0.03": ["0.03"],
    "from 0.17 to 0.46": ["0.17", "0.46"], "41.2 / 74.9": ["41.2", "74.9"],
    "14,900 /s": ["14,900"], "12k tokens/s": ["12"], "3.2e5": ["3.2e5"], "3 / 4, 1/8": [
        "3", "4", "1", "8"], "4-6 minutes": ["4", "6"], "seven of ten": ["seven", "ten"]}


def _copy_for_the_scan(tmp_path):  # the pages, the Makefile and the sources NUMBERS reads
    names = {str(p.relative_to(ROOT)) for p in DOCS} | {"Makefile"} | {
        n.removeprefix("text:") for entries in NUMBERS.values() for e in entries
        if isinstance(e, Figure) for n in _files(e) if n.endswith((".json", ".toml", ".md"))
        or n.startswith("text:")}
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_a_planted_or_changed_number_fails_the_scan(tmp_path):
    root = _copy_for_the_scan(tmp_path)
    assert unaccounted(root=root) == []
    planted = ". ".join(f"It ran {form}" for form in PLANTED) + "."
    (root / "README.md").write_text((root / "README.md").read_text() + "\n" + planted + "\n")
    page = root / "docs" / "eval.md"  # in a page's prose, and in a table's cells
    page.write_text(page.read_text().replace("## Benchmarks", planted + "\n\n## Benchmarks"))
    table = root / "docs" / "verification.md"
    row = "| planted | " + " | ".join(PLANTED) + " |"
    table.write_text(table.read_text().replace("| updates at", row + "\n| updates at"))
    found = unaccounted(root=root)
    for page in ("README.md", "docs/eval.md", "docs/verification.md"):
        hits = [re.match(r".*?: '(.*?)' in", f)[1] for f in found if f.startswith(page + ": ")]
        assert hits == [n for numbers in PLANTED.values() for n in numbers], (page, hits)
    assert len(found) == 3 * sum(map(len, PLANTED.values()))
    root = _copy_for_the_scan(tmp_path / "changed")  # a figure changed in its page, or its source
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("from 8.8% to 95.7%", "from 8.8% to 95.8%"))
    bench = json.loads((root / BENCH).read_text())
    bench["rows"][9]["ratio"] *= 2
    (root / BENCH).write_text(json.dumps(bench))
    found = unaccounted(root=root)
    assert [f.split(": ")[0] for f in found if "no longer stands" in f] == [
        "README.md", "docs/verification.md"], found
    assert "README.md: '95.8' in" in " ".join(found)
    makefile = root / "Makefile"  # a help string's figure
    makefile.write_text(makefile.read_text().replace("before and after: minutes", "before and "
                                                     "after: about 2 min", 1))
    assert any(f.startswith("make help: '2' in") for f in unaccounted(root=root))
    gpu_check = root / "docs" / "gpu-check.md"  # and a page PENDING is scanned once it changes
    gpu_check.write_text(gpu_check.read_text() + "\nIt ran 3 s.\n")
    assert any(f.startswith("docs/gpu-check.md: '3' in") for f in unaccounted(root=root))


def test_a_results_file_records_its_command_without_a_scratch_path():
    tracked = subprocess.run(["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    commands = {name: json.loads((ROOT / name).read_text()).get("command") for name in tracked}
    absolute = [f"{name}: {c}" for name, c in commands.items()
                if isinstance(c, str) and re.search(r"(?:^|[\s=])/", c)]
    assert not absolute, "bench/run.py records --out relative:\n" + "\n".join(absolute)


# ---------------------------------------------------------------- the results pages
# Every page of experiments/results/ is written by its experiment's code from its results file
# (peers.md, with a reading by hand above its tables, aside): regenerated here from the committed
# JSON, it must equal the committed page byte for byte.
RESULTS = ROOT / "experiments" / "results"
NOT_REGENERATED = {"peers.md"}  # its reading by hand is kept above what peers.py writes


def _results_pages(results=RESULTS):
    """{page name: the page as its writer makes it from the JSON in `results`}."""
    table1, two, categorical, see, report = (_load(f"experiments/{name}.py") for name in (
        "table1", "two_strategy", "categorical", "see_it_happen", "see_it_happen_report"))

    def saved(name):
        return json.loads((results / f"{name}.json").read_text())

    pages = {"table1_tiny.md": table1.markdown(saved("table1_tiny")),
             "two_strategy.md": two.page(saved("two_strategy"))}
    for path in sorted(results.glob("categorical_*.json")):
        pages[f"{path.stem}.md"] = categorical.page(saved(path.stem))
    names = ["see_it_happen_confirmation", "see_it_happen_exploration"]
    runs = [saved(name) for name in names]
    for name, run in zip(names, runs):
        args = SimpleNamespace(**{**vars(see.parse_args([])), **run["config"]})
        pages[f"{name}.md"] = report.markdown(run, args)
    pages["see_it_happen.md"] = report.page_markdown(*runs, see.PROTOCOL, names)
    return pages


def _results_pages_unlike_their_json(results=RESULTS):
    pages = _results_pages(results)
    committed = {p.name for p in results.glob("*.md")} - NOT_REGENERATED
    return sorted(committed ^ set(pages)) + sorted(
        name for name in committed & set(pages) if (results / name).read_text() != pages[name])


def test_every_results_page_is_its_writers_from_its_json(tmp_path):
    assert _results_pages_unlike_their_json() == []
    results = tmp_path / "results"  # and it fails on a figure changed in a JSON or a page
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.png", "peers.*"))
    tiny = json.loads((results / "table1_tiny.json").read_text())
    tiny["runs"]["f-dapo"]["mean"]["math_avg"]["1"] += 0.001
    (results / "table1_tiny.json").write_text(json.dumps(tiny))
    page = results / "two_strategy.md"
    page.write_text(page.read_text().replace("| 1 | 0.05 |", "| 1 | 0.06 |", 1))
    (results / "new.md").write_text("a page no writer makes\n")
    assert _results_pages_unlike_their_json(results) == ["new.md", "table1_tiny.md",
                                                         "two_strategy.md"]


