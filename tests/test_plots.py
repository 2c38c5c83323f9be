"""Tests of experiments/plots.py: a run's curves are titled with its own algorithm and gamma."""
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository


# ---------------------------------------------------------------- experiments/plots.py
def test_curves_are_titled_with_the_runs_algorithm_and_gamma(tmp_path, monkeypatch):
    drawn = importlib.util.find_spec("matplotlib") is not None  # else the title alone
    if not drawn:
        monkeypatch.setitem(sys.modules, "matplotlib", type(sys)("matplotlib"))
        monkeypatch.setitem(sys.modules, "matplotlib.pyplot", type(sys)("matplotlib.pyplot"))
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    plots = importlib.import_module("plots")
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
