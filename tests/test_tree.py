"""Tree buffers of hand-checked small trees, validation errors, trees from accuracies."""

import pytest
import torch

from specheads.inference.tree import (TreeError, build_tree_buffers, chain_tree, expected_tau,
                                      tree_from_accuracies, validate_tree)


def test_buffers_of_a_small_tree_by_hand():
    #        root(0)
    #       /       \
    #   (0,)=1     (1,)=2
    #    /   \
    # (0,0)=3 (0,1)=4
    buffers = build_tree_buffers([(0, 1), (1,), (0,), (0, 0)], num_heads=2, top_k=3)
    assert buffers.paths == [(0,), (1,), (0, 0), (0, 1)]
    assert buffers.depths.tolist() == [0, 1, 1, 2, 2]
    # flat candidates: [root, h1 r0, h1 r1, h1 r2, h2 r0, h2 r1, h2 r2]
    assert buffers.candidate_index.tolist() == [0, 1, 2, 4, 5]
    assert buffers.parent.tolist() == [-1, 0, 0, 1, 1]
    assert buffers.attention_mask.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    assert buffers.retrieve_indices.tolist() == [[0, 2, -1], [0, 1, 3], [0, 1, 4]]


def test_chain_buffers():
    buffers = build_tree_buffers(chain_tree(3), num_heads=3, top_k=1)
    assert buffers.attention_mask.equal(torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert buffers.candidate_index.tolist() == [0, 1, 2, 3]
    assert buffers.retrieve_indices.tolist() == [[0, 1, 2, 3]]


def test_root_only_tree():
    buffers = build_tree_buffers([], num_heads=2, top_k=2)
    assert buffers.num_nodes == 1 and buffers.retrieve_indices.tolist() == [[0]]


@pytest.mark.parametrize("paths, message", [
    ([(0,), (0, 0), (0, 0, 0)], "depth 3 but there are only 2 heads"),
    ([(0,), (0,)], "duplicate path"),
    ([(0,), (1, 0)], "orphan"),
    ([(0,), (3,)], "rank 3 but candidates are top-3"),
    ([()], "empty path"),
    ([(0, -1)], "non-negative"),
])
def test_bad_trees_are_rejected(paths, message):
    with pytest.raises(TreeError, match=message):
        validate_tree(paths, num_heads=2, top_k=3)


def test_tree_from_accuracies_is_best_first_and_closed():
    accuracy = [[0.6, 0.2, 0.1], [0.4, 0.2, 0.1]]
    tree = tree_from_accuracies(accuracy, num_nodes=4)
    # probabilities: (0,)=.6 (0,0)=.24 (1,)=.2 (0,1)=.12 (2,)=.1 ...
    assert tree == [(0,), (1,), (0, 0), (0, 1)]
    assert expected_tau(tree, accuracy) == pytest.approx(1 + 0.6 + 0.2 + 0.24 + 0.12)
    big = tree_from_accuracies(accuracy, num_nodes=12)
    assert len(big) == 12 and validate_tree(big, 2, 3) == big


def test_path_frequencies_and_tree_by_hand():
    from specheads.inference.tree import path_frequencies, tree_from_path_frequencies

    ranks = torch.tensor([[0, 0, 1], [0, 0, -1], [0, 1, 0], [1, -1, 0], [-1, 0, 0]])
    freq = path_frequencies(ranks, max_rank=2)
    assert freq[(0,)] == pytest.approx(3 / 5) and freq[(0, 0)] == pytest.approx(2 / 5)
    assert freq[(0, 0, 1)] == pytest.approx(1 / 5) and freq[(1,)] == pytest.approx(1 / 5)
    assert (1, 0) not in freq  # rank beyond the top-k (or absent) ends the path: nothing under it counts
    tree = tree_from_path_frequencies(freq, num_nodes=3)
    # (0,)=.6, (0,0)=.4, then a three-way tie at .2 broken towards the shallowest path
    assert tree == [(0,), (1,), (0, 0)]
    validate_tree(tree, num_heads=3, top_k=2)
