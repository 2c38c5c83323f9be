"""pass@k evaluation of any checkpoint on the F-GRPO paper's benchmarks, resumable, and a paired
test of two checkpoints (Plyusov et al., arXiv 2602.06717, App. L.4, P, Q).

    python eval.py --model Qwen/Qwen2.5-7B --out eval/base      # the paper's: the six, n = 1024
    python eval.py --model PATH --data problems.jsonl --n 16 --out eval/mine  # problem, answer
    python eval.py --out eval/a --rescore                       # re-verify the saved samples
    python eval.py --compare eval/base eval/a                   # does B beat A? delta and p
    torchrun --nproc_per_node 8 eval.py --model PATH --out eval/a  # data-parallel, as on 8 GPUs

Samples come from vLLM (an engine a GPU), else fgrpo.rollout; after a kill, the same command again.
"""
import argparse
import csv
import datetime
import functools
import glob
import hashlib
import importlib.util
import json
import os
import random
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import fgrpo

class Benchmark(NamedTuple):
    hub_id: str  # a Hub dataset; sources checked Nov 2026 (docs/eval.md)
    file: str
    problem_field: str
    answer_field: str  # GPQA: the correct option's field; its others "Incorrect Answer 1" to 3
    domain: str  # "math" (Table 1's average) or "ood"

PARQUET = "test-00000-of-00001.parquet"  # aime24 and amc23 exist only as parquet
BENCHMARKS = {
    "math500": Benchmark("HuggingFaceH4/MATH-500", "test.jsonl", "problem", "answer", "math"),
    "aime24": Benchmark("math-ai/aime24", PARQUET, "problem", "solution", "math"),  # \boxed{N}
    "aime25": Benchmark("math-ai/aime25", "test.jsonl", "problem", "answer", "math"),
    "amc23": Benchmark("math-ai/amc23", PARQUET, "question", "answer", "math"),
    "minerva": Benchmark("math-ai/minervamath", "test.jsonl", "question", "answer", "math"),
    "olympiadbench": Benchmark("math-ai/olympiadbench", "test.jsonl", "question", "final_answer",
                               "math"),  # a list of answer parts
    "gpqa_diamond": Benchmark("Idavidrein/gpqa", "gpqa_diamond.csv", "Question", "Correct Answer",
                              "ood"),  # gated: accept its terms on the Hub and log in
}

