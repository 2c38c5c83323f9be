"""make parity: what fgrpo's advantages and losses equal in verl 0.9.1 and TRL 1.16.0, measured.

    make parity
        # installs verl into /tmp/fgrpo-parity-deps, then runs this (~1 min)
    python checks/parity.py --deps DIR
        # verl already in DIR (pip install --no-deps --target DIR ...)

The peers' own code is imported unmodified: verl's verl/trainer/ppo/core_algos.py from the scratch
folder DIR, and TRL's GRPOTrainer._compute_loss (called with a stub `self`) from this environment.
Both sides get the same random tensors: P groups of N rollouts with 0/1 rewards, a ragged
right-padded response mask, and old log-probs a few tenths off the current ones (3% of tokens far
off), so every clip region is visited. A loss row compares the loss value and its gradient w.r.t.
the log-probs. F-GRPO changes only the advantages (A^F = g(x) * A, Sec. 4, Eq. 13), so each
F-variant (gamma > 0) passes fgrpo's focal-scaled advantages through the peer's unchanged loss. The
last rows are settings that look right but are not; they must come out unequal. One markdown table
is printed and written, with the raw numbers, to checks/parity_results.json; the exit status is 1 if
any row is not as expected.
"""
import argparse
import importlib
import json
import sys
import types
import warnings
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # fgrpo.py lives there
import fgrpo  # noqa: E402

# 0 = the base algorithm; 0.5: the paper's F-GRPO and F-DAPO; 1.0: its F-CISPO
GAMMAS = (0.0, 0.5, 1.0)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--deps", default="/tmp/fgrpo-parity-deps", help="scratch folder holding verl, installed "
      "with pip install --no-deps --target (make parity-deps does it); on sys.path only while it "
      "is imported")
    a("--out", default=str(Path(__file__).with_name("parity_results.json")),
      help="JSON file: table and numbers")
    a("--seed", type=int, default=0, help="seed of the random rewards, log-probs and mask")
    a("--groups", type=int, default=32, help="prompts in the batch")
    a("--group-size", type=int, default=8, help="N, rollouts per prompt")
    a("--max-len", type=int, default=64, help="response tokens of the longest sequence")
    a("--noise", type=float, default=0.3,
      help="std of logp - old_logp; 3%% of tokens get 8 times as much")
    a("--dtype", default="float64", choices=["float64", "float32"],
      help="dtype of log-probs and losses")
    a("--rtol", type=float, default=1e-6,
      help="equal: max |diff| <= rtol * max |fgrpo's value| (and gradient)")
    return p


# ----------------------------------------------------------------------------
# The peers, imported unmodified: verl from --deps, TRL from this environment.
# ----------------------------------------------------------------------------
def import_verl(deps):
    """(verl's core_algos, its ActorConfig, verl's version) from the folder `deps`, where pip
    install --no-deps --target put it; sys.path and antlr4 are as they were afterwards. The tests
    import verl this way too."""
    if not (Path(deps) / "verl").is_dir():
        raise ImportError(f"no verl/ in {deps}")
    saved_path = list(sys.path)
    # an antlr4 4.13 already imported (math-verify's, in a test run) steps aside meanwhile
    saved_antlr = {m: sys.modules.pop(m) for m in list(sys.modules)
                   if m == "antlr4" or m.startswith("antlr4.")}
    try:
        # omegaconf 2.3 (verl's configs) needs antlr4 4.9.3, held in `deps`; math-verify here needs
        # 4.13. Load 4.9.3 alone with `deps` in front, then put `deps` BEHIND the environment, so
        # that torch, transformers, numpy ... stay the environment's. antlr4 leaves sys.modules
        # again in `finally`.
        sys.path.insert(0, deps)
        importlib.import_module("antlr4")
        sys.path[:] = saved_path + [deps]
        # Not `import verl`: verl/__init__.py pulls in ray and more. An empty package whose __path__
        # is verl's folder lets core_algos import its own submodules; ray is only a name there
        # (verl.protocol annotates with ray.ObjectRef), so a stub does.
        if "ray" not in sys.modules:
            sys.modules["ray"] = SimpleNamespace(ObjectRef=object)
        sys.modules["verl"] = types.ModuleType("verl")
        sys.modules["verl"].__path__ = [str(Path(deps) / "verl")]
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        actor_config = importlib.import_module("verl.workers.config").ActorConfig
    finally:
        sys.path[:] = saved_path
        for name in [m for m in sys.modules if m == "antlr4" or m.startswith("antlr4.")]:
            # omegaconf keeps its references; a later `import antlr4` gets 4.13
            del sys.modules[name]
        sys.modules.update(saved_antlr)
    versions = {d.metadata["Name"]: d.version for d in metadata.distributions(path=[deps])}
    return core_algos, actor_config, versions["verl"]


