"""F-GRPO among its peers: F-DAPO against its base algorithms and against the methods built for
pass@k, in see_it_happen's toy, at matched pass@1, under experiments/peers_protocol.toml.

Each peer is an advantages function with fgrpo.Hooks.advantages' signature, (0/1 rewards (P, N),
their P * N samples grouped by prompt, fgrpo's args) -> (P, N); its options are read from args
(args.k, args.beta, args.lam), which the protocol's [arms] set. The peers run on DAPO's loss (the
base of F-DAPO), so only the advantages differ between the arms. Two of them look at the sample
itself: the unlikeliness reward (its old log-prob) and DARLING (its answer); sample_for_peers, this
experiment's own sample hook, gives each sample both, so fgrpo.train needs no special case.

The prompt weight. For an advantage that depends only on the group's rewards, the expected update
of a prompt with success probability mu is w(mu) times the gradient of mu, with
w(mu) = N (E[A | the sample is correct] - E[A | it is wrong]): prompt_weight computes it by
enumerating every reward vector of a group. PKPO's is k (1 - mu)^(k-1), the gradient of pass@k;
F-GRPO's is GRPO's scaled down where mu is high.
"""
import itertools
import math
import sys
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import fgrpo  # noqa: E402

EPS = 1e-6  # the authors' codes' epsilon (verl's), where a std or a mean divides


def choose(counts, k):
    """C(m, k) for each m of an integer tensor; 0 where m < k or m < 0 (scipy's comb)."""
    table = torch.tensor([float(math.comb(m, k)) for m in range(int(counts.max()) + 1)] or [0.0])
    return table[counts.long().clamp(min=0)] * (counts >= 0)

# ---------------------------------------------------------------- the peers' advantages
def pkpo_advantages(rewards, samples, args):
    """PKPO (Walder & Karkhanis 2025, arXiv 2505.15201), its s^(loo-1) at k = args.k <= N."""
    r = rewards.float()
    n = r.shape[-1]
    wrong = (n - r.sum(-1, keepdim=True)).long()
    # Eq. 33, s_i = 1/C(n,k) sum over k-subsets I holding i of (max_I g - max_{I minus i} g): with
    # 0/1 rewards a correct i adds 1 where the other k-1 are all wrong, C(n-c, k-1) subsets; a
    # wrong i never changes a subset's max, so it gets 0
    return r * choose(wrong, args.k - 1) / math.comb(n, args.k)


def passk_training_advantages(rewards, samples, args):
    """Pass@k Training (Chen et al. 2025, arXiv 2508.10751), its analytical advantages at k =
    args.k: the group's k-subsets, each rewarded with its max, normalised as GRPO's groups."""
    r = rewards.float()
    n = r.shape[-1]
    wrong = (n - r.sum(-1, keepdim=True)).long()
    # Eqs. 11-13: the mean pass@k reward over the k-subsets, 1 - C(N_neg, k) / C(N, k), and its
    # std sqrt(mean (1 - mean)) (0/1 rewards)
    mean = 1 - choose(wrong, args.k) / math.comb(n, args.k)
    std = (mean * (1 - mean)).sqrt()
    # Eq. 14: a correct response lies in passing subsets only
    correct = (1 - mean) / (std + EPS)
    # Eq. 15: a wrong one lies in a failing subset with chance C(N_neg-1, k-1) / C(N-1, k-1)
    failing = choose(wrong - 1, args.k - 1) / math.comb(n - 1, args.k - 1)
    return torch.where(r == 1, correct, (1 - mean - failing) / (std + EPS))


def w_reinforce_advantages(rewards, samples, args):
    """W-REINFORCE (Zhu et al. 2025, arXiv 2506.01347) at lambda = args.lam."""
    r = rewards.float()
    # lambda L_PSR + L_NSR: +lambda for a correct sample, -1 for a wrong one, no baseline (the
    # authors' compute_psr_nsr_outcome_advantage, advantage="weighted")
    return args.lam * r - (1 - r)


def maxrl_advantages(rewards, samples, args):
    """MaxRL (Tajwar et al. 2026, arXiv 2602.02710)."""
    r = rewards.float()
    mean = r.mean(-1, keepdim=True)
    # A_i = (r_i - mean) / mean: the group's pass rate in place of GRPO's std (the authors'
    # compute_maxrl_outcome_advantage); a group all wrong gets 0 / EPS = 0
    return (r - mean) / (mean + EPS)


def likelihood_ranks(logprobs):
    """(P, N) -> each sample's rank by likelihood within its group, 0 the least likely; tied
    samples share their mean rank (in the toy, samples of one answer tie)."""
    below = (logprobs[:, None, :] < logprobs[:, :, None]).sum(-1)
    tied = (logprobs[:, None, :] == logprobs[:, :, None]).sum(-1) - 1
    return below + tied / 2


