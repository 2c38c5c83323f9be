"""Tests of checks/: every planted bug of checks/mutants.py still finds its line, and
checks/mutation.py leaves the committed record of the full run alone when asked for a few."""
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository


# ---------------------------------------------------------------- checks/mutants.py
def test_every_planted_bug_finds_its_text_once_and_its_file_still_parses(tmp_path, monkeypatch):
    # the full make mutation (45 minutes) shows each bug caught; this shows, in a second, that
    # each can still be planted: a change to a line a bug names fails here, not an hour later
    monkeypatch.syspath_prepend(str(ROOT / "checks"))  # as `python checks/mutation.py` runs
    mutation = importlib.import_module("mutation")
    bugs = mutation.load_mutants()
    stale = [f"{m['name']}: {mutation.planted(ROOT, m)[1]}" for m in bugs
             if mutation.planted(ROOT, m)[1]]
    assert not stale, "update checks/mutants.py (CONTRIBUTING.md):\n" + "\n".join(stale)
    names = [m["name"] for m in bugs]
    assert len(set(names)) == len(names) > 50
    # and it finds both kinds of stale bug: text gone or doubled, and an edit that does not parse
    (tmp_path / "f.py").write_text("x = 1\ny = 2\ny = 2\n")
    def bug(find, replace):
        return {"file": "f.py", "find": find, "replace": replace}
    assert mutation.planted(tmp_path, bug("x = 1", "x = 2")) == ("x = 2\ny = 2\ny = 2\n", None)
    assert "occurs 0 times in f.py" in mutation.planted(tmp_path, bug("z = 1", "z = 2"))[1]
    assert "occurs 2 times in f.py" in mutation.planted(tmp_path, bug("y = 2", "y = 3"))[1]
    assert "no longer parses (line 1)" in mutation.planted(tmp_path, bug("x = 1", "x = (1"))[1]
    # a planted copy fails this test by design: make mutation leaves it out, by its real name
    file, name = mutation.FINDS_ITS_TEXT.split("::")
    assert name == sys._getframe().f_code.co_name and (ROOT / file).resolve() == Path(__file__)


# ---------------------------------------------------------------- checks/mutation.py
def test_mutation_only_writes_its_table_beside_not_over_the_committed_record(tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.syspath_prepend(str(ROOT / "checks"))  # as `python checks/mutation.py` runs
    mutation = importlib.import_module("mutation")
    monkeypatch.setattr(mutation, "ROOT", tmp_path)  # the repository's files stay as they are
    bugs = [{"name": name, "file": "fgrpo.py", "why": ""} for name in ("gamma_a", "other_b")]
    monkeypatch.setattr(mutation, "load_mutants", lambda: bugs)
    monkeypatch.setattr(mutation, "check", lambda mutant, timeout, threads: {
        "status": "caught" if mutant else "passes", "detail": "", "seconds": 0.0})
    committed = tmp_path / "checks" / "mutation_results.json"
    for argv, table, names in ((["--only", "gamma"], "runs/mutation_only.json", ["gamma_a"]),
                               ([], "checks/mutation_results.json", ["gamma_a", "other_b"]),
                               (["--only", "other"], "runs/mutation_only.json", ["other_b"])):
        monkeypatch.setattr(sys, "argv", ["mutation.py", *argv])
        assert mutation.main() == 0
        written = json.loads((tmp_path / table).read_text())["mutants"]
        assert [r["name"] for r in written] == names
    # the full run's record, untouched by the --only run after it
    assert [r["name"] for r in json.loads(committed.read_text())["mutants"]] == [
        "gamma_a", "other_b"]
    assert "the table: " in capsys.readouterr().out