def import_peers(deps):
    """verl's core_algos and ActorConfig from the folder `deps`; TRL's GRPOTrainer and nanstd."""
    core_algos, actor_config, verl_version = import_verl(deps)
    # TRL looks at the environment's vLLM, which these losses never use
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TRL currently supports vLLM versions")
        grpo_trainer = importlib.import_module("trl.trainer.grpo_trainer")
    nanstd = importlib.import_module("trl.trainer.utils").nanstd
    return SimpleNamespace(core_algos=core_algos, ActorConfig=actor_config,
                           GRPOTrainer=grpo_trainer.GRPOTrainer, nanstd=nanstd,
                           versions={"verl": verl_version, "trl": metadata.version("trl")})


def verl_loss(peers, name, **clip):
    """verl's compute_policy_loss_<name>, token-mean; of its ActorConfig only the clip fields matter
    here (the others satisfy its checks). verl wants a (B, T) advantage: ours, broadcast over the
    mask."""
    config = peers.ActorConfig(strategy="fsdp", rollout_n=8, ppo_micro_batch_size_per_gpu=1, **clip)
    fn = getattr(peers.core_algos, f"compute_policy_loss_{name}")
    return lambda logp, old, adv, mask: fn(
        old, logp, adv[:, None] * mask, mask, "token-mean", config)[0]


def trl_loss(peers, loss_type, epsilon=0.2, epsilon_high=None):
    """TRL's GRPOTrainer._compute_loss with a stub `self`: one process, one micro-batch, no KL, no
    entropy bonus, and the model's forward replaced by returning `logp`, so both gradients are
    w.r.t. the same leaf. For loss_type 'dapo' and 'cispo' TRL divides the token sum by
    num_items_in_batch / num_processes * gradient_accumulation_steps / steps_per_generation: here
    the batch's response-token count, as ours."""
    def run(logp, old, adv, mask):
        accelerator = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x,
                                      reduce=lambda x, reduction: x)
        stub = SimpleNamespace(
            loss_type=loss_type, epsilon_low=epsilon,
            # GRPOTrainer.__init__: epsilon_high = args.epsilon_high or args.epsilon
            epsilon_high=epsilon if epsilon_high is None else epsilon_high,
            _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
            beta=0.0, top_entropy_quantile=1.0, aux_loss_enabled=False,
            off_policy_mask_threshold=None, importance_sampling_level="token", use_vllm=False,
            vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False,
            current_gradient_accumulation_steps=1, accelerator=accelerator,
            model=SimpleNamespace(training=True),
            args=SimpleNamespace(delta=None, steps_per_generation=1),
            _metrics={"train": defaultdict(list)})
        no_prompt = torch.zeros(len(logp), 0, dtype=torch.long)
        inputs = dict(prompt_ids=no_prompt, prompt_mask=no_prompt,
                      completion_ids=torch.zeros_like(mask).long(), completion_mask=mask,
                      advantages=adv, old_per_token_logps=old, num_items_in_batch=mask.sum())
        return peers.GRPOTrainer._compute_loss(stub, None, inputs)
    return run


def fgrpo_loss(algo, **kw):
    eps = fgrpo.PAPER_EPS[algo]
    return lambda logp, old, adv, mask: fgrpo.policy_loss(logp, old, adv, mask, algo, *eps, **kw)[0]


# ----------------------------------------------------------------------------
# The data: the same random tensors for every side.
# ----------------------------------------------------------------------------
def make_batch(args):
    gen = torch.Generator().manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    G, N, T = args.groups, args.group_size, args.max_len
    # 0/1 rewards at a random success rate per prompt: some groups are all 0 or all 1
    # (inactive, A = 0)
    rewards = (torch.rand(G, N, generator=gen) < torch.rand(G, 1, generator=gen)).float()
    lengths = torch.randint(1, T + 1, (G * N,), generator=gen)
    # right-padded responses, as verl and TRL hold them
    mask = (torch.arange(T) < lengths[:, None]).to(dtype)
    logp = torch.log(torch.rand(G * N, T, generator=gen, dtype=dtype).clamp(min=1e-3))
    delta = args.noise * torch.randn(G * N, T, generator=gen, dtype=dtype)
    # far off-policy: reach CISPO's cap 6, dual clip's 3
    delta[torch.rand(G * N, T, generator=gen) < 0.03] *= 8
    return rewards, logp, logp - delta, mask


def ratio_coverage(logp, old_logp, mask):
    """Fraction of response tokens per region of the ratio r, to show that every branch is taken."""
    r = torch.exp(logp - old_logp)[mask.bool()]
    edges = [0, 0.8, 1.0, 1.2, 1.28, 3.0, 6.0, float("inf")]
    return {f"[{lo}, {hi})": round(((r >= lo) & (r < hi)).double().mean().item(), 4)
            for lo, hi in zip(edges, edges[1:])}


