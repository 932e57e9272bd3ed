"""Shifted-target losses and accuracies for Medusa heads (pure tensor functions).

Head k (1-based) at position t predicts token t+k+1, so its target row is the label row
shifted left by k+1. Positions whose target is IGNORE_INDEX (not an assistant token, or past
the end) carry no loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specheads.data.tokenization import IGNORE_INDEX
from specheads.inference.tree import additive_mask
from specheads.train.acceptance import overlap


def shifted_targets(labels: torch.Tensor, num_heads: int) -> torch.Tensor:
    """labels [B, T] -> targets [K, B, T] with targets[k-1, :, t] = labels[:, t+k+1]."""
    batch, length = labels.shape
    targets = labels.new_full((num_heads, batch, length), IGNORE_INDEX)
    for k in range(1, num_heads + 1):
        shift = k + 1
        if shift < length:
            targets[k - 1, :, : length - shift] = labels[:, shift:]
    return targets


def head_positions(labels: torch.Tensor, num_heads: int):
    """Positions [B, T] (bool) where some head has a target, and the targets there [K, N]."""
    targets = shifted_targets(labels, num_heads)
    keep = (targets != IGNORE_INDEX).any(dim=0)
    return keep, targets[:, keep]


def select_trained_positions(hidden: torch.Tensor, labels: torch.Tensor, num_heads: int):
    """Keep only positions where some head has a target: hidden [N, H], targets [K, N]."""
    keep, targets = head_positions(labels, num_heads)
    return hidden[keep], targets


def next_token_positions(labels: torch.Tensor):
    """Positions [B, T] (bool) whose next token is an assistant label, and those labels [N]: the LM loss."""
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    return keep, labels[:, 1:][keep[:, :-1]]


def medusa_loss(logits: torch.Tensor, targets: torch.Tensor, decay: float = 0.8):
    """Σ_k decay^k · CE(head_k, targets_k), k = 1..K. Returns (total, per-head mean losses [K]).

    One cross-entropy call over all heads with ignore_index: indexing each head's logits
    separately would allocate (and zero-fill, in backward) a copy of the huge logits tensor.
    """
    num_heads, vocab = logits.shape[0], logits.shape[-1]
    token_losses = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                                   ignore_index=IGNORE_INDEX, reduction="none").view(num_heads, -1)
    counts = (targets != IGNORE_INDEX).reshape(num_heads, -1).sum(-1).clamp(min=1)
    per_head = token_losses.float().sum(-1) / counts
    weights = decay ** torch.arange(1, num_heads + 1, dtype=per_head.dtype, device=per_head.device)
    return (weights * per_head).sum(), per_head


def _head_loss_sums(transformed, targets, project) -> torch.Tensor:
    logits = project(transformed)
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                             reduction="none")
    return losses.view(targets.shape).float().sum(-1)


def chunked_medusa_loss(transformed: torch.Tensor, project, targets: torch.Tensor, decay: float = 0.8,
                        chunk: int = 1024):
    """medusa_loss(project(transformed), targets), holding at most K × chunk × V logits at a time.

    transformed: each head's hidden state [K, N, H]; project: [K, n, H] -> logits [K, n, V]. Each chunk's
    logits are freed after its loss and recomputed in backward (activation checkpointing), so memory no
    longer grows with K × sequence × vocabulary; the price is one more lm_head matmul per chunk."""
    from torch.utils.checkpoint import checkpoint

    num_heads, positions = targets.shape
    sums = torch.zeros(num_heads, dtype=torch.float32, device=transformed.device)
    for start in range(0, positions, chunk):
        sums = sums + checkpoint(_head_loss_sums, transformed[:, start:start + chunk], targets[:, start:start + chunk],
                                 project, use_reentrant=False)
    per_head = sums / (targets != IGNORE_INDEX).sum(-1).clamp(min=1)
    weights = decay ** torch.arange(1, num_heads + 1, dtype=per_head.dtype, device=per_head.device)
    return (weights * per_head).sum(), per_head


def heads_weight_at(step: int, weight: float, warmup_steps: int, schedule: str = "sine") -> float:
    """Medusa-2's λ(t): rises from 0 to `weight` over `warmup_steps` updates (sine or linear), then stays."""
    if schedule == "constant" or warmup_steps <= 0 or step >= warmup_steps:
        return weight
    fraction = step / warmup_steps
    return weight * (math.sin(math.pi / 2 * fraction) if schedule == "sine" else fraction)


