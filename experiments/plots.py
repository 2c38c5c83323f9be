"""The README's two pictures, from a run's files (needs matplotlib).

    python experiments/plots.py curves runs/demo/metrics.jsonl docs/demo_metrics.png
    python experiments/plots.py passk runs/demo/eval_base runs/demo/eval_after docs/tiny_passk.png

curves: reward, active_frac, focal_mean, clip_frac and resp_len of fgrpo.py's metrics.jsonl over
steps, titled with the run's algorithm and gamma from the run.json beside it. passk: the pass@k
curve of each eval.py folder's results.json (its math average).
"""
import argparse
import json
from pathlib import Path

try:
    import matplotlib.pyplot as plt  # without a display it draws with Agg
except ImportError:
    raise SystemExit("error: experiments/plots.py needs matplotlib: pip install matplotlib")

KEYS = ("reward", "active_frac", "focal_mean", "clip_frac", "resp_len")


def run_title(metrics):
    """Which run made metrics.jsonl: its folder, algorithm and gamma (its run.json)."""
    run = Path(metrics).parent / "run.json"
    if not run.exists():  # a run of older code
        return f"{Path(metrics).parent.name} (no run.json)"
    settings = json.loads(run.read_text())["settings"]
    return f"{Path(metrics).parent.name}: {settings['algo']}, gamma {settings['gamma']:g}"


def curves(metrics, out):
    rows = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
    fig, axes = plt.subplots(1, len(KEYS), figsize=(3 * len(KEYS), 2.9), layout="tight")
    for ax, key in zip(axes, KEYS):
        ax.plot([r["step"] for r in rows], [r[key] for r in rows])
        ax.set(title=key, xlabel="step")
    fig.suptitle(run_title(metrics))
    fig.savefig(out, dpi=100)
    return fig


def passk(folders, out):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for folder in folders:
        curve = json.loads((Path(folder) / "results.json").read_text())["math_avg"]
        ax.plot(list(map(int, curve)), [100 * v for v in curve.values()], "o-",
                label=Path(folder).name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="k", ylabel="pass@k (%)")
    ax.legend()
    fig.savefig(out, dpi=120, bbox_inches="tight")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=["curves", "passk"], help="which picture")
    p.add_argument("inputs", nargs="+", help="metrics.jsonl (curves) or eval.py folders (passk)")
    p.add_argument("out", help="the PNG file to write")
    a = p.parse_args()
    if a.kind == "curves":
        curves(a.inputs[0], a.out)
    else:
        passk(a.inputs, a.out)


if __name__ == "__main__":
    main()
