"""F-GRPO in one file: focal-weighted group-relative policy optimisation.

F-GRPO (Plyusov et al., "Don't Let Your Policy Learn the Obvious and Forget the
Rare", arXiv 2602.06717) changes one thing in GRPO, DAPO or CISPO. Each prompt's
group-relative advantages are multiplied by

    g(x) = (1 - mu_hat_pos(x)) ** gamma,   mu_hat_pos(x) = (# correct of N) / N

so prompts the policy already solves push less, and probability mass is not
sharpened onto the common correct solutions at the expense of rare ones.
Rewards, clip bounds and importance ratios are unchanged; gamma = 0 is exactly
the base algorithm.

    python fgrpo.py --model tiny --algo dapo --gamma 1      # CPU demo, ~1 min
    python fgrpo.py --algo dapo --gamma 1 --data train.jsonl  # the paper's run
    python fgrpo.py --model tiny --out runs/demo --resume   # continue a run

Reading order is running order: arguments -> the math (tail-miss probability,
focal weight, advantages, losses, pass@k) -> log-probs -> rewards -> data and
models -> rollout -> the training step -> checkpoints -> the loop -> main.
"""
import argparse
import atexit
import json
import math
import multiprocessing as mp
import random
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PAPER_EPS = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "cispo": (1.0, 5.0)}  # App. B, L.2
PAPER_GAMMA = {"grpo": 0.5, "dapo": 0.5, "cispo": 1.0}  # Table 7, Qwen2.5-7B


