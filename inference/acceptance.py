"""Acceptance rules for a verified candidate tree (pure tensor functions).

Every rule sees the tree's node tokens, the base model's scores at every node (what it
predicts *after* that node) and the tree structure, and returns the accepted nodes (a
root-to-node path, root included) plus the bonus token drawn from the last accepted node.

- greedy:   a node is accepted when its token is the argmax after its parent (lossless at T=0);
            lazy_greedy_accept gets the same answer computing the lm_head on one path instead of every node.
- typical:  Medusa's typical acceptance, p(x) > min(ε, δ·exp(−H(p))); fast, not lossless.
- lossless: SpecInfer/EAGLE-style recursive rejection over deterministic (top-k) children, or over children
            sampled from the draft without replacement: the output distribution equals the base model's
            sampling distribution.
- speculative: Leviathan et al.'s min(1, p/q) rule for a chain sampled from a draft distribution q.
"""

from __future__ import annotations

import torch

from .tree import TreeBuffers


def _path_matches(tokens: torch.Tensor, ok_after_parent: torch.Tensor, retrieve: torch.Tensor) -> torch.Tensor:
    """[P, D] bool: whether each node of each root-to-leaf path passes, given a per-node verdict."""
    children = retrieve[:, 1:]
    valid = children >= 0
    return ok_after_parent[children.clamp(min=0)] & valid


def greedy_accept(tokens: torch.Tensor, logits: torch.Tensor, buffers: TreeBuffers):
    """tokens [N], logits [N, V] -> (accepted node indices [a+1], bonus token id)."""
    # the base's choice after each node; argmax over bf16 rows runs ~3x slower on CPU than over their exact fp32 copy
    predicted = logits.float().argmax(dim=-1)
    parent_choice = predicted[buffers.parent.clamp(min=0)]
    ok = tokens == parent_choice
    matches = _path_matches(tokens, ok, buffers.retrieve_indices)
    lengths = matches.int().cumprod(dim=1).sum(dim=1)
    best = int(lengths.argmax())
    accepted = buffers.retrieve_indices[best, : int(lengths[best]) + 1]
    return accepted, int(predicted[accepted[-1]])


def lazy_greedy_accept(tokens: torch.Tensor, hidden: torch.Tensor, lm_head: torch.nn.Linear, buffers: TreeBuffers,
                       children: list[list[int]]):
    """greedy_accept from the base's final hidden states [N, H], projecting to the vocabulary only where needed.

    The full lm_head over every node is ~20% of a tree forward on a small model (N × V logits), yet greedy
    acceptance reads one root-to-leaf path. So: score each node's token after its parent (one row of the
    lm_head per node), follow the best-scoring child from the root to a leaf, and compute full logits for
    that path only. The path is exact wherever its argmax equals the next node's token; at the first node
    where it does not, the argmax is the bonus token, unless it is another child's token (possible only
    through rounding ties), and then every node gets its full logits and greedy_accept decides."""
    token_rows = lm_head.weight[tokens].float()
    scores = (hidden[buffers.parent.clamp(min=0)].float() * token_rows).sum(-1)
    if lm_head.bias is not None:
        scores = scores + lm_head.bias[tokens].float()
    scores, token_list = scores.tolist(), tokens.tolist()
    path = [0]
    while children[path[-1]]:
        path.append(max(children[path[-1]], key=scores.__getitem__))
    predicted = lm_head(hidden[path]).float().argmax(dim=-1).tolist()
    last = 0  # the deepest accepted node of the path
    while last + 1 < len(path) and token_list[path[last + 1]] == predicted[last]:
        last += 1
    bonus = predicted[last]
    if any(token_list[child] == bonus for child in children[path[last]]):
        return greedy_accept(tokens, lm_head(hidden), buffers)
    return torch.tensor(path[: last + 1], device=tokens.device), bonus


