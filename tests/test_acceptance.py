"""Rollout acceptance in the held-out evaluation (train/acceptance.py), the total-variation loss, train.best_by."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from conftest import KILL_IN_NTH_SAVE, synthetic_sharegpt, tiny_train_config, write_jsonl
from specheads.data.tokenization import IGNORE_INDEX
from specheads.train.acceptance import acceptance_result, chain_counts, chain_starts
from specheads.train.losses import total_variation, unrolled_step_mask

REPO = Path(__file__).resolve().parent.parent


# ---- the shared math -----------------------------------------------------------------------------

def test_a_draft_equal_to_the_base_is_always_accepted_and_a_random_one_less():
    torch.manual_seed(0)
    base = torch.randn(3, 50, 40) * 3
    oracle = acceptance_result(chain_counts(base.clone(), base), 3)
    assert oracle["accept_t0"] == [1.0, 1.0, 1.0] and oracle["accept_t1"] == pytest.approx([1.0, 1.0, 1.0])
    assert oracle["tau_t0"] == 4.0 and oracle["tau_t1"] == pytest.approx(4.0) and oracle["accept_positions"] == 50
    random = acceptance_result(chain_counts(torch.randn(3, 50, 40) * 3, base), 3)
    assert random["tau_t0"] < 1.5 and random["tau_t1"] < 3.0
    assert random["accept_t1"] == sorted(random["accept_t1"], reverse=True)  # a chain only shortens


def test_chain_counts_by_hand_with_a_draft_vocabulary():
    # two steps, one chain; the draft knows base tokens 2 and 0 (draft ids 0, 1)
    base = torch.log(torch.tensor([[[0.5, 0.1, 0.4]], [[0.2, 0.2, 0.6]]]))
    draft = torch.log(torch.tensor([[[0.5, 0.5]], [[0.9, 0.1]]]))
    counts = chain_counts(draft, base, torch.tensor([2, 0])).tolist()
    # T=0: step 1 proposes token 2 (tie: first index) but the base's argmax is 0 -> 0, 0
    # T=1: step 1 Σ min = min(.5,.4) + min(.5,.5) = .9; step 2 min(.9,.6) + min(.1,.2) = .7 -> .9, .63
    assert counts == pytest.approx([0, 0, 0.9, 0.63, 1])


def test_chain_starts_need_every_drafted_token_in_the_answer():
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 5, 6, 7, 8, IGNORE_INDEX]])
    # k=2: from t the drafts are x_{t+2}, x_{t+3}: t=0 (x2, x3), t=1 (x3, x4), t=2 (x4, x5)
    assert chain_starts(labels, 2)[0].tolist() == [True, True, True, False, False, False, False]


def test_total_variation_is_one_minus_the_expected_acceptance_and_trains():
    logits = torch.zeros(1, 2, requires_grad=True)  # q = (0.5, 0.5)
    p = torch.tensor([[0.8, 0.2]])
    loss = total_variation(logits, p)
    assert loss.item() == pytest.approx(1 - (0.5 + 0.2))  # = 0.3 = ½ Σ|p − q|
    loss.sum().backward()
    assert logits.grad is not None and logits.grad[0, 0] < 0 < logits.grad[0, 1]  # toward the base


@pytest.mark.parametrize("override, field", [("heads.loss=kl", "heads.loss"), ("heads.tv_weight=-1", "heads.tv_weight"),
                                             ("train.best_by=tau", "train.best_by"),
                                             ("train.accept_positions=-1", "train.accept_positions")])
def test_a_bad_loss_or_best_by_is_refused_naming_the_field(override, field):
    from specheads.train.config import ConfigError, load_config
    from specheads.train.medusa import MedusaTrainConfig

    with pytest.raises(ConfigError, match=field):
        load_config(MedusaTrainConfig, None, [override])


def test_a_bad_eagle_loss_and_best_by_without_rollout_are_refused():
    from specheads.train.config import ConfigError, load_config
    from specheads.train.eagle import EagleTrainConfig

    with pytest.raises(ConfigError, match="eagle.loss"):
        load_config(EagleTrainConfig, None, ["eagle.loss=ce+kl"])
    with pytest.raises(ConfigError, match="train.accept_positions"):
        load_config(EagleTrainConfig, None, ["train.best_by=tau_t1", "train.accept_positions=0"])


# ---- the tasks' rollouts -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_base(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32).eval()


def test_medusa_rollout_compares_each_head_with_the_base_where_it_drafts(tiny_base):
    """Heads that answer what the base itself predicts there (an oracle) are always accepted, which holds only
    if head k at t is scored against the base's argmax after x_{t+k+1}, not the answer's label."""
    from specheads.heads import MedusaConfig, MedusaHeads
    from specheads.train.medusa import rollout_counts

    torch.manual_seed(1)
    ids = torch.randint(0, 200, (2, 24))
    labels = ids.clone()
    labels[:, :5] = IGNORE_INDEX
    states = tiny_base.get_decoder()(input_ids=ids).last_hidden_state
    lm_head = tiny_base.get_output_embeddings()
    heads = MedusaHeads(MedusaConfig.for_base(tiny_base.config, "tiny", num_heads=3))
    starts = chain_starts(labels, 3)
    future = {tuple(states[b, t].tolist()): [states[b, t + i + 1] for i in range(3)]
              for b, t in starts.nonzero().tolist()}

    def oracle(hidden, head_lm):
        return torch.stack([head_lm(torch.stack([future[tuple(row.tolist())][i] for row in hidden]))
                            for i in range(3)])

    with torch.no_grad():
        exact = acceptance_result(rollout_counts(oracle, heads, states, labels, lm_head), 3)
        trained = acceptance_result(rollout_counts(heads, heads, states, labels, lm_head), 3)
    assert exact["accept_t0"] == [1.0, 1.0, 1.0] and exact["tau_t1"] == pytest.approx(4.0)
    assert exact["accept_positions"] == int(starts.sum()) > 0
    assert trained["tau_t0"] < 4.0 and trained["tau_t1"] < 4.0  # identity blocks: the base's own next token


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_eagle_rollout_feeds_the_draft_its_own_features_and_tokens(tiny_base, variant):
    """Step i of the rollout equals the draft run as the chain decoder runs it: prefix from the base, then its own
    output feature and its own proposed token; it differs from the teacher-forced training unroll."""
    from specheads.heads.eagle import EagleConfig, EagleDraft
    from specheads.train.eagle import rollout, unrolled_draft

    torch.manual_seed(2)
    config = EagleConfig.for_base(tiny_base.config, "tiny", variant=variant, draft_vocab_size=300,
                                  aux_layer_ids=[0, 1, 1] if variant == "eagle3" else None)
    draft = EagleDraft(config).eval()
    if variant == "eagle3":
        draft.set_vocab_mapping(torch.randperm(tiny_base.config.vocab_size)[:300].sort().values)
    for p in draft.parameters():  # a draft far from identity, so its tokens are not the answer's
        torch.nn.init.normal_(p, std=0.3)
    ids = torch.randint(0, 300, (1, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    with torch.no_grad():
        out = tiny_base.get_decoder()(input_ids=ids, output_hidden_states=True)
        last = out.last_hidden_state
        inputs = torch.stack([out.hidden_states[i] for i in config.feature_layers]) if variant == "eagle3" else \
            last.new_zeros((0, *last.shape))
        steps, t = 3, 6
        rolled = rollout(draft, tiny_base, batch, inputs, last, steps)
        # the chain decoder from position t: the prefix f_0..f_t with x_1..x_{t+1}, then its own feature and token
        embed, lm_head = tiny_base.get_input_embeddings(), tiny_base.get_output_embeddings()
        selected = [last[:, :t + 1]] if variant == "eagle1" else list(inputs[:, :, :t + 1])
        cache = DynamicCache()
        feature = draft(draft.fuse(selected), embed(ids[:, 1:t + 2]), torch.arange(t + 1)[None],
                        unrolled_step_mask(t + 1, 0)[None, None], cache)[:, -1:]
        for i in range(steps):
            torch.testing.assert_close(rolled[i][:, t + i], feature[:, 0], rtol=1e-4, atol=1e-5)
            token = draft.draft_to_target(draft.logits(feature, lm_head).argmax(-1))
            feature = draft(feature, embed(token), torch.tensor([[t + 1 + i]]), None, cache)
        teacher, _, _ = unrolled_draft(draft, tiny_base, batch, inputs, last, steps)
    # the training unroll feeds the answer's tokens: from step 2 on it is not what decoding drafts
    trained = [o for o in teacher[1]]
    assert not any(torch.allclose(row, rolled[1][0, t + 1], atol=1e-4) for row in trained)


# ---- in a training run ------------------------------------------------------------------------------

def train(config, *extra, patch=None):
    args = ["--config", str(config), *map(str, extra)]
    code = (patch or "") + f"\nimport sys, specheads.train.medusa as m\nsys.exit(m.main({args!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)


def scalars(run: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for events in (run / "logs").rglob("events.out.tfevents*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            found.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    return found


@pytest.fixture()
def best_config(tmp_path, tiny_llama_dir):
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(40))
    config = tmp_path / "tiny.yaml"
    text = tiny_train_config(tiny_llama_dir, data, tmp_path / "run", max_steps=6)
    text = text.replace("  save_every: 2\n", "  save_every: 2\n  eval_every: 2\n  keep_checkpoints: 0\n"
                        "  best_by: tau_t0\n  accept_positions: 64\n")
    config.write_text(text)
    return config


def test_best_by_keeps_the_best_evaluations_heads_logs_acceptance_and_survives_a_resume(best_config, tmp_path):
    reference = train(best_config, f"train.output_dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stdout + reference.stderr
    run = tmp_path / "reference"
    logged = scalars(run)
    for name in ("accept_t0/pos1", "accept_t0/pos3", "accept_t1/pos2", "accept_t0/tau", "accept_t1/tau"):
        assert sorted(logged[name]) == [2, 4, 6], name
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["tau_t0"] == pytest.approx(logged["accept_t0/tau"][6])
    assert len(evaluation["accept_t1"]) == 3 and evaluation["accept_positions"] > 0
    taus = logged["accept_t0/tau"]
    best_step = max(sorted(taus), key=lambda s: (taus[s], -s))  # the first evaluation with the highest τ
    assert evaluation["best"]["step"] == best_step and evaluation["best"]["by"] == "tau_t0"
    assert evaluation["best"]["value"] == pytest.approx(taus[best_step])
    best = load_file(str(run / "heads-best" / "model.safetensors"))
    at_best = load_file(str(run / "checkpoints" / f"step-{best_step:06d}" / "heads" / "model.safetensors"))
    assert best.keys() == at_best.keys() and all(torch.equal(best[k], at_best[k]) for k in best)
    assert json.loads((run / "heads-best" / "config.json").read_text())["best"]["step"] == best_step
    state = json.loads((run / "checkpoints" / "step-000006" / "trainer_state.json").read_text())
    assert state["best"]["step"] == best_step
    history = evaluations(run)
    assert [r["step"] for r in history] == [2, 4, 6]
    assert [r["tau_t0"] for r in history] == pytest.approx([taus[s] for s in (2, 4, 6)])
    seconds = [r["train_seconds"] for r in history]
    assert 0 < seconds[0] < seconds[1] < seconds[2] and state["train_seconds"] == pytest.approx(seconds[2], abs=0.1)

    # killed in the step-4 checkpoint, resumed from step 2: the same best, the same heads-best
    interrupted = tmp_path / "interrupted"
    killed = train(best_config, f"train.output_dir={interrupted}", patch=KILL_IN_NTH_SAVE.format(n=3))
    assert killed.returncode == -9
    resumed = train(best_config, f"train.output_dir={interrupted}", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    again = json.loads((interrupted / "eval.json").read_text())
    assert again["best"]["step"] == best_step and again["best"]["value"] == pytest.approx(evaluation["best"]["value"])
    kept = load_file(str(interrupted / "heads-best" / "model.safetensors"))
    assert all(torch.allclose(kept[k], best[k], rtol=1e-5, atol=1e-6) for k in best)
    # the evaluation at update 4 ran twice (before the kill and after the resume): recorded once; the resumed run's
    # training time continues from its checkpoint's
    history = evaluations(interrupted)
    assert [r["step"] for r in history] == [2, 4, 6]
    assert 0 < history[0]["train_seconds"] < history[1]["train_seconds"] < history[2]["train_seconds"]


def evaluations(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "evaluations.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", ["tv", "ce+tv"])
def test_medusa_tv_loss_is_each_heads_rejection_probability_where_it_drafts(tiny_base, tiny_llama_dir, loss):
    from specheads.heads import MedusaConfig, MedusaHeads
    from specheads.train.config import load_config
    from specheads.train.losses import medusa_loss, select_trained_positions
    from specheads.train.medusa import MedusaTask, MedusaTrainConfig

    cfg = load_config(MedusaTrainConfig, None, [f"model.name={tiny_llama_dir}", "heads.num_heads=2",
                                                f"heads.loss={loss}", "heads.tv_weight=0.5"])
    task = MedusaTask(cfg)
    torch.manual_seed(3)
    heads = MedusaHeads(MedusaConfig.for_base(tiny_base.config, "tiny", num_heads=2))
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ids = torch.randint(0, 200, (2, 12))
    labels = ids.clone()
    labels[:, :4] = IGNORE_INDEX
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    total, per_head = task.loss(heads, tiny_base, batch, [0, 1], 0)
    total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in heads.parameters() if p.requires_grad)
    with torch.no_grad():
        states = tiny_base.get_decoder()(input_ids=ids).last_hidden_state
        lm_head = tiny_base.get_output_embeddings()
        expected = []
        for k in range(2):  # head k+1 at t drafts x_{t+k+2}: the base's softmax from its state at t+k+1
            rows = [(b, t) for b in range(2) for t in range(12 - k - 2) if labels[b, t + k + 2] != IGNORE_INDEX]
            q = torch.softmax(torch.stack([heads(states[b, t], lm_head)[k] for b, t in rows]), -1)
            p = torch.softmax(torch.stack([lm_head(states[b, t + k + 1]) for b, t in rows]), -1)
            expected.append((1 - torch.minimum(p, q).sum(-1)).mean())
        expected = torch.stack(expected)
        if loss == "ce+tv":
            hidden, targets = select_trained_positions(states, labels, 2)
            expected = medusa_loss(heads(hidden, lm_head), targets, 0.8)[1] + 0.5 * expected
    torch.testing.assert_close(per_head.detach(), expected, rtol=1e-4, atol=1e-5)
    assert total.item() == pytest.approx(0.8 * expected[0].item() + 0.64 * expected[1].item(), rel=1e-4)


def test_eagle_ce_plus_tv_is_the_sum_of_its_parts_and_trains(tiny_base, tiny_llama_dir):
    from specheads.heads.eagle import EagleConfig, EagleDraft
    from specheads.train.config import load_config
    from specheads.train.eagle import EagleTask, EagleTrainConfig

    torch.manual_seed(4)
    draft = EagleDraft(EagleConfig.for_base(tiny_base.config, "tiny", variant="eagle1"))
    ids = torch.randint(0, 200, (2, 12))
    labels = ids.clone()
    labels[:, :3] = IGNORE_INDEX
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    per_step = {}
    for loss in ("ce", "tv", "ce+tv"):
        cfg = load_config(EagleTrainConfig, None, [f"model.name={tiny_llama_dir}", "eagle.variant=eagle1",
                                                   "eagle.ttt_steps=2", "eagle.cache_features=false",
                                                   f"eagle.loss={loss}", "eagle.tv_weight=2.0"])
        draft.zero_grad()
        total, per_step[loss] = EagleTask(cfg).loss(draft, tiny_base, batch, [0, 1], 0)
        total.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in draft.parameters())
    assert all(0 <= v <= 1 for v in per_step["tv"].tolist())
    torch.testing.assert_close(per_step["ce+tv"], per_step["ce"] + 2.0 * per_step["tv"])
