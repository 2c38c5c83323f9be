"""Tests of experiments/table1.py (make table1): the plan, the table from hand-made folders, and
the tiny campaign killed and resumed."""
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository


def _records(path):  # a JSONL file's rows
    return [json.loads(line) for line in path.read_text().splitlines()]


def _metrics(out):  # a run's metrics.jsonl without the timings (t_*), which differ run to run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith("t_")} for m in rows]


# ---------------------------------------------------------------- experiments/table1.py; multi-node
_table1_spec = importlib.util.spec_from_file_location("table1", ROOT / "experiments" / "table1.py")
TABLE1 = importlib.util.module_from_spec(_table1_spec)
_table1_spec.loader.exec_module(TABLE1)


def test_table1_commands_estimate_and_bad_flags(tmp_path, capsys):
    argv = ["--only", "dapo,f-dapo", "--train-flags", "--epochs 1 --prompts 128",
            "--eval-flags", "--n 64"]
    args = TABLE1.parse_args(argv)
    stages = {s.name: s for s in TABLE1.run_stages(args, 0)}
    train = stages["dapo/seed0/train"]
    # the user's flags first: argparse keeps a flag's last value, so the base run's --gamma 0 holds
    assert train.cmd[1:] == ["fgrpo.py", "--epochs", "1", "--prompts", "128",
                             "--model", "Qwen/Qwen2.5-7B", "--algo", "dapo", "--gamma", "0",
                             "--seed", "0", "--out", str(Path("runs/table1/dapo/seed0/train"))]
    assert "--gamma" not in stages["f-dapo/seed0/train"].cmd  # fgrpo.py's default: the paper's
    assert "--m" not in stages["compare/dapo/seed0"].cmd  # the default test: no subsamples
    states = {name: TABLE1.status(s, args) for name, s in stages.items()}
    assert {n for n, s in states.items() if s != "skip"} == \
        {"dapo/seed0/train", "dapo/seed0/eval", "f-dapo/seed0/train", "f-dapo/seed0/eval",
         "compare/dapo/seed0"}
    # docs/paper-run.md: 4-6 min a step on 8 GPUs at 256 x 8; 1 epoch of 39,202 problems at 128
    # prompts is 306 steps at half that batch; a checkpoint is 12 bytes a parameter (30 + 61 GB)
    cost = TABLE1.estimate(train, args)
    assert cost.gpu_hours == pytest.approx((306 * 8 * 4 / 60 / 2, 306 * 8 * 6 / 60 / 2))
    assert cost.disk_gb == pytest.approx(7.6 * 12)
    # the six math benchmarks' 1,547 problems x 64 samples x 1,000-3,000 tokens at 4,300-2,800 a s
    cost = TABLE1.estimate(stages["dapo/seed0/eval"], args)
    samples = (500 + 30 + 30 + 40 + 272 + 675) * 64
    assert cost.gpu_hours == pytest.approx((samples * 1000 / 4300 / 3600,
                                            samples * 3000 / 2800 / 3600))
    hours = [TABLE1.estimate(s, args) for n, s in stages.items() if states[n] != "skip"]
    hours = [sum(c.gpu_hours[i] for c in hours if c) for i in (0, 1)]
    TABLE1.print_plan(list(stages.values()), args)  # GPU-hours over one node's 8 GPUs, in days
    days = re.search(r"wall-clock: ~([\d,]+)-([\d,]+) days on one 8-GPU node",
                     capsys.readouterr().out).groups()
    assert days == tuple(f"{h / 8 / 24:,.0f}" for h in hours)
    tiny = TABLE1.parse_args(["--model", "tiny", "--only", "dapo", "--train-flags", "--steps 3",
                              "--work", str(tmp_path)])
    tiny.tiny_settings = fgrpo.TINY
    stages = TABLE1.run_stages(tiny, 0)
    assert stages[0].name == "tiny/seed0" and TABLE1.status(stages[0], tiny) == "run"  # for all
    cmd = next(s.cmd for s in stages if s.name == "dapo/seed0/train")
    # fgrpo.TINY's settings, the campaign's 40 steps, then the user's 3 (argparse keeps the last)
    assert cmd[cmd.index("--lr") + 1] == str(fgrpo.TINY["lr"]) and "--rollout" in cmd
    assert [cmd[i + 1] for i, w in enumerate(cmd) if w == "--steps"] == ["40", "3"]
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "tiny" / "seed0" / "model")
    for argv, message in [(["--only", "dapo,nope"], "--only: unknown run 'nope'"),
                          (["--train-flags", "--out x"], "--train-flags: --out is set by"),
                          (["--eval-flags=--seed=3"], "--eval-flags: --seed is set by table1.py"),
                          (["--seeds", "0,a"], "--seeds takes comma-separated integers")]:
        with pytest.raises(SystemExit):
            TABLE1.parse_args(argv)
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_table1_from_hand_made_folders_two_seeds(tmp_path, capsys):
    # results.json and compare.json written by hand: 2 seeds, n = 4 (pass@1, 2, 4), --compare's
    # m = 2, so k = 2 stands in for 256; distinct p at k = 1 and 2; the base run lacks a seed.
    def results(a, b):
        curves = {"1": a, "2": b, "4": 1.0}
        bench = {"domain": "math", "samples": [4, 4], "pass@k": curves}
        return {"model": "m", "benchmarks": {"aime24": bench}, "math_avg": curves}

    evals = {("base", 0): (0.1, 0.2), ("dapo", 0): (0.3, 0.5), ("dapo", 1): (0.4, 0.6),
             ("f-dapo", 0): (0.4, 0.8), ("f-dapo", 1): (0.5, 0.7), ("grpo", 1): (0.2, 0.3)}
    for (run, seed), (a, b) in evals.items():
        folder = tmp_path / run / f"seed{seed}" / "eval"
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps(results(a, b)))
    for seed, p in ((0, [0.01, 0.02]), (1, [0.03, 0.04])):
        folder = tmp_path / "compare" / "dapo" / f"seed{seed}"
        folder.mkdir(parents=True)
        tests = {x: {"k": [1, 2], "delta": [0.0, 0.0], "p": p} for x in ("aime24", "math_avg")}
        (folder / "compare.json").write_text(json.dumps({"results": tests}))
    table = TABLE1.main(["--table", "--work", str(tmp_path)])
    assert table["k"] == [1, 2] and table["seeds"] == [0, 1] and list(table["pairs"]) == ["dapo"]
    assert list(table["runs"]) == ["base", "grpo", "dapo", "f-dapo"]  # Table 1's order
    assert table["runs"]["dapo"]["mean"]["math_avg"] == pytest.approx({"1": 0.35, "2": 0.55})
    pair = table["pairs"]["dapo"]["columns"]["math_avg"]
    assert pair["delta"]["1"] == pytest.approx([0.1, 0.1])
    assert pair["delta"]["2"] == pytest.approx([0.3, 0.1])
    assert pair["p"] == {"1": [0.01, 0.03], "2": [0.02, 0.04]}
    # 95% t-interval over 2 seeds: mean 0.2, sd 0.1 * sqrt(2), t(0.975, 1 df) = 12.706
    assert pair["mean"]["2"] == pytest.approx([0.2, 12.706 * 0.1 * math.sqrt(2) / math.sqrt(2)])
    assert pair["mean"]["1"] == pytest.approx([0.1, 0.0], abs=1e-12)
    text = (tmp_path / "table1.md").read_text()
    row = "| F-DAPO − DAPO | aime24 | +10.0 ± 0.0 | 0.010, 0.030 | +20.0 ± 127.1 | 0.020, 0.040 |"
    assert row in text
    assert "| F-DAPO | 45.0 / 75.0 | 45.0 / 75.0 | 40.5 / 72.5 |" in text
    assert "| base model | 10.0 / 20.0 | 10.0 / 20.0 | - |" in text
    assert "pass@2 stands in for the paper's pass@256" in text
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "table1_passk_dapo.png").stat().st_size > 10_000
    capsys.readouterr()