# ----------------------------------------------------------------------------
# The comparisons: one row of the table each.
# ----------------------------------------------------------------------------
def row(quantity, gamma, peer, settings, expect, ours, theirs, rtol, grads=(None, None)):
    diff = lambda a, b: None if a is None else (a - b).abs().max().item()
    value_diff, grad_diff = diff(ours, theirs), diff(*grads)
    equal = value_diff <= rtol * ours.abs().max().item() and (
        grad_diff is None or grad_diff <= rtol * grads[0].abs().max().item())
    return dict(quantity=quantity, gamma=gamma, peer=peer, settings=settings, expect_equal=expect,
                equal=equal, fgrpo_value=ours.item() if ours.numel() == 1 else None,
                value_diff=value_diff, grad_diff=grad_diff,
                grad_max=None if grads[0] is None else grads[0].abs().max().item())


def advantage_rows(peers, rewards, mask, rtol):
    N = rewards.shape[1]
    ours = fgrpo.group_advantages(rewards, gamma=0.0).flatten()  # eps 1e-6, unbiased std
    # verl: a (B, T) token reward summing to the sequence's reward; a group id per prompt
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(mask)), mask.sum(-1).long() - 1] = (
        rewards.flatten().to(mask.dtype))
    index = np.array([f"prompt{i // N}" for i in range(len(mask))])
    verl_adv, _ = peers.core_algos.compute_grpo_outcome_advantage(
        token_rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True)
    # TRL has no callable for it: GRPOTrainer._generate_and_score_completions computes, inline, with
    # scale_rewards="group" (its default), A = (r - nanmean_group) / (nanstd_group + 1e-4); nanstd
    # is TRL's own, Bessel-corrected. Those lines, replicated:
    r = rewards.flatten().view(-1, N)
    trl_adv = ((r - r.nanmean(1, keepdim=True))
               / (peers.nanstd(r, dim=1, keepdim=True) + 1e-4)).flatten()
    verl_set, trl_set = ("epsilon 1e-6, norm_adv_by_std_in_grpo True",
                         "scale_rewards 'group' (std + 1e-4)")
    return [row("advantages", 0, "verl compute_grpo_outcome_advantage", verl_set, True,
                ours[:, None] * mask, verl_adv, rtol),
            row("advantages", 0, "TRL's formula with its nanstd", trl_set, False, ours, trl_adv,
                rtol),
            row("advantages, fgrpo eps=1e-4", 0, "TRL's formula with its nanstd", trl_set, True,
                fgrpo.group_advantages(rewards, gamma=0.0, eps=1e-4).flatten(), trl_adv, rtol)]


def loss_cases(peers):
    """(quantity, fgrpo's loss, peer, peer's settings, peer's loss, gammas, expected equal)."""
    cases = []
    for algo in ("grpo", "dapo"):
        lo, hi = fgrpo.PAPER_EPS[algo]
        cases += [
            (f"loss {algo}", fgrpo_loss(algo), "verl compute_policy_loss_vanilla",
             f"clip_ratio_low {lo}, clip_ratio_high {hi}, clip_ratio_c 1e9 (dual clip off)",
             verl_loss(peers, "vanilla", clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=1e9),
             GAMMAS, True),
            (f"loss {algo}", fgrpo_loss(algo), "TRL _compute_loss",
             f"loss_type 'dapo', epsilon {lo}, epsilon_high {hi}",
             trl_loss(peers, "dapo", epsilon=lo, epsilon_high=hi), GAMMAS, True),
            (f"loss {algo}, dual_clip=3", fgrpo_loss(algo, dual_clip=3.0),
             "verl compute_policy_loss_vanilla",
             f"clip_ratio_low {lo}, clip_ratio_high {hi}, clip_ratio_c 3 (verl's default)",
             verl_loss(peers, "vanilla", clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=3.0),
             GAMMAS, True)]
    cases += [
        # verl clips CISPO's weight two-sided; clip_ratio_low 1.0 puts the lower bound at 0, which
        # r > 0 never reaches (ours is the same clamp). TRL's cap is an absolute bound on r:
        # 1 + eps_high = 6.0.
        ("loss cispo", fgrpo_loss("cispo"), "verl compute_policy_loss_cispo",
         "clip_ratio_low 1.0, clip_ratio_high 5.0",
         verl_loss(peers, "cispo", clip_ratio_low=1.0, clip_ratio_high=5.0), GAMMAS, True),
        ("loss cispo", fgrpo_loss("cispo"), "TRL _compute_loss",
         "loss_type 'cispo', epsilon_high 6.0",
         trl_loss(peers, "cispo", epsilon_high=6.0), GAMMAS, True)]
    lo, hi = fgrpo.PAPER_EPS["dapo"]
    cases += [  # settings that look right but are not
        ("loss dapo", fgrpo_loss("dapo"), "verl compute_policy_loss_vanilla",
         f"clip_ratio_low {lo}, clip_ratio_high {hi}, clip_ratio_c left at 3 (dual clip on)",
         verl_loss(peers, "vanilla", clip_ratio_low=lo, clip_ratio_high=hi), (0.0,), False),
        ("loss dapo", fgrpo_loss("dapo"), "TRL _compute_loss",
         f"loss_type 'grpo' (a mean per sequence), epsilon {lo}, epsilon_high {hi}",
         trl_loss(peers, "grpo", epsilon=lo, epsilon_high=hi), (0.0,), False),
        ("loss cispo", fgrpo_loss("cispo"), "verl compute_policy_loss_cispo",
         "clip_ratio_low left at 0.2, clip_ratio_high 5.0",
         verl_loss(peers, "cispo", clip_ratio_high=5.0), (0.0,), False),
        ("loss cispo", fgrpo_loss("cispo"), "TRL _compute_loss",
         "loss_type 'cispo', epsilon_high 5.0 (TRL's documented value)",
         trl_loss(peers, "cispo", epsilon_high=5.0), (0.0,), False),
        ("loss cispo", fgrpo_loss("cispo"), "TRL _compute_loss",
         "loss_type 'cispo', epsilon_high unset (= epsilon, 0.2)",
         trl_loss(peers, "cispo"), (0.0,), False)]
    return cases