def build_parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    math = ",".join(x for x, b in BENCHMARKS.items() if b.domain == "math")
    a("--model", help="HF folder or Hub id to sample from (needed while problems lack samples)")
    a("--benchmarks", default=math, help=f"comma-separated, of: {', '.join(BENCHMARKS)}")
    a("--data", help="a local JSON/JSONL file with problem and answer fields, not --benchmarks")
    a("--n", "--samples", type=int, default=1024,  # torchrun's own parser takes --n: --nnodes
      help="samples per problem (1024, App. L.4); after torchrun ... eval.py: --samples")
    a("--temperature", type=float, default=1.0, help="sampling temperature (1.0, App. L.4)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling, top-k off (1.0, App. L.4)")
    a("--max-new-tokens", type=int, default=8192, help="max response tokens (8192, App. L.4)")
    a("--seed", type=int, default=0, help="sampling seed, also of --compare's redraws (0)")
    a("--out", help="result folder: <benchmark>.jsonl each, results.json")
    a("--rollout", choices=["vllm", "hf"], help="vLLM or transformers; default: vllm if it imports")
    a("--gen-batch", type=int, default=64, help="sequences per generate() call, --rollout hf (64)")
    a("--chunk", type=int, default=32, help="problems sampled and verified between writes (32)")
    a("--rescore", action="store_true", help="verify the saved completions again; sample nothing")
    a("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="does B beat A? --out: compare.json")
    a("--test", choices=["permutation", "subsampling"], default="permutation",
      help="--compare's p: an exact permutation test; or App. Q's m-out-of-n subsampling")
    a("--m", type=int, help="--test subsampling only: samples per subsample (n/4, App. Q)")
    a("--iters", type=int, default=50_000, help="--compare: redraws behind each p (50,000)")
    a("--alpha", type=float, default=0.05, help="--compare: two-sided level, starred below (0.05)")
    return p

# ---------------------------------------------------------------- the math: pass@k, the paired test
def pass_at_k(n, c, k):  # unbiased pass@k of each problem, n samples, c right (arrays): App. P
    n = np.asarray(n)
    if k > n.min():
        raise ValueError(f"pass@{k} needs at least {k} samples per problem; one has {n.min()}")
    return np.vectorize(lambda x, y: pass_at_k_table(int(x), (k,))[int(y), 0], otypes=[float])(n, c)

def powers_of_two(n):  # the k of a pass@k curve from n samples: 1, 2, 4, ... below n, then n
    return [2 ** i for i in range(int(n).bit_length()) if 2 ** i < n] + [int(n)]

@functools.lru_cache(maxsize=None)
def pass_at_k_table(n, ks):  # (n + 1, K): c = 0..n of n samples right, each k of the tuple ks
    # App. P: pass@k = 1 - prod_{i=n-c+1..n} (1 - k/i), 1 if n - c < k: a product cumulated over c
    factors = np.maximum(1 - np.array(ks) / np.arange(n, 0, -1)[:, None], 0)  # i = n, n-1, .., 1
    return np.vstack([np.zeros(len(ks)), 1 - np.cumprod(factors, 0)])

def redrawn_deltas(a, b, ks, iters, rng, m=None, chunk=500):
    """a, b: (n, correct (P,)) of A, B -> (iters, K) deltas of samples pooled and dealt again, n_A
    to A (m None), or of m drawn from each model's n apart (App. Q)."""
    tables = [pass_at_k_table(m or n, tuple(ks)) for n, _ in (a, b)]
    pooled = a[1] + b[1]
    out = []
    for start in range(0, iters, chunk):
        size = (min(chunk, iters - start), len(pooled))
        if m:  # a model's right samples among m of its n: hypergeometric
            ca = rng.hypergeometric(a[1], a[0] - a[1], m, size=size)
            cb = rng.hypergeometric(b[1], b[0] - b[1], m, size=size)
        else:  # A's right samples when n_A of the pooled are dealt to A: hypergeometric
            ca = rng.hypergeometric(pooled, a[0] + b[0] - pooled, a[0], size=size)
            cb = pooled - ca
        out.append(tables[1][cb].mean(1) - tables[0][ca].mean(1))
    return np.concatenate(out)

def two_sided_p(delta, draws, test):  # (K,), add-one smoothed: never 0; 1e-9 absorbs rounding
    if test == "subsampling":  # App. Q: twice the smaller share of delta* on one side of 0
        smaller_side = np.minimum((draws <= 0).sum(0), (draws >= 0).sum(0))
        return np.minimum(1.0, 2 * (smaller_side + 1) / (len(draws) + 1))
    return ((np.abs(draws) >= np.abs(delta) - 1e-9).sum(0) + 1) / (len(draws) + 1)

# ---------------------------------------------------------------- data: --data, or the Hub
def load_benchmarks(args):
    """{name: (domain, [{"problem", "answer"}])} of --data or --benchmarks."""
    if args.data:  # fgrpo.load_problems names the file and line of a bad record; no answer: out
        problems = [p for p in fgrpo.load_problems(args.data) if p["answer"].strip()]
        return {Path(args.data).stem: ("math", problems)}
    return {name: (BENCHMARKS[name].domain,
                   [as_problem(i, r, BENCHMARKS[name]) for i, r in enumerate(hub_rows(name))])
            for name in args.benchmarks.split(",")}

def hub_rows(name):  # the rows of a benchmark's Hub file, as dicts
    from huggingface_hub import hf_hub_download
    bench = BENCHMARKS[name]
    try:
        path = hf_hub_download(bench.hub_id, bench.file, repo_type="dataset")
    except Exception as e:  # offline, moved, gated: one line, not a traceback
        sys.exit(f"error: {name}: cannot download {bench.file} of the Hub dataset {bench.hub_id} "
                 f"({type(e).__name__})")
    if path.endswith(".jsonl"):
        return [row for _, row in fgrpo.read_records(path)]
    if path.endswith(".csv"):
        return list(csv.DictReader(Path(path).read_text("utf-8").splitlines(keepends=True)))
    import pyarrow.parquet as pq  # aime24 and amc23 come as parquet (requirements.txt)
    return pq.read_table(path).to_pylist()

def last_boxed(solution):
    """The content of a solution's last \\boxed{...}, brace-matched; the solution if unclosed."""
    start = solution.rfind("\\boxed{") + len("\\boxed{")
    depth = 1
    for end in range(start, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[end], 0)
        if depth == 0:
            return solution[start:end]
    return solution

def as_problem(i, row, bench):
    """Row i as {"problem", "answer"}: lists joined, solutions cut to their last \\boxed{}, GPQA
    lettered: its options in a fixed order a row (inferred: the paper shows none)."""
    answer = row[bench.answer_field]
    if bench.hub_id == "Idavidrein/gpqa":
        options = [answer, *(row[f"Incorrect Answer {i}"] for i in (1, 2, 3))]
        order = random.Random(i).sample(range(4), 4)
        listed = "".join(f"\n{'ABCD'[j]}) {options[o].strip()}" for j, o in enumerate(order))
        return {"problem": f"{row[bench.problem_field].strip()}\n{listed}\n\n"
                           "Answer with the letter of the correct option.",
                "answer": "ABCD"[order.index(0)]}
    text = ", ".join(map(str, answer)) if isinstance(answer, list) else str(answer)
    text = last_boxed(text) if "\\boxed{" in text else text
    return {"problem": str(row[bench.problem_field]), "answer": text}

# ---------------------------------------------------------------- sampling: DIR/<benchmark>.jsonl
def vllm_sampler(args):
    """(sample(prompts, seeds) -> n completions a prompt, tokenizer), vLLM as fgrpo runs it."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # no engine process spawned beside CUDA
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache, CPU build only
    from vllm import LLM, SamplingParams
    cuda = torch.cuda.is_available()  # on a CPU as fgrpo's engine: float32, no chunked prefill
    llm = LLM(model=args.model, seed=args.seed, dtype="auto" if cuda else "float32",
              enable_chunked_prefill=cuda,  # vllm-cpu fails on a seeded prompt cut in pieces
              distributed_executor_backend="external_launcher" if fgrpo.WORLD > 1 else None)
    tok = llm.get_tokenizer()
    def sample(prompts, seeds):  # ids without added specials, as fgrpo.rollout
        ids = [{"prompt_token_ids": tok(p, add_special_tokens=False).input_ids} for p in prompts]
        params = [SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p,
                                 max_tokens=args.max_new_tokens, seed=s) for s in seeds]
        return [[o.text for o in r.outputs] for r in llm.generate(ids, params, use_tqdm=False)]
    return sample, tok

def transformers_sampler(args):
    """The same from transformers' generate(), through fgrpo.rollout, where vLLM is missing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cuda = torch.cuda.is_available()
    dtype = "auto" if cuda else torch.float32  # the checkpoint's on a GPU; fp32 is fast on a CPU
    try:
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    except (OSError, ValueError) as e:
        sys.exit(f"error: --model {args.model}: cannot load it ({str(e).strip().splitlines()[0]})")
    model = model.to("cuda" if cuda else "cpu").eval()
    def sample(prompts, seeds):  # each prompt under its own seed: independent of its batch
        rollouts = [fgrpo.rollout(model, tok, None, [p], args.n, args, s)
                    for p, s in zip(prompts, seeds)]
        return [tok.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
                for samples in rollouts]
    return sample, tok

def load_sampler(args):  # --rollout's; with hf, vLLM is not even imported: that takes seconds
    if not args.model:
        sys.exit(f"error: {args.out} has problems without samples: pass --model")
    if args.rollout == "hf":
        return transformers_sampler(args)
    try:
        import vllm  # noqa: F401  (tests hide it with sys.modules["vllm"] = None)
    except ImportError:
        sys.exit("error: --rollout vllm: vLLM does not import (make install); or --rollout hf")
    return vllm_sampler(args)

def merge(path, problems, args, rescore=False):
    """Rank 0: `path` and its rank shards merged into `path` -> {index: scores}, cut lines out."""
    shards = sorted(path.parent.glob(glob.escape(path.stem) + ".rank*.jsonl"))
    lines, scores = {}, {}
    for file in ([path] if path.exists() else []) + shards:
        with file.open(encoding="utf-8") as f:
            # json.dumps escapes newlines, so only a whole line ends with one: a cut one never does
            for line in (x for x in f if x.endswith("\n")):
                r = json.loads(line)
                i = r["idx"]
                if i >= len(problems) or r["problem"] != problems[i]["problem"] \
                        or len(r["scores"]) != args.n:
                    sys.exit(f"error: {file} holds other problems or another --n: another --out")
                if rescore:  # e.g. after a fix to as_problem or to math-verify
                    r["answer"] = problems[i]["answer"]
                    r["scores"] = fgrpo.verify(r["completions"], [r["answer"]] * args.n)
                    line = json.dumps(r) + "\n"
                lines[i] = line  # a problem in two files (a kill mid-merge): the same line
                scores[i] = r["scores"]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(lines[i] for i in sorted(lines)), encoding="utf-8")
    tmp.replace(path)  # then the shards go: a kill in between leaves lines twice, read once
    for shard in shards:
        shard.unlink()
    return scores