def test_table1_saves_the_tiny_base_whole(tmp_path, monkeypatch):
    build = fgrpo.build_tiny
    monkeypatch.setattr(fgrpo, "build_tiny", lambda seed: build(seed, warm_steps=0))  # no warm-up
    folder = tmp_path / "tiny" / "seed3"
    folder.parent.mkdir()
    TABLE1.save_tiny_base(TABLE1.Stage("tiny/seed3", "tiny", "tiny", 3, [], folder))
    model, tok, train_set, held_out = build(3, warm_steps=0)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["seed3"]  # renamed, no .tmp left
    assert _records(folder / "train.jsonl") == train_set and len(train_set) == 2000
    assert _records(folder / "held_out.jsonl") == held_out and len(held_out) == 64
    from transformers import AutoModelForCausalLM, AutoTokenizer
    saved = AutoModelForCausalLM.from_pretrained(folder / "model").state_dict()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert AutoTokenizer.from_pretrained(folder / "model")("max(1,2)=").input_ids == \
        tok("max(1,2)=").input_ids


def _stopped_when(cmd, env, ready, log, kill):
    """Start cmd (a session of its own), call kill(proc) once ready() holds: (exit code, output)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        while not ready():
            assert proc.poll() is None, Path(log).read_text()[-3000:]
            time.sleep(0.05)
        kill(proc)
        proc.wait(timeout=600)
    return proc.returncode, Path(log).read_text()


@pytest.mark.slow
def test_table1_tiny_campaign_resumes_after_kills_and_its_table_is_eval_pys(tiny_saved, tmp_path):
    # The tiny pipeline, smaller: the base model and DAPO / F-DAPO, 6 steps, n = 16. Killed with
    # SIGKILL (script and running stage) in DAPO's training, stopped by a SIGTERM to the script in
    # DAPO's evaluation, then run to the end: nothing finished is redone, and the table holds
    # eval.py's figures.
    work = tmp_path / "work"
    cmd = [sys.executable, str(ROOT / "experiments" / "table1.py"), "--model", "tiny",
           "--work", str(work), "--only", "base,dapo,f-dapo",
           "--train-flags", "--steps 6 --save-every 2 --prompts 8 --mini-batch 4",
           "--eval-flags", "--n 16 --chunk 8", "--compare-flags", "--iters 2000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a thread a process: 2 shared cores, no spinning
    dapo = work / "dapo" / "seed0"
    # the campaign's first stage, done as it does it (fgrpo.build_tiny(0) saved, as the test above
    # checks), from the folder the other tests share
    shutil.copytree(tiny_saved / "model", work / "tiny" / "seed0" / "model")
    shutil.copy(tiny_saved / "train.jsonl", work / "tiny" / "seed0" / "train.jsonl")
    shutil.copy(tiny_saved / "held_out.jsonl", work / "tiny" / "seed0" / "held_out.jsonl")
    _stopped_when(cmd, env, lambda: (dapo / "train" / "latest").exists(), tmp_path / "1.log",
                  lambda proc: os.killpg(proc.pid, signal.SIGKILL))
    assert (dapo / "train" / "latest").read_text() != "step_000006"  # killed in training
    base_eval = work / "base" / "seed0" / "eval" / "results.json"
    untouched = [base_eval.stat().st_mtime_ns, (work / "tiny" / "seed0").stat().st_mtime_ns]
    # SIGTERM to the script alone: it passes it on to eval.py, waits for it, and stops
    code, second = _stopped_when(cmd, env, lambda: (dapo / "eval" / "held_out.jsonl").exists(),
                                 tmp_path / "2.log", lambda proc: proc.send_signal(signal.SIGTERM))
    assert code == 1 and "error: dapo/seed0/eval stopped (exit code -15)" in second, second[-2000:]
    assert "[done] tiny/seed0\n" in second and "[done] base/seed0/eval\n" in second
    assert re.search(r"\[resume\] dapo/seed0/train: python .*fgrpo\.py .* --resume\n", second)
    assert not (dapo / "eval" / "results.json").exists()  # killed in the evaluation
    third = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "[done] dapo/seed0/train\n" in third.stdout
    assert "[resume] dapo/seed0/eval" in third.stdout
    assert [base_eval.stat().st_mtime_ns, (work / "tiny" / "seed0").stat().st_mtime_ns] == untouched
    assert [m["step"] for m in _metrics(dapo / "train")] == [1, 2, 3, 4, 5, 6]
    _check_table1(work)
    table = [(work / name).read_text() for name in ("table1.md", "table1.json")]
    (work / "table1.md").unlink()  # and --table alone writes the same files again
    rebuilt = subprocess.run([*cmd[:2], "--table", "--work", str(work)], capture_output=True,
                             text=True, timeout=600)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert [(work / name).read_text() for name in ("table1.md", "table1.json")] == table


def _check_table1(work):
    """table1.json and .md against eval.py's results.json, the samples' scores and compare.json."""
    table = json.loads((work / "table1.json").read_text())
    text = (work / "table1.md").read_text()
    assert table["k"] == [1, 16]  # n = 16: pass@16 stands in for pass@256
    assert "pass@16 stands in for the paper's pass@256" in text
    assert table["columns"] == ["held_out", "math_avg"]
    figures = {}
    for run in ("base", "dapo", "f-dapo"):
        folder = work / run / "seed0" / "eval"
        res = json.loads((folder / "results.json").read_text())
        records = _records(folder / "held_out.jsonl")
        assert [r["idx"] for r in records] == list(range(64))  # each problem once, after a resume
        c = [int(sum(r["scores"])) for r in records]
        row = table["runs"][run]["seeds"]["0"]
        for k in ("1", "16"):
            assert row["held_out"][k] == res["benchmarks"]["held_out"]["pass@k"][k]
            assert row["math_avg"][k] == res["math_avg"][k]
            assert table["runs"][run]["mean"]["math_avg"][k] == res["math_avg"][k]  # one seed
            by_hand = sum(1 - math.comb(16 - ci, int(k)) / math.comb(16, int(k)) for ci in c) / 64
            assert row["held_out"][k] == pytest.approx(by_hand, abs=1e-12)
        figures[run] = row["math_avg"]
        cell = f"{100 * row['held_out']['1']:.1f} / {100 * row['held_out']['16']:.1f}"
        assert f"| {TABLE1.RUNS[run].label} | {cell} | {cell} |" in text
    assert "| DAPO | " in text and "| 39.4 / 69.3 |" in text  # the paper's, beside ours
    test = json.loads((work / "compare" / "dapo" / "seed0" / "compare.json").read_text())["results"]
    pair = table["pairs"]["dapo"]["columns"]["math_avg"]
    assert test["math_avg"]["k"][0] == 1 and test["math_avg"]["k"][-1] == 16
    for i, k in ((0, "1"), (-1, "16")):
        assert pair["delta"][k] == [figures["f-dapo"][k] - figures["dapo"][k]]
        assert pair["delta"][k][0] == pytest.approx(test["math_avg"]["delta"][i], abs=1e-12)
        assert pair["p"][k] == [test["math_avg"]["p"][i]]
    p = test["math_avg"]["p"]
    delta = pair["delta"]
    cells = [f"{100 * delta['1'][0]:+.1f}", f"{p[0]:.3f}", f"{100 * delta['16'][0]:+.1f}",
             f"{p[-1]:.3f}"]
    assert "| math avg | " + " | ".join(cells) + " |" in text


