"""What chain decoding would accept of a draft's rollouts on held-out answers (tensor functions, and the held-out
loop every task's evaluation runs them in: heldout_acceptance).

Every task's evaluation (train/medusa.py, train/eagle.py, train/dflash.py) rolls its draft out as the chain decoder would from
held-out answer positions, and hands this module, per chain step j = 1..k, the draft's logits and the base's
logits at the same place; here they become the engine's acceptance per position:

  T=0  acc_j = P(the first j draft tokens all equal the base's greedy tokens)            (greedy decoding)
  T=1  acc_j = E[Π_{i≤j} Σ_x min(p_i(x), q_i(x))]                         (lossless speculative sampling)

p_i is the base's softmax, q_i the draft's, at chain step i. τ = 1 + Σ_j acc_j is the mean number of tokens a
chain of k drafts yields per base forward (the base's own token counts 1).

Approximation (stated, as the evaluation is teacher-path): the base's logits at chain step i are its logits on
the held-out answer itself (prefix x_≤t+i), not on the draft's tokens. At T=0 the two agree wherever the answer is
the base's own greedy continuation (self-distilled data), which is what an accepted chain of greedy tokens is. At
T=1 the chain's later steps would condition on sampled tokens; the product along the teacher/greedy path stands in
for that expectation. The draft side is exact: each task rolls its draft out on its own tokens and features.
"""

from __future__ import annotations

from typing import Callable

import torch

from specheads.data.tokenization import IGNORE_INDEX
from specheads.train.data_order import heldout_batches

CHUNK = 256  # chain starts scored at once: k × CHUNK × V floats of logits per side


def overlap(draft_probs: torch.Tensor, base_probs: torch.Tensor) -> torch.Tensor:
    """Σ_x min(q(x), p(x)) over the last axis: the probability that lossless speculative sampling accepts a token
    drawn from q when the base samples from p (Leviathan et al.); 1 − this is their total-variation distance."""
    return torch.minimum(draft_probs, base_probs).sum(-1)


def chain_starts(labels: torch.Tensor, k: int) -> torch.Tensor:
    """[B, T] bool: positions t whose whole chain lies in an answer: the tokens drafted from t, x_{t+2} ..
    x_{t+k+1}, are all assistant tokens (the base's own token x_{t+1} comes first, as in decoding)."""
    batch, length = labels.shape
    keep = torch.zeros_like(labels, dtype=torch.bool)
    if length > k + 1:
        ok = torch.ones((batch, length - k - 1), dtype=torch.bool, device=labels.device)
        for i in range(k):
            ok &= labels[:, i + 2: length - k + 1 + i] != IGNORE_INDEX
        keep[:, : length - k - 1] = ok
    return keep


def along_chain(states: torch.Tensor, starts: torch.Tensor, offset: int) -> torch.Tensor:
    """states [B, T, ...] at position t + offset for every chain start t (starts [B, T] bool) -> [N, ...]."""
    shifted = torch.roll(states, -offset, dims=1) if offset else states  # starts never reach past the end
    return shifted[starts]