def typical_accept(tokens: torch.Tensor, probs: torch.Tensor, buffers: TreeBuffers,
                   epsilon: float = 0.09, delta: float = 0.3):
    """Medusa's typical acceptance over temperature-scaled probs [N, V]; ties go to the likelier path.

    Returns the accepted node indices; the caller draws the bonus token from the last one.
    """
    entropy = -(probs * torch.log(probs.clamp(min=1e-30))).sum(dim=-1)  # [N]
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    parent = buffers.parent.clamp(min=0)
    token_prob = probs[parent, tokens]  # probability of each node's token after its parent
    ok = token_prob > threshold[parent]
    matches = _path_matches(tokens, ok, buffers.retrieve_indices)
    accepted_mask = matches.int().cumprod(dim=1).bool()
    lengths = accepted_mask.sum(dim=1)
    log_p = torch.log(token_prob.clamp(min=1e-30))[buffers.retrieve_indices[:, 1:].clamp(min=0)]
    likelihood = (log_p * accepted_mask).sum(dim=1)
    longest = lengths == lengths.max()
    best = int(torch.where(longest, likelihood, torch.full_like(likelihood, -float("inf"))).argmax())
    return buffers.retrieve_indices[best, : int(lengths[best]) + 1]


def children_lists(buffers: TreeBuffers) -> list[list[int]]:
    """Children of each node, best rank first."""
    children = [[] for _ in range(buffers.num_nodes)]
    for node, parent in enumerate(buffers.parent.tolist()):
        if parent >= 0:
            children[parent].append(node)
    return children


def lossless_accept(tokens: torch.Tensor, probs: torch.Tensor, children: list[list[int]],
                    generator: torch.Generator | None = None, proposals: dict | None = None):
    """Recursive rejection sampling down the tree; returns (accepted node indices, bonus token).

    At a node with target distribution p, its children are tried in order. By default each child proposes its
    token x deterministically (q is a point mass, e.g. a top-k child), so it is accepted with probability p(x);
    on rejection p(x) is set to 0 and p renormalised before the next child.

    proposals: {node: q [V]} for nodes whose children were *sampled* from the draft's distribution q, without
    replacement, in the order of `children` (SampledEagleCandidates). A child x is then accepted with
    probability min(1, p(x)/q(x)); on rejection p becomes norm(max(0, p - q)) and q loses x (renormalised):
    recursive rejection sampling without replacement (Jeon et al. 2024; SpecInfer's multi-round rule with
    replacement). The point-mass rule is its special case q = onehot(x).
    If every child fails, the bonus is drawn from what is left of p. The tokens produced are distributed
    exactly as sampling from p.
    """
    tokens_list = tokens.tolist()
    proposals = proposals or {}
    node, accepted = 0, [0]
    while True:
        p = probs[node].double().clone()
        q = proposals.get(node)
        q = None if q is None else q.to(p.device).double().clone()
        moved = False
        for child in children[node]:
            token = tokens_list[child]
            u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
            if q is None:
                if u * p.sum() < p[token]:
                    node, moved = child, True
                    accepted.append(child)
                    break
                p[token] = 0.0
                continue
            p = p / p.sum()
            if u * q[token] < p[token]:  # u < p(x)/q(x) without dividing
                node, moved = child, True
                accepted.append(child)
                break
            residual = (p - q).clamp(min=0)
            p = residual if residual.sum() > 0 else p  # p == q never rejects; guard rounding only
            q[token] = 0.0
            q = q / q.sum() if q.sum() > 0 else q
        if not moved:
            bonus = int(torch.multinomial(p / p.sum(), 1, generator=generator))
            return torch.tensor(accepted, device=tokens.device), bonus


def speculative_accept(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                       generator: torch.Generator | None = None):
    """Leviathan et al.'s rule for a chain drawn from a draft q: returns (accepted count, bonus token).

    draft_tokens [γ] were sampled from draft_probs [γ, V]; target_probs [γ+1, V] is p at each
    chain position (row i scores the token after i accepted drafts). Token i is kept with
    probability min(1, p(x)/q(x)); at the first rejection the bonus comes from norm(max(0, p − q)),
    and after γ acceptances from p at position γ+1. `lossless_accept` is this rule only when q is a
    point mass (p − q then zeroes p(x)); with a sampled draft it is still exact but accepts less
    (p(x) instead of min(1, p(x)/q(x))).
    """
    tokens = draft_tokens.tolist()
    for i, token in enumerate(tokens):
        p, q = target_probs[i].double(), draft_probs[i].double()
        u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
        if u * q[token] < p[token]:  # u < p/q without dividing by a zero q
            continue
        residual = (p - q).clamp(min=0)
        total = residual.sum()
        residual = residual / total if total > 0 else p  # p == q never rejects; guard rounding only
        return i, int(torch.multinomial(residual, 1, generator=generator))
    p = target_probs[len(tokens)].double()
    return len(tokens), int(torch.multinomial(p / p.sum(), 1, generator=generator))