def loss_rows(peers, rewards, logp, old_logp, mask, rtol):
    # one focal-scaled advantage per sequence, from fgrpo, fed to both sides
    # (Sec. 4, Eq. 13: A^F = g(x) * A)
    adv = {g: fgrpo.group_advantages(rewards, gamma=g).flatten().to(logp.dtype) for g in GAMMAS}
    rows = []
    for quantity, ours_fn, peer, settings, peer_fn, gammas, expect in loss_cases(peers):
        for g in gammas:
            out = []
            for fn in (ours_fn, peer_fn):  # a fresh leaf for each side
                leaf = logp.clone().requires_grad_(True)
                loss = fn(leaf, old_logp, adv[g], mask)
                out.append((loss.detach(), torch.autograd.grad(loss, leaf)[0]))
            rows.append(row(quantity, g, peer, settings, expect, out[0][0], out[1][0], rtol,
                            (out[0][1], out[1][1])))
    return rows


def markdown(rows):
    fmt = lambda x: "-" if x is None else f"{x:.3g}"
    lines = ["| quantity | gamma | peer | peer settings | fgrpo value | max abs value diff "
             "| max abs grad diff | equal |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['quantity']} | {r['gamma']:g} | {r['peer']} | {r['settings']} | "
              f"{fmt(r['fgrpo_value'])} | {fmt(r['value_diff'])} | {fmt(r['grad_diff'])} | "
              f"{'yes' if r['equal'] else 'no'}"
              f"{'' if r['equal'] == r['expect_equal'] else ' (UNEXPECTED)'} |" for r in rows]
    return "\n".join(lines)


def main():
    args = build_parser().parse_args()
    try:
        peers = import_peers(args.deps)
    except Exception as e:  # a missing folder, a missing or mismatched package
        sys.exit(f"parity: cannot import verl from --deps {args.deps} or TRL "
                 f"({type(e).__name__}: {e}); install them with: make install && "
                 f"make parity-deps PARITY_DEPS={args.deps}")
    rewards, logp, old_logp, mask = make_batch(args)
    rows = (advantage_rows(peers, rewards, mask, args.rtol)
            + loss_rows(peers, rewards, logp, old_logp, mask, args.rtol))
    table = markdown(rows)
    print(table)
    result = dict(versions=({k: metadata.version(k) for k in ("torch", "transformers")}
                            | peers.versions),
                  settings={k: v for k, v in vars(args).items() if k != "out"},
                  ratio_coverage=ratio_coverage(logp, old_logp, mask),
                  inactive_groups=int((rewards == rewards[:, :1]).all(-1).sum()), rows=rows,
                  table=table)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    unexpected = sum(r["equal"] != r["expect_equal"] for r in rows)
    print(f"\nratio r per region (fraction of response tokens): {result['ratio_coverage']}; "
          f"{result['inactive_groups']} of {args.groups} groups inactive. "
          f"{f'{unexpected} row(s) NOT' if unexpected else f'All {len(rows)} rows'} as expected. "
          f"Written to {args.out}")
    sys.exit(1 if unexpected else 0)


if __name__ == "__main__":
    main()