# ----------------------------------------------------------------------------
# Arguments. Defaults are the paper's run (App. L, Table 5); `--model tiny`
# swaps in the CPU demo's defaults below unless a flag is given explicitly:
# a 2-layer model on 5-token answers wants a far larger lr than a 7B, and small
# batches keep a step under a second on 2 cores.
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
    a("--data", help="JSON or JSONL file of problems (required unless --model tiny)")
    a("--problem-key", default="problem", help="field holding the problem text")
    a("--answer-key", default="answer", help="field holding the gold answer")
    a("--algo", default="dapo", choices=sorted(PAPER_EPS), help="base objective (App. B)")
    a("--gamma", type=float, help="focal exponent; default: the paper's per algo "
      f"{PAPER_GAMMA}; 0 = the base algorithm")
    a("--eps-low", type=float, help=f"lower clip; default: the paper's per algo {PAPER_EPS}")
    a("--eps-high", type=float, help="upper clip; default: the paper's per algo")
    a("--prompts", type=int, default=256, help="prompts per rollout batch")
    a("--n", type=int, default=8, help="completions per prompt (group size N)")
    a("--mini-batch", type=int, default=64, help="prompts per optimiser step")
    a("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    a("--gen-batch", type=int, default=64, help="sequences per generate() call")
    a("--lr", type=float, default=1e-6, help="AdamW learning rate, constant after warm-up")
    a("--warmup", type=int, default=15, help="linear warm-up, in rollout steps (as verl)")
    a("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    a("--grad-clip", type=float, default=1.0, help="max global grad norm")
    a("--max-new-tokens", type=int, default=8192, help="max response tokens")
    a("--temperature", type=float, default=1.0, help="sampling temperature (also used in log-probs)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling; top-k is off")
    a("--epochs", type=int, default=10, help="passes over the data (sets --steps)")
    a("--steps", type=int, help="rollout steps; default: epochs * len(data) // prompts")
    a("--save-every", type=int, default=50, help="checkpoint every K steps (and at the end)")
    a("--eval-n", type=int, default=8, help="samples per held-out prompt for pass@k (tiny only)")
    a("--out", default="runs/fgrpo", help="folder for metrics.jsonl and checkpoints")
    a("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    a("--seed", type=int, default=0, help="seed for data order, init and sampling")
    return p


def parse_args(argv=None):
    parser = build_parser()
    if parser.parse_known_args(argv)[0].model == "tiny":
        parser.set_defaults(**TINY)
    args = parser.parse_args(argv)
    err = parser.error
    if args.gamma is None:
        args.gamma = PAPER_GAMMA[args.algo]
    if args.gamma < 0:
        err(f"--gamma must be >= 0, got {args.gamma}")
    lo, hi = PAPER_EPS[args.algo]
    args.eps_low = lo if args.eps_low is None else args.eps_low
    args.eps_high = hi if args.eps_high is None else args.eps_high
    if args.n < 2:
        err("--n must be >= 2: a group of one has no relative advantage")
    if args.prompts % args.mini_batch:
        err(f"--prompts {args.prompts} does not divide into mini-batches of --mini-batch {args.mini_batch}")
    if min(args.prompts, args.mini_batch, args.micro_batch, args.gen_batch, args.max_new_tokens) < 1:
        err("batch sizes and --max-new-tokens must be >= 1")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        err("--temperature must be > 0 and --top-p in (0, 1]")
    if args.model != "tiny" and not args.data:
        err("--data is required unless --model tiny")
    return args


# ----------------------------------------------------------------------------
# ALGO LOGIC: the paper's math. Pure functions of tensors: paste them anywhere.
# ----------------------------------------------------------------------------
def tail_miss_probability(N, mu_pos, tau):
    """Pr(B), Lemma 3.1: the chance that a group of N samples updates the policy
    yet misses a set E of correct answers holding probability mass tau.

    mu_pos is the total correct mass, 0 < tau < mu_pos <= 1. The update is
    active when the group's rewards are mixed; it then pushes mass onto the
    sampled correct answers, so the unsampled E loses mass. Pr(B) is
    non-monotonic in N: small groups are rarely mixed (no update at all), large
    groups rarely miss E, and in between the harm peaks (mu_pos = 0.5, tau = 0.05:
    about 0.72 at N = 5). Prompts with high mu_pos stay mixed yet miss E most
    often, which is why the focal weight g(x) down-weights them.
    """
    if not (isinstance(N, int) and N >= 1):
        raise ValueError(f"N must be an integer >= 1, got {N!r}")
    if not 0 < mu_pos <= 1:
        raise ValueError(f"mu_pos must lie in (0, 1], got {mu_pos}")
    if not 0 < tau < mu_pos:
        raise ValueError(f"tau must lie in (0, mu_pos) = (0, {mu_pos}), got {tau}")
    # Lemma 3.1: Pr(no sample in E) - Pr(all correct, none in E) - Pr(all wrong)
    return (1 - tau) ** N - (mu_pos - tau) ** N - (1 - mu_pos) ** N


def focal_weight(rewards, gamma):
    """F-GRPO's focal coefficient, one scalar per prompt.

    rewards: (P, N) in {0, 1}, N rollouts of each of P prompts.  Returns g: (P,).
    g depends on rewards only, so no gradient flows through it.
    """
    # Sec. 4, Eqs. 11-12: mu_hat_pos(x) = X / N,  g(x) = (1 - mu_hat_pos(x)) ** gamma
    return (1.0 - rewards.float().mean(-1)) ** gamma


def group_advantages(rewards, gamma=0.0, eps=1e-6):
    """GRPO's group-relative advantages, scaled by the focal weight.

    rewards: (P, N).  Returns A^F: (P, N).  gamma = 0 gives plain GRPO.
    The std is unbiased (Bessel), as in verl. All-equal groups get exactly 0.
    """
    r = rewards.float()
    # Sec. 2 (GRPO): A_i = (R_i - mean_j R_j) / (std_j R_j + eps)
    adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + eps)
    adv = adv.masked_fill((r == r[:, :1]).all(-1, keepdim=True), 0.0)
    # Sec. 4, Eq. 13: A^F_i = g(x) * A_i, after the std normalisation
    return focal_weight(r, gamma)[:, None] * adv


def policy_loss(logp, old_logp, advantages, mask, algo, eps_low=None, eps_high=None,
                num_tokens=None):
    """Token-mean policy loss of GRPO, DAPO or CISPO (App. B), to minimise.

    logp:       (B, T) log-probs of the sampled tokens under the current policy
    old_logp:   (B, T) the same under the policy that sampled them (no grad)
    advantages: (B,)   one (focal-scaled) advantage per sequence
    mask:       (B, T) 1 on response tokens, 0 on prompt and padding
    algo:       "grpo" | "dapo" | "cispo";  eps_low/eps_high: None = the paper's
                (PAPER_EPS at the top of this file: copy it along with this function)
    num_tokens: the token-mean denominator. Default mask.sum(). When one
                optimiser step spans several micro-batches, pass the response
                token count of the whole step, so accumulated gradients equal
                the full-batch gradient.
    Returns (loss, stats); stats["clip_frac"] is the fraction of response
    tokens whose ratio was clipped.
    """
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
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def token_logprobs(model, input_ids, attention_mask, temperature=1.0, chunk=1024):
    """log pi(x_{t+1} | x_{<=t}) at the sampling temperature.

    input_ids, attention_mask: (B, T).  Returns (B, T-1), the log-probs of
    input_ids[:, 1:]. The lm_head and log-softmax run on `chunk` positions at a
    time, and each chunk is recomputed in backward (activation checkpointing),
    so at most one chunk of logits is alive. Models that post-process logits
    (e.g. Gemma's soft-capping) would need that step added to _chunk_logprobs.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() does
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids).last_hidden_state
    B, T, H = hidden.shape
    hidden, targets = hidden[:, :-1].reshape(-1, H), input_ids[:, 1:].reshape(-1)
    head = model.get_output_embeddings()
    out = [checkpoint(_chunk_logprobs, head, hidden[i:i + chunk], targets[i:i + chunk],
                      temperature, use_reentrant=False)
           for i in range(0, hidden.shape[0], chunk)]
    return torch.cat(out).view(B, T - 1)


# ----------------------------------------------------------------------------
# Rewards: math-verify (gold first), in worker processes. Its timeouts use
# signal.alarm, which fails in threads and cannot stop C-level hangs, so every
# item also has an outer timeout that kills the workers.
# ----------------------------------------------------------------------------
ANSWER_TAIL = 2000  # chars of an unboxed completion handed to math-verify
_POOL = None


def boxed_answer(text):
    """The last \\boxed{...} of a completion, brace-matched; else its tail."""
    start = text.rfind("\\boxed{")
    depth = 0
    for end in range(start + 6, len(text)) if start >= 0 else ():
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end + 1]
    return text[-ANSWER_TAIL:]


def _parse_gold(gold, timeout):  # runs in a worker
    from math_verify import parse
    return parse("\\boxed{" + gold + "}", parsing_timeout=timeout)  # wrapped as verl does


def _check(gold, answer, timeout):  # runs in a worker; no text is ever eval'd as Python
    from math_verify import parse, verify as math_verify
    return float(math_verify(gold, parse(answer, parsing_timeout=timeout), timeout_seconds=timeout))


def _pool_map(fn, tasks, timeout, default, desc):
    """[fn(*t) for t in tasks] in worker processes; a task over `timeout` gets `default`."""
    global _POOL
    out, todo = [default] * len(tasks), list(range(len(tasks)))
    bar = tqdm(total=len(tasks), desc=desc, leave=False, disable=None)
    while todo:
        if _POOL is None:  # fork: workers start in ms and share the parent's imports
            _POOL = mp.get_context("fork").Pool(min(8, mp.cpu_count()))
            atexit.register(_POOL.terminate)  # before interpreter teardown, where Pool.__del__ warns
        jobs, todo = [(i, _POOL.apply_async(fn, (*tasks[i], max(1, int(timeout))))) for i in todo], []
        for k, (i, job) in enumerate(jobs):
            try:
                out[i] = job.get(timeout)
            except mp.TimeoutError:
                warnings.warn(f"verify: an item exceeded {timeout}s and scores 0; restarting workers")
                for j, rest in jobs[k + 1:]:  # keep what finished, redo the rest in a new pool
                    if not rest.ready():
                        todo.append(j)
                    elif rest.successful():
                        out[j] = rest.get()
                bar.update(len(jobs) - k - len(todo))
                _POOL.terminate()
                _POOL = None
                break
            except Exception:  # a worker error scores as wrong, like an unparsable answer
                pass
            bar.update()
    bar.close()
    return out


def verify(completions, golds, timeout=5.0):
    """1.0 where math-verify finds the completion's answer equal to its gold, else 0.0.

    The answer is the completion's last \\boxed{...} (or its tail if it has
    none). Each distinct gold is parsed once and each distinct (gold, answer)
    pair is verified once, so repeated answers at pass@256 scale cost nothing.
    An item that hangs costs about `timeout` seconds and scores 0.
    """
    answers = [boxed_answer(c) for c in completions]
    distinct_golds = list(dict.fromkeys(golds))
    parsed = dict(zip(distinct_golds, _pool_map(_parse_gold, [(g,) for g in distinct_golds],
                                                timeout, [], "parse golds")))
    pairs = list(dict.fromkeys(zip(golds, answers)))
    scores = _pool_map(_check, [(parsed[g], a) for g, a in pairs], timeout, 0.0, "verify")
    score = dict(zip(pairs, scores))
    return [score[pair] for pair in zip(golds, answers)]


# ----------------------------------------------------------------------------
# Data and models
# ----------------------------------------------------------------------------
def load_problems(path, problem_key="problem", answer_key="answer"):
    """[{problem, answer}] from a JSON list or a JSONL file; bad input exits with one line."""
    path = Path(path)
    if not path.is_file():
        sys.exit(f"error: data file {path} not found")
    text = path.read_text()
    if text.lstrip().startswith("["):  # one JSON list: errors name the line, fields the record
        where, chunks = "record", [(1, text)]
    else:  # JSONL: one object per non-empty line
        where, chunks = "line", [(i, l) for i, l in enumerate(text.splitlines(), 1) if l.strip()]
    rows = []
    for line, chunk in chunks:
        try:
            rows.append((line, json.loads(chunk)))
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
        answer = ", ".join(map(str, answer)) if isinstance(answer, list) else str(answer)
        problems.append({"problem": str(row[problem_key]), "answer": answer})
    if not problems:
        sys.exit(f"error: {path} holds no problems")
    return problems


TINY_MERGES = [("m", "a"), ("ma", "x"), (")", "="), ("\\", "b"), ("\\b", "o"), ("\\bo", "x"),
               ("\\box", "e"), ("\\boxe", "d")]


def build_tiny(seed, warm_steps=150):
    """A 2-layer Qwen2 model, its tokenizer and the toy task "max(3,9,1,4,7)=" -> "\\boxed{9}".

    Built in code, offline. The "base model" comes from a short supervised warm
    start on a random digit of each prompt: it learns the answer format and to
    copy a digit, so about 1 sample in 5 is correct, and RL must discover which
    digit is right. Returns (model, tokenizer, 2,000 train problems, 64 held out).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
    # a byte-level BPE over the task's characters: a real Qwen2Tokenizer, so the saved
    # folder reloads with AutoTokenizer as any Qwen checkpoint does
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


def load_policy(args, path):
    """(model, tokenizer, train problems, held-out problems) for --model/--data."""
    if path == "tiny":
        return build_tiny(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:  # e.g. Llama: padding is masked out anyway
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if args.model == "tiny":  # resuming the demo: the toy task is rebuilt from the seed
        _, _, train, held_out = build_tiny(args.seed, warm_steps=0)
        return model, tok, train, held_out
    return model, tok, load_problems(args.data, args.problem_key, args.answer_key), []


def format_prompt(tok, problem):
    """The problem plus the paper's boxed instruction, in the chat template (App. L).
    The tiny tokenizer has no template: its prompt is the bare problem."""
    if not tok.chat_template:
        return problem
    return tok.apply_chat_template([{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
                                   tokenize=False, add_generation_prompt=True)


# ----------------------------------------------------------------------------
# Rollout: N samples per prompt with transformers' generate()
# ----------------------------------------------------------------------------
@torch.no_grad()
def rollout(model, tok, prompts, n, args):
    """P prompts -> P*N samples, grouped by prompt: (prompt_ids, completion_ids, truncated)."""
    from transformers import GenerationConfig
    eos = model.generation_config.eos_token_id  # an id or a list; stop at any of them
    stop = sorted({tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None})
    cfg = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                           max_new_tokens=args.max_new_tokens, eos_token_id=stop,
                           pad_token_id=tok.pad_token_id)
    rows = [p for p in prompts for _ in range(n)]
    samples, device = [], next(model.parameters()).device
    tok.padding_side = "left"
    for i in tqdm(range(0, len(rows), args.gen_batch), desc="rollout", leave=False, disable=None):
        enc = tok(rows[i:i + args.gen_batch], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(device)
        out = model.generate(**enc, generation_config=cfg).tolist()
        width = enc.input_ids.shape[1]
        for ids, attn, seq in zip(enc.input_ids.tolist(), enc.attention_mask.tolist(), out):
            completion = seq[width:]
            ends = [j for j, t in enumerate(completion) if t in stop]
            completion = completion[:ends[0] + 1] if ends else completion
            samples.append(([t for t, a in zip(ids, attn) if a], completion, not ends))
    return samples


def collate(pairs, pad_id):
    """(prompt_ids, completion_ids) pairs -> right-padded ids and attention (B, T), and the
    response mask (B, T-1) aligned with token_logprobs' outputs."""
    T = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), T), pad_id)
    attn = torch.zeros(len(pairs), T, dtype=torch.long)
    mask = torch.zeros(len(pairs), T - 1)
    for i, (p, c) in enumerate(pairs):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        attn[i, :len(p) + len(c)] = 1
        mask[i, len(p) - 1:len(p) + len(c) - 1] = 1
    return ids, attn, mask


# ----------------------------------------------------------------------------
# The training step: old log-probs once, then prompts / mini_batch optimiser
# steps (4 in the paper; all but the first are off-policy), each accumulated
# over micro-batches with one token-mean normaliser.
# ----------------------------------------------------------------------------
def train_step(model, opt, ids, attn, mask, adv, args):
    """One rollout batch of updates. ids, attn: (B, T); mask: (B, T-1); adv: (B,)."""
    per_update = args.mini_batch * args.n
    updates = [[slice(j, min(j + args.micro_batch, i + per_update))
                for j in range(i, i + per_update, args.micro_batch)]
               for i in range(0, len(ids), per_update)]

    def forward(s):  # trims each micro-batch's right padding
        T = int(attn[s].sum(-1).max())
        return token_logprobs(model, ids[s, :T], attn[s, :T], args.temperature), mask[s, :T - 1]

    with torch.no_grad():  # App. L: pi_old is the sampling policy, fixed for all updates
        old = {s.start: forward(s)[0] for u in updates for s in u}
    m = {"loss": 0.0, "grad_norm": 0.0, "clip_frac": 0.0, "skipped": 0}
    for u in tqdm(updates, desc="train", leave=False, disable=None):
        num_tokens = sum(mask[s].sum() for s in u)  # the whole optimiser step's tokens
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for s in u:
            logp, msk = forward(s)
            loss, stats = policy_loss(logp, old[s.start], adv[s], msk, args.algo,
                                      args.eps_low, args.eps_high, num_tokens)
            loss.backward()
            loss_sum += loss.detach()
            m["clip_frac"] += float(stats["clip_frac"] * msk.sum() / mask.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        if torch.isfinite(loss_sum) and torch.isfinite(grad_norm):
            opt.step()
        else:  # one bad batch must not poison the weights
            warnings.warn(f"non-finite loss {float(loss_sum)} or grad norm {float(grad_norm)}: "
                          "optimiser step skipped")
            m["skipped"] += 1
        m["loss"] += float(loss_sum) / len(updates)
        m["grad_norm"] += float(grad_norm) / len(updates)
    return m


# ----------------------------------------------------------------------------
# Checkpoints: OUT/step_K holds the HF model (safetensors) and trainer_state.pt;
# OUT/latest names the newest. Both are written, then renamed, so a kill at
# any moment leaves the previous checkpoint intact.
# ----------------------------------------------------------------------------
def save_checkpoint(out, model, tok, opt, sched, step, data_pos):
    final, tmp = out / f"step_{step:06d}", out / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    rng = {"python": random.getstate(), "torch": torch.get_rng_state(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step,
                "data_pos": data_pos, "rng": rng}, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (out / "latest.tmp").write_text(final.name)
    (out / "latest.tmp").replace(out / "latest")
    for old in out.glob("step_*"):
        if old != final:
            shutil.rmtree(old)


def load_state(ckpt, opt, sched):
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"], state["data_pos"]


# ----------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------
def take(problems, pos, count, seed):
    """`count` problems from position `pos` of an endless stream of seeded shuffles."""
    perms = {}
    out = []
    for p in range(pos, pos + count):
        epoch, i = divmod(p, len(problems))
        if epoch not in perms:
            perms[epoch] = torch.randperm(len(problems), generator=torch.Generator().manual_seed(seed + epoch))
        out.append(problems[perms[epoch][i]])
    return out


def sample_and_score(model, tok, problems, n, args):
    """n completions per problem and their 0/1 rewards: (samples, rewards (P, n), seconds)."""
    t0 = time.time()
    samples = rollout(model, tok, [format_prompt(tok, p["problem"]) for p in problems], n, args)
    t1 = time.time()
    texts = tok.batch_decode([c for _, c, _ in samples], skip_special_tokens=True)
    rewards = torch.tensor(verify(texts, [p["answer"] for p in problems for _ in range(n)]))
    return samples, rewards.view(len(problems), n), (t1 - t0, time.time() - t1)


def evaluate(model, tok, problems, args):
    """pass@1 and pass@n over `problems`, n = args.eval_n samples each."""
    c = sample_and_score(model, tok, problems, args.eval_n, args)[1].sum(-1).int().tolist()
    return [sum(pass_at_k(args.eval_n, ci, k) for ci in c) / len(c) for k in (1, args.eval_n)]


def run_step(model, tok, opt, problems, args):
    """Rollout, reward, advantages, updates for one batch of problems; returns its metrics."""
    samples, rewards, (t_rollout, t_verify) = sample_and_score(model, tok, problems, args.n, args)
    adv = group_advantages(rewards, args.gamma).flatten()
    t0 = time.time()
    model.train()
    device = next(model.parameters()).device
    ids, attn, mask = (x.to(device) for x in collate([(p, c) for p, c, _ in samples], tok.pad_token_id))
    m = train_step(model, opt, ids, attn, mask, adv.to(device), args)
    model.eval()
    lengths = torch.tensor([float(len(c)) for _, c, _ in samples])
    return {"reward": rewards.mean().item(), "active_frac": (rewards.std(-1) > 0).float().mean().item(),
            "focal_mean": focal_weight(rewards, args.gamma).mean().item(), **m,
            "resp_len": lengths.mean().item(), "trunc_frac": sum(t for *_, t in samples) / len(samples),
            "t_rollout": t_rollout, "t_verify": t_verify, "t_train": time.time() - t0}


def train(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)  # the one place the run is seeded; checkpoints carry the RNG on
    ckpt = out / (out / "latest").read_text() if args.resume and (out / "latest").exists() else None
    if args.resume and ckpt is None:
        sys.exit(f"error: --resume given but {out}/latest does not exist")
    if not args.resume and (out / "latest").exists():
        sys.exit(f"error: {out} already holds a run: pass --resume to continue it, or another --out")
    model, tok, problems, held_out = load_policy(args, ckpt or args.model)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999),  # App. L
                            weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    step, data_pos = load_state(ckpt, opt, sched) if ckpt else (0, 0)
    log_path = out / "metrics.jsonl"
    # after a kill: keep whole lines (a cut last line has no newline) up to the checkpoint's step
    lines = log_path.read_text().split("\n")[:-1] if ckpt and log_path.exists() else []
    keep = [line for line in lines if json.loads(line)["step"] <= step]
    log_path.write_text("".join(line + "\n" for line in keep))
    if held_out and not ckpt:
        p1, pn = evaluate(model, tok, held_out, args)
        print(f"held-out pass@1 {p1:.3f}  pass@{args.eval_n} {pn:.3f}  (before training)")
    steps = args.steps or args.epochs * len(problems) // args.prompts
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    for step in tqdm(range(step + 1, steps + 1), desc="steps", initial=step, total=steps, disable=None):
        batch = take(problems, data_pos, args.prompts, args.seed)
        data_pos += args.prompts
        lr = sched.get_last_lr()[0]
        m = {"step": step, **run_step(model, tok, opt, batch, args), "lr": lr}
        sched.step()
        with log_path.open("a") as f:
            f.write(json.dumps(m) + "\n")
        tqdm.write(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items()))
        if step % args.save_every == 0 or step == steps or stopping:
            save_checkpoint(out, model, tok, opt, sched, step, data_pos)
        if stopping:
            sys.exit(f"stopped by SIGTERM after step {step}; --resume continues")
    if held_out:
        p1, pn = evaluate(model, tok, held_out, args)
        print(f"held-out pass@1 {p1:.3f}  pass@{args.eval_n} {pn:.3f}  (after training)")


if __name__ == "__main__":
    train(parse_args())
