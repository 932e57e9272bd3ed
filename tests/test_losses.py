"""Shifted targets, the weighted Medusa loss and accuracy counts on hand-made tensors."""

import math

import torch

from specheads.train.losses import (chunked_medusa_loss, estimated_tau, medusa_loss, mix_greedy_target,
                                    select_trained_positions, shifted_targets, topk_hits)

I = -100


def test_shifted_targets_by_hand():
    labels = torch.tensor([[I, I, 10, 11, 12, 13]])
    targets = shifted_targets(labels, num_heads=2)
    # head 1 at t predicts t+2, head 2 predicts t+3
    assert targets[0].tolist() == [[10, 11, 12, 13, I, I]]
    assert targets[1].tolist() == [[11, 12, 13, I, I, I]]


def test_select_positions_keeps_only_positions_with_targets():
    labels = torch.tensor([[I, I, I, I, 7, 8]])
    hidden = torch.arange(6.0).view(1, 6, 1)
    kept, targets = select_trained_positions(hidden, labels, num_heads=2)
    assert kept.view(-1).tolist() == [1.0, 2.0, 3.0]  # t+2 or t+3 lands on a label
    assert targets.tolist() == [[I, 7, 8], [7, 8, I]]


def test_medusa_loss_weights_and_ignore():
    vocab = 5
    logits = torch.zeros(2, 3, vocab)
    targets = torch.tensor([[1, 2, I], [I, I, I]])
    total, per_head = medusa_loss(logits, targets, decay=0.8)
    assert math.isclose(per_head[0].item(), math.log(vocab), rel_tol=1e-6)
    assert per_head[1].item() == 0.0  # no targets: no loss, no NaN
    assert math.isclose(total.item(), 0.8 * math.log(vocab), rel_tol=1e-6)


def test_topk_hits_by_hand():
    logits = torch.tensor([[[5.0, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]]])  # one head, two positions
    targets = torch.tensor([[1, 5]])
    counts = topk_hits(logits, targets, ks=(1, 2))
    assert counts.tolist() == [[1.0, 2.0, 2.0]]  # pos 0: rank 2, pos 1: rank 1


def test_estimated_tau():
    assert estimated_tau([]) == 1.0
    assert math.isclose(estimated_tau([0.5, 0.5]), 1 + 0.5 + 0.25)


def test_loss_falls_when_training_heads():
    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    lm_head = torch.nn.Linear(8, 20, bias=False)
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, hidden_size=8, vocab_size=20))
    hidden = torch.randn(16, 8)
    targets = torch.randint(0, 20, (2, 16))
    optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-2)
    first = None
    for _ in range(50):
        loss, _ = medusa_loss(heads(hidden, lm_head), targets)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.85 * first


def test_chunked_loss_equals_whole_loss_values_and_gradients():
    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    for own_lm_head in (False, True):
        heads = MedusaHeads(MedusaConfig(num_heads=3, hidden_size=8, vocab_size=50, own_lm_head=own_lm_head))
        for p in heads.parameters():
            torch.nn.init.normal_(p, std=0.3)
        lm_head = torch.nn.Linear(8, 50, bias=False)
        hidden = torch.randn(37, 8)
        targets = torch.randint(0, 50, (3, 37))
        targets[2, 30:] = -100  # the last head has no target near the end
        whole, whole_parts = medusa_loss(heads(hidden, lm_head), targets, 0.8)
        whole_grads = torch.autograd.grad(whole, list(heads.parameters()))
        chunked, parts = chunked_medusa_loss(heads(hidden, lm_head, project=False), lambda x: heads.project(x, lm_head),
                                             targets, 0.8, chunk=10)
        grads = torch.autograd.grad(chunked, list(heads.parameters()))
        torch.testing.assert_close(chunked, whole)
        torch.testing.assert_close(parts, whole_parts)
        for got, expected in zip(grads, whole_grads):
            torch.testing.assert_close(got, expected)


def test_mix_greedy_target_by_hand():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    greedy = torch.tensor([0, 1])
    mixed = mix_greedy_target(probs, greedy, 0.5)
    assert torch.allclose(mixed, torch.tensor([[0.75, 0.15, 0.1], [0.05, 0.8, 0.15]]))
    assert mix_greedy_target(probs, greedy, 0.0) is probs
    assert torch.equal(mix_greedy_target(probs, greedy, 1.0), torch.eye(3)[:2])