def medusa2_loss(lm_logits, lm_targets, head_logits, head_targets, heads_weight: float, decay: float = 0.8,
                 teacher_logits=None):
    """L_base + λ·Σ_k decay^k L_k. L_base is the LM cross-entropy, or with `teacher_logits` (the base without
    LoRA) KL(teacher ‖ student) per token (self-distillation). Returns (total, [L_base, L_1..L_K])."""
    if teacher_logits is None:
        base_loss = F.cross_entropy(lm_logits.float(), lm_targets)
    else:
        base_loss = F.kl_div(torch.log_softmax(lm_logits.float(), -1), torch.log_softmax(teacher_logits.float(), -1),
                             log_target=True, reduction="batchmean")
    heads_total, per_head = medusa_loss(head_logits, head_targets, decay)
    return base_loss + heads_weight * heads_total, torch.cat([base_loss.detach().reshape(1), per_head.detach()])


@torch.no_grad()
def topk_hits(logits: torch.Tensor, targets: torch.Tensor, ks=(1, 5)) -> torch.Tensor:
    """Counts per head: [K, len(ks) + 1] = hits at each k, then the number of valid targets."""
    valid = targets != IGNORE_INDEX
    top = logits.topk(max(ks), dim=-1).indices  # [K, N, maxk]
    match = (top == targets.unsqueeze(-1)) & valid.unsqueeze(-1)
    counts = [match[..., :k].any(-1).sum(-1) for k in ks] + [valid.sum(-1)]
    return torch.stack(counts, dim=-1).to(torch.float64)


def estimated_tau(top1: list[float]) -> float:
    """Acceptance length of a chain of heads: 1 + Σ_k Π_{j≤k} acc_j (the root token counts as 1)."""
    tau, product = 1.0, 1.0
    for accuracy in top1:
        product *= accuracy
        tau += product
    return tau


# ---- EAGLE -------------------------------------------------------------------------------

def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-row −Σ p·log q: the draft learns the base's whole next-token distribution, not one label."""
    return -(target_probs * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def mix_greedy_target(probs: torch.Tensor, greedy: torch.Tensor, weight: float) -> torch.Tensor:
    """(1 − weight)·probs + weight·one_hot(greedy): a draft used for greedy decoding is accepted when its top
    choice is the base's argmax, so part of the target's mass can be moved there (weight 0: EAGLE's soft CE)."""
    if not weight:
        return probs
    mixed = probs * (1 - weight)
    return mixed.scatter_add(-1, greedy[..., None], torch.full_like(mixed[..., :1], weight))


def unrolled_step_mask(length: int, step: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Additive attention mask [length, (step+1)·length] for draft step `step` of training-time test.

    Keys are laid out step by step (step 0's `length` keys, then step 1's, ...). A query at position t
    of step i drafts from start s = t − i: it sees step 0 (real features) up to s, then the one key
    that each later step j ≤ i produced on the same path, at position s + j — exactly what the draft
    sees when decoding i tokens past the last accepted one.
    """
    t = torch.arange(length, device=device)
    allowed = [t[None, :] <= (t[:, None] - step)]  # step 0 keys
    for j in range(1, step + 1):
        allowed.append(t[None, :] == (t[:, None] - step + j))
    return additive_mask(torch.cat(allowed, dim=1), dtype)


# ---- acceptance-aligned ----------------------------------------------------------------------

def total_variation(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-row 1 − Σ_x min(q(x), p(x)), q = softmax(logits): the probability that lossless speculative sampling
    rejects the draft's token when the base samples from p (train/acceptance.overlap), i.e. the total-variation
    distance TV(p, q). target_probs may hold part of p only (a draft vocabulary's columns): the rest of p's mass
    is a constant the draft cannot reach."""
    return 1 - overlap(torch.softmax(logits.float(), dim=-1), target_probs.float())