def chain_counts(draft_logits: torch.Tensor, base_logits: torch.Tensor,
                 draft_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Summed acceptance of n chains: draft_logits [k, n, Vd] (the draft vocabulary, ids `draft_ids` [Vd] in the
    base's vocabulary, or None when it is the base's), base_logits [k, n, V] -> float64 [2k + 1]: Σ over chains
    of the T=0 acceptance of steps 1..k, the same at T=1, then n."""
    base_logits, draft_logits = base_logits.float(), draft_logits.float()
    greedy = base_logits.argmax(-1)
    proposed = draft_logits.argmax(-1)
    base_probs = torch.softmax(base_logits, -1)
    if draft_ids is not None:
        proposed, base_probs = draft_ids[proposed], base_probs[..., draft_ids]
    t0 = (proposed == greedy).double().cumprod(0).sum(1)
    t1 = overlap(torch.softmax(draft_logits, -1), base_probs).double().cumprod(0).sum(1)
    n = torch.tensor([draft_logits.shape[1]], dtype=torch.float64, device=t0.device)
    return torch.cat([t0, t1, n])


def chunked_chain_counts(k: int, n: int, logits, draft_ids: torch.Tensor | None, device) -> torch.Tensor:
    """chain_counts over n chains CHUNK at a time; logits(lo, hi) -> (draft_logits [k, m, Vd], base [k, m, V])."""
    counts = torch.zeros(2 * k + 1, dtype=torch.float64, device=device)
    for lo in range(0, n, CHUNK):
        counts += chain_counts(*logits(lo, min(n, lo + CHUNK)), draft_ids).to(device)
    return counts


def acceptance_result(counts: torch.Tensor, k: int) -> dict:
    """Summed chain_counts (over batches and ranks) -> per-position acceptance and τ at T=0 and T=1."""
    counts = counts.tolist()
    n = max(counts[2 * k], 1.0)
    t0, t1 = [c / n for c in counts[:k]], [c / n for c in counts[k:2 * k]]
    return {"accept_t0": t0, "accept_t1": t1, "tau_t0": 1 + sum(t0), "tau_t1": 1 + sum(t1),
            "accept_positions": int(counts[2 * k])}


def acceptance_logs(result: dict) -> dict:
    """TensorBoard scalars: accept_t0/pos1..k, accept_t1/pos1..k, accept_t0/tau, accept_t1/tau."""
    logs = {}
    for temperature in ("t0", "t1"):
        for j, value in enumerate(result[f"accept_{temperature}"], 1):
            logs[f"accept_{temperature}/pos{j}"] = value
        logs[f"accept_{temperature}/tau"] = result[f"tau_{temperature}"]
    return logs


def format_acceptance(result: dict) -> str:
    t0 = " ".join(f"{a:.3f}" for a in result["accept_t0"])
    t1 = " ".join(f"{a:.3f}" for a in result["accept_t1"])
    return (f"rollout acceptance per position over {result['accept_positions']} held-out chains: T=0 {t0} "
            f"(tau {result['tau_t0']:.3f}); T=1 {t1} (tau {result['tau_t1']:.3f})")


def capped_examples(examples, positions: int):
    """The first held-out examples whose answer tokens reach `positions` (the same on every rank): the
    rollout's cost cap. 0: none."""
    if positions <= 0:
        return []
    total = 0
    for n, example in enumerate(examples, 1):
        total += example.num_labels
        if total >= positions:
            return examples[:n]
    return examples


def heldout_acceptance(examples, positions: int, k: int, pad_token_id, batch_size: int, accelerator,
                       counts_of: Callable) -> dict:
    """The rollout acceptance of a task's draft (acceptance_result) over the held-out examples capped at `positions`
    answer tokens (capped_examples; 0: {}, no rollout): counts_of(indices, batch) gives one batch's chain counts
    (2k + 1, chunked_chain_counts), summed here over batches and ranks."""
    if positions <= 0:
        return {}
    accept = torch.zeros(2 * k + 1, dtype=torch.float64, device=accelerator.device)
    for indices, batch in heldout_batches(capped_examples(examples, positions), pad_token_id, batch_size, accelerator):
        accept += counts_of(indices, batch).to(accept.device)
    return acceptance_result(accelerator.reduce(accept, reduction="sum"), k)


# ---- held-out accuracy per head (Medusa) or draft step (EAGLE, DFlash block position) -------------------

def format_accuracy(result: dict) -> str:
    lines = ["head  top-1   top-5   tokens"]
    for k, (t1, t5, n) in enumerate(zip(result["top1"], result["top5"], result["tokens"]), 1):
        lines.append(f"{k:>4}  {t1:.3f}   {t5:.3f}   {int(n)}")
    lines.append(f"estimated chain tau (1 + sum of prod top-1): {result['estimated_tau']:.3f}")
    if "accept_t0" in result:
        lines.append(format_acceptance(result))
    return "\n".join(lines)


def accuracy_logs(result: dict) -> dict:
    logs = {"eval/estimated_tau": result["estimated_tau"]}
    for k, (t1, t5) in enumerate(zip(result["top1"], result["top5"]), 1):
        logs[f"eval/top1_head{k}"] = t1
        logs[f"eval/top5_head{k}"] = t5
    if "accept_t0" in result:
        logs.update(acceptance_logs(result))
    return logs


def accuracy_result(counts: torch.Tensor) -> dict:
    """Summed [K, 3] hit counts (top-1, top-5, tokens) -> per-head accuracies and the chain τ estimate."""
    from specheads.train.losses import estimated_tau  # losses reads this module's overlap

    top1 = (counts[:, 0] / counts[:, 2].clamp(min=1)).tolist()
    top5 = (counts[:, 1] / counts[:, 2].clamp(min=1)).tolist()
    return {"top1": top1, "top5": top5, "tokens": counts[:, 2].tolist(), "estimated_tau": estimated_tau(top1)}


def accuracy_extra(result: dict) -> dict:
    """What the saved heads' config.json records of the final evaluation."""
    return {"heldout_accuracy": {key: result[key] for key in ("top1", "top5", "tokens", "estimated_tau")}}