def unlikeliness_advantages(rewards, samples, args):
    """The unlikeliness reward (He et al. 2025, arXiv 2506.02355) at beta = args.beta, then GRPO's
    normalisation. Needs each sample's mean_logprob (sample_for_peers)."""
    r = rewards.float()
    n = r.shape[-1]
    logprobs = torch.tensor([s.mean_logprob for s in samples]).view_as(r)
    # R_i (1 - beta rank_i / G), rank_i ascending in the old policy's mean token log-prob (the
    # authors' _compute_advantages): the likelier a correct sample, the less its reward
    shaped = r * (1 - args.beta * likelihood_ranks(logprobs) / n)
    # Sec. 2 (GRPO): (r - mean) / (std + eps), unbiased std as the authors' torch.std
    adv = (shaped - shaped.mean(-1, keepdim=True)) / (shaped.std(-1, keepdim=True) + EPS)
    # groups all correct or all wrong are left out, as the authors' run (advantage_threshold)
    return adv * (r.std(-1, keepdim=True) > 0)


def darling_advantages(rewards, samples, args):
    """DARLING (Li et al. 2025, arXiv 2509.02534), with answers as their own classes (exact in the
    toy). Needs each sample's answer (sample_for_peers)."""
    r = rewards.float()
    n = r.shape[-1]
    groups = [[s.answer for s in samples[i:i + n]] for i in range(0, len(samples), n)]
    same = torch.tensor([[[a == b for b in group] for a in group] for group in groups])  # (P,N,N)
    # Div(y_i): the fraction of the other N-1 responses in another class than y_i's
    diversity = (n - same.sum(-1)) / (n - 1)
    # r_darling = r * Norm(Div): Div already lies in [0, 1], taken as it is
    shaped = r * diversity
    # GRPO's group-relative advantage without the std normalisation, as DARLING's objective
    return shaped - shaped.mean(-1, keepdim=True)

# ---------------------------------------------------------------- what the samples carry
class PeerSample(NamedTuple):
    """fgrpo.Sample and what two peers read of it: the old policy's mean token log-prob (the
    unlikeliness reward's ranking) and the answer, the last \\boxed{...} or else the text."""
    prompt_ids: list
    completion_ids: list
    truncated: bool
    mean_logprob: float
    answer: str


def answer_of(text):
    start = text.rfind("\\boxed{")
    end = text.find("}", start)
    if start < 0 or end < 0:
        return text.strip()
    return text[start + len("\\boxed{"):end].strip()


@torch.no_grad()
def sample_for_peers(model, tok, engine, prompts, n, args, seed):
    """fgrpo.rollout, then each sample's mean token log-prob under the model that sampled it (the
    old policy) and its answer."""
    samples = fgrpo.rollout(model, tok, engine, prompts, n, args, seed)
    device = next(model.parameters()).device
    pairs = [(s.prompt_ids, s.completion_ids) for s in samples]
    ids, attn, mask = (x.to(device) for x in fgrpo.collate(pairs, tok.pad_token_id))
    logp = fgrpo.token_logprobs(model, ids, attn, temperature=args.temperature, mask=mask)
    mean = ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    texts = tok.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
    return [PeerSample(*s, m, answer_of(t)) for s, m, t in zip(samples, mean, texts)]

# each peer's fgrpo.Hooks fields: the two that read the samples sample with sample_for_peers
PEER_HOOKS = {"pkpo": {"advantages": pkpo_advantages},
              "passk_training": {"advantages": passk_training_advantages},
              "unlikeliness": {"sample": sample_for_peers, "advantages": unlikeliness_advantages},
              "w_reinforce": {"advantages": w_reinforce_advantages},
              "maxrl": {"advantages": maxrl_advantages},
              "darling": {"sample": sample_for_peers, "advantages": darling_advantages}}

# ---------------------------------------------------------------- the prompt weight w(mu)
def prompt_weight(advantages, mu, n, args):
    """w(mu) = N (E[A_1 | R_1 = 1] - E[A_1 | R_1 = 0]) of a rewards-only advantages function at
    group size n: every one of the 2^n reward vectors, weighted by its binomial probability."""
    vectors = torch.tensor(list(itertools.product((0, 1), repeat=n)), dtype=torch.float64)
    adv = advantages(vectors, None, args).double()[:, 0]
    correct = vectors.sum(-1)
    prob = mu ** correct * (1 - mu) ** (n - correct)
    first = vectors[:, 0] == 1
    given_correct = (prob * adv)[first].sum() / mu
    given_wrong = (prob * adv)[~first].sum() / (1 - mu)
    return float(n * (given_correct - given_wrong))