def run_benchmark(path, problems, sampler, args):
    """Sample and verify the problems not in `path`, a rank's share into its shard; rank 0 merges.
    Returns ({index: scores} on rank 0, the sampler, if made)."""
    done = merge(path, problems, args, args.rescore) if fgrpo.RANK == 0 else {}
    finished = fgrpo.all_reduce([float(i in done) for i in range(len(problems))])  # rank 0's
    todo = [] if args.rescore else [i for i, f in enumerate(finished) if not f]
    if todo and not sampler:  # on every rank at once: under torchrun vLLM's start is collective
        sampler = load_sampler(args)
    shard = path if fgrpo.WORLD == 1 else path.with_suffix(f".rank{fgrpo.RANK}.jsonl")
    mine = todo[fgrpo.RANK::fgrpo.WORLD]
    for start in tqdm(range(0, len(mine), args.chunk), desc=path.stem, disable=fgrpo.RANK or None):
        ids = mine[start:start + args.chunk]
        sample, tok = sampler  # (the sampler exists wherever there is work)
        texts = sample([fgrpo.format_prompt(tok, problems[i]["problem"]) for i in ids],
                       [args.seed * 1_000_003 + i for i in ids])
        golds = [problems[i]["answer"] for i in ids for _ in range(args.n)]
        scores = iter(fgrpo.verify([t for ts in texts for t in ts], golds))
        with shard.open("a", encoding="utf-8") as f:  # whole lines: a kill cuts only the last
            for i, ts in zip(ids, texts):
                record = {"idx": i, **problems[i], "completions": ts,
                          "scores": [next(scores) for _ in ts]}
                f.write(json.dumps(record) + "\n")
    if todo:  # every rank waits for the slowest (gloo, no GPU), then rank 0 merges the shards
        fgrpo.all_reduce([0.0])
        done = merge(path, problems, args) if fgrpo.RANK == 0 else {}
    return done, sampler

