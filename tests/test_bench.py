"""Tests of bench/'s scripts where they touch a run's records: bench/mutation.py leaves the
committed record of the full run alone when asked for a few planted bugs, and bench/plots.py
titles a run's curves with the run's own algorithm and gamma."""
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository


def _bench(name):  # bench/NAME.py as a module
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- bench/mutation.py
def test_mutation_only_writes_its_table_beside_not_over_the_committed_record(tmp_path, monkeypatch,
                                                                             capsys):
    mutation = _bench("mutation")
    monkeypatch.setattr(mutation, "ROOT", tmp_path)  # the repository's files stay as they are
    bugs = [{"name": name, "file": "fgrpo.py", "why": ""} for name in ("gamma_a", "other_b")]
    monkeypatch.setattr(mutation, "load_mutants", lambda: bugs)
    monkeypatch.setattr(mutation, "check", lambda mutant, timeout, threads: {
        "status": "caught" if mutant else "passes", "detail": "", "seconds": 0.0})
    committed = tmp_path / "bench" / "mutation_results.json"
    for argv, table, names in ((["--only", "gamma"], "runs/mutation_only.json", ["gamma_a"]),
                               ([], "bench/mutation_results.json", ["gamma_a", "other_b"]),
                               (["--only", "other"], "runs/mutation_only.json", ["other_b"])):
        monkeypatch.setattr(sys, "argv", ["mutation.py", *argv])
        assert mutation.main() == 0
        written = json.loads((tmp_path / table).read_text())["mutants"]
        assert [r["name"] for r in written] == names
    # the full run's record, untouched by the --only run after it
    assert [r["name"] for r in json.loads(committed.read_text())["mutants"]] == [
        "gamma_a", "other_b"]
    assert "the table: " in capsys.readouterr().out


# ---------------------------------------------------------------- bench/plots.py
def test_curves_are_titled_with_the_runs_algorithm_and_gamma(tmp_path, monkeypatch):
    drawn = importlib.util.find_spec("matplotlib") is not None  # else the title alone
    if not drawn:
        monkeypatch.setitem(sys.modules, "matplotlib", type(sys)("matplotlib"))
        monkeypatch.setitem(sys.modules, "matplotlib.pyplot", type(sys)("matplotlib.pyplot"))
    plots = _bench("plots")
    run = tmp_path / "f-dapo"
    run.mkdir()
    rows = [{"step": s, "reward": 0.1 * s, "active_frac": 0.5, "focal_mean": 0.9,
             "clip_frac": 0.0, "resp_len": 5} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plots.run_title(run / "metrics.jsonl") == "f-dapo (no run.json)"
    settings = {"algo": "dapo", "gamma": 1.0, "lr": 3e-4}
    (run / "run.json").write_text(json.dumps({"settings": settings, "world": 1}))
    assert plots.run_title(run / "metrics.jsonl") == "f-dapo: dapo, gamma 1"
    if drawn:
        figure = plots.curves(run / "metrics.jsonl", tmp_path / "curves.png")
        assert figure.get_suptitle() == "f-dapo: dapo, gamma 1"
        assert (tmp_path / "curves.png").stat().st_size > 0