# ---------------------------------------------------------------- results and the table
def benchmark_result(domain, problems, done):
    """A benchmark's results.json entry: per problem samples, correct, id; the pass@k curve."""
    idx = sorted(done)
    n = np.array([len(done[i]) for i in idx])
    c = np.array([int(sum(done[i])) for i in idx])
    ids = [hashlib.sha256(problems[i]["problem"].encode()).hexdigest()[:16] for i in idx]
    curve = {str(k): float(pass_at_k(n, c, k).mean()) for k in powers_of_two(n.min())}
    return {"domain": domain, "samples": n.tolist(), "correct": c.tolist(), "ids": ids,
            "pass@k": curve}

def report(args, benches, done, settings):
    """pass@k per benchmark, each domain's average over benchmarks (Table 1's), to results.json."""
    results = {"model": args.model, "settings": settings, "benchmarks": {
        name: benchmark_result(domain, problems, done[name])
        for name, (domain, problems) in benches.items() if done[name]}}
    if not results["benchmarks"]:
        sys.exit(f"error: {args.out} holds no samples of {', '.join(benches)} yet")
    for domain in ("math", "ood"):
        group = [r["pass@k"] for r in results["benchmarks"].values() if r["domain"] == domain]
        if group:
            results[f"{domain}_avg"] = {k: float(np.mean([g[k] for g in group])) for k in group[0]}
    curves = {name: r["pass@k"] for name, r in results["benchmarks"].items()}
    curves.update({x: results[x] for x in ("math_avg", "ood_avg") if x in results})
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1))
    top = str(min(max(map(int, curve)) for curve in curves.values()))
    print(f"\npass@1/pass@{top}, laid out as the paper's Table 1")
    cells = [f"{curve['1']:.1%}/{curve[top]:.1%}" for curve in curves.values()]
    print_table([["model", *curves], [str(args.model), *cells]])
    return results

def print_table(rows):  # as markdown, the first row the header
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join([lines[0], "|" + "---|" * len(rows[0]), *lines[1:]]))

# ---------------------------------------------------------------- --compare, main
def subsample_size(args, least):
    """--test subsampling's m: --m, else n/4 of least, App. Q's 256 of 1024; None: permutation."""
    if args.m is not None and args.test != "subsampling":
        sys.exit("error: --m is --test subsampling's; the permutation test uses every sample")
    m = max(1, least // 4) if args.m is None else args.m
    if args.test == "subsampling" and not 1 <= m <= least / 2:  # delta* narrower than delta
        sys.exit(f"error: --m {m} must be 1 to n/2 = {least / 2:g} with --test subsampling: above "
                 "n/2 it says p < alpha too often when A and B are equally good")
    if args.test == "subsampling" and m < least / 2:  # delta* sqrt(n/m - 1) times as wide (pass@1)
        print(f"note: --test subsampling at m {m} of n {least} is conservative: delta* spreads "
              f"{np.sqrt(least / m - 1):.2f} times as wide as delta, so p runs high")
    return m if args.test == "subsampling" else None

def compare(dir_a, dir_b, args):
    """Does checkpoint B beat A on these problems? delta(k) = mean pass@k(B) - pass@k(A), and p."""
    paths = [Path(folder) / "results.json" for folder in (dir_a, dir_b)]
    for path in paths:
        if not path.exists():
            sys.exit(f"error: {path} not found: evaluate into that folder first")
    results = [json.loads(path.read_text()) for path in paths]
    a, b = (r["benchmarks"] for r in results)
    if a.keys() != b.keys() or any(a[x]["ids"] != b[x]["ids"] for x in a):
        sys.exit(f"error: {dir_a} and {dir_b} hold different problems: compare the same ones")
    least = min(r[x]["samples"][0] for r in (a, b) for x in r)  # one n a folder: merge refuses 2
    m = subsample_size(args, least)
    ks = powers_of_two(m or least)
    rng = np.random.default_rng(args.seed)
    sa, sb = (r.get("settings", {}) for r in results)  # the samples' settings (older: none)
    rows = [[k, str(sa.get(k)), str(sb.get(k))] for k in {**sa, **sb} if sa.get(k) != sb.get(k)]
    if rows:
        print(f"\nA {dir_a} and B {dir_b} were sampled with other settings:")
        print_table([["setting", "A", "B"], *rows])
    drawn = {}  # {benchmark or average: (delta (K,), delta* (iters, K))}
    for x in a:
        pair = [(r[x]["samples"][0], np.array(r[x]["correct"])) for r in (a, b)]
        passk = [pass_at_k_table(n, tuple(ks))[c].mean(0) for n, c in pair]  # (K,) of A, of B
        drawn[x] = (passk[1] - passk[0], redrawn_deltas(*pair, ks, args.iters, rng, m))
    for domain in ("math", "ood"):
        group = [x for x in a if a[x]["domain"] == domain]
        if group:  # an average's delta* is taken within each iteration
            drawn[f"{domain}_avg"] = [np.mean([drawn[x][j] for x in group], 0) for j in (0, 1)]
    res = {x: {"k": ks, "delta": delta.tolist(), "p": two_sided_p(delta, draws, args.test).tolist()}
           for x, (delta, draws) in drawn.items()}
    print(f"\ndelta pass@k of {dir_b} minus {dir_a}, two-sided p in brackets, * p < {args.alpha}")
    cell = "{:+.1%} ({:.3f}){}".format
    rows = [[x, *(cell(d, p, "*" * (p < args.alpha)) for d, p in zip(r["delta"], r["p"]))]
            for x, r in res.items()]
    print_table([[f"benchmark ({args.test} p)", *(f"k={k}" for k in ks)], *rows])
    if args.out:  # {benchmark or average: {"k", "delta" (B minus A), "p"}} and the settings
        Path(args.out).mkdir(parents=True, exist_ok=True)
        saved = {"a": dir_a, "b": dir_b, "test": args.test, "m": m, "iters": args.iters,
                 "seed": args.seed, "results": res}
        (Path(args.out) / "compare.json").write_text(json.dumps(saved, indent=1))
    return res

SAMPLED_WITH = ("model", "n", "temperature", "top_p", "max_new_tokens", "seed", "rollout")

def record_settings(args):
    """DIR/run.json (fgrpo.record_run): a change to SAMPLED_WITH but the sampler exits at once."""
    path = Path(args.out) / "run.json"
    saved = json.loads(path.read_text())["settings"] if path.exists() else {}
    for key, value in saved.items():
        if args.rescore or getattr(args, key) is None:
            setattr(args, key, value)
    args.rollout = args.rollout or ("vllm" if importlib.util.find_spec("vllm") else "hf")
    record = fgrpo.record_run(path, {k: getattr(args, k) for k in SAMPLED_WITH}, {"rollout"}, True)
    return {**record["settings"], "commit": record["commit"]}

def check_args(args):
    unknown = [] if args.data else [b for b in args.benchmarks.split(",") if b not in BENCHMARKS]
    if unknown:
        sys.exit(f"error: unknown benchmark '{unknown[0]}' in --benchmarks; known: "
                 f"{', '.join(BENCHMARKS)}")
    if args.model and not Path(args.model).exists() and args.model.count("/") != 1:
        sys.exit(f"error: --model {args.model}: no such folder, and not a Hub id (org/name)")
    if not args.out or args.n < 1 or args.temperature <= 0 or not 0 < args.top_p <= 1:
        sys.exit("error: --out is required, --n must be >= 1, --temperature > 0, --top-p in (0, 1]")

def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.compare:
        return compare(*args.compare, args)
    check_args(args)
    if argv is None and fgrpo.needs_relaunch():  # plain python on a multi-GPU node: rank per GPU
        return fgrpo.relaunch_under_torchrun()
    fgrpo.init_distributed(timeout=datetime.timedelta(days=7))  # a rank may end hours early
    Path(args.out).mkdir(parents=True, exist_ok=True)
    settings = record_settings(args)
    benches = load_benchmarks(args)
    sampler, done = None, {}
    for name, (_, problems) in benches.items():
        done[name], sampler = run_benchmark(Path(args.out) / f"{name}.jsonl", problems, sampler,
                                            args)
    return report(args, benches, done, settings) if fgrpo.RANK == 0 else None  # rank 0 writes

if __name__ == "__main__":
    main()
