"""The methods registry (inference/methods.py) and the CandidateSource contract (inference/source.py)."""

import ast
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specheads.heads import DFlashConfig, DFlashDraft, EagleConfig, EagleDraft, MedusaConfig, MedusaHeads
from specheads.inference.batched import BatchedTreeDecoder
from specheads.inference.candidates import FallbackCandidates, MergedCandidates, PromptLookupCandidates
from specheads.inference.decoder import TreeDecoder
from specheads.inference.methods import (METHODS, Method, MethodOptions, build_decoder, build_source, method_for,
                                         register)
from specheads.inference.source import CandidateSource

REPO = Path(__file__).resolve().parent.parent
VOCAB = 40


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1)).eval().double()


def drafts_for(model):
    torch.manual_seed(1)
    heads = MedusaHeads(MedusaConfig.for_base(model.config, "tiny", num_heads=2))
    heads.extra_config = {"tree": [[0], [1], [0, 0]]}
    return {None: None, "medusa": heads,
            **{variant: EagleDraft(EagleConfig.for_base(model.config, "tiny", variant=variant))
               for variant in ("eagle1", "eagle3")},
            "dflash": DFlashDraft(DFlashConfig.for_base(model.config, "tiny", block_size=4))}


def test_every_registered_method_builds_from_one_options_object(model):
    drafts, options = drafts_for(model), MethodOptions(draft_layers=1)
    ours = 0
    for name, method in METHODS.items():
        if not method.ours:
            from specheads.inference.methods import Context

            assert isinstance(method.hf(Context(model, None, options)), dict), name
            continue
        source = build_source(name, model, drafts[method.draft], options)
        assert source is None or isinstance(source, CandidateSource), name
        ours += 1
    assert ours >= 10


def test_greedy_output_equals_hf_for_every_method_with_and_without_batching(model):
    """Each of our methods, built by the registry alone, gives the base's own greedy tokens (fp64), single-row and,
    where the method has a batched form, batched."""
    drafts, options = drafts_for(model), MethodOptions(draft_layers=1, gamma=2)
    prompt = torch.tensor([[1, 5, 7, 5, 7, 9, 5, 7]])
    with torch.inference_mode():
        expected = model.generate(prompt, max_new_tokens=14, do_sample=False, temperature=None, top_p=None,
                                  top_k=None, attention_mask=torch.ones_like(prompt))[0, 8:].tolist()
    for name, method in METHODS.items():
        if not method.ours:
            continue
        decoder = build_decoder(name, model, drafts[method.draft], options)
        assert decoder.generate_ids(prompt, 14) == expected, name
        if method.batched:
            batched = build_decoder(name, model, drafts[method.draft], options, batched=True)
            assert batched.generate([prompt[0].tolist()] * 2, 14) == [expected] * 2, name


def test_a_method_refuses_the_wrong_draft_and_a_static_tree_for_eagle(model):
    drafts = drafts_for(model)
    with pytest.raises(ValueError, match="medusa draft, got eagle3"):
        build_source("medusa", model, drafts["eagle3"])
    with pytest.raises(ValueError, match="takes no draft"):
        build_source("pld", model, drafts["medusa"])
    with pytest.raises(ValueError, match="grows its own"):
        build_source("eagle3", model, drafts["eagle3"], MethodOptions(tree=[[0]]))
    with pytest.raises(ValueError, match="unknown method 'warp'"):
        build_source("warp", model)
    with pytest.raises(ValueError, match="no batched decoder"):
        build_decoder("sps", model, batched=True)
    with pytest.raises(ValueError, match="pld_combine"):
        MethodOptions(pld_combine="both")
    with pytest.raises(ValueError, match="twice"):
        register("medusa", "again")


def test_method_for_a_draft_is_what_chat_decodes_with(model):
    drafts = drafts_for(model)
    assert [method_for(drafts[k]) for k in (None, "medusa", "eagle1", "eagle3")] == ["plain", "medusa", "eagle2",
                                                                                    "eagle3"]
    assert [method_for(drafts[k], prompt_lookup=True) for k in (None, "medusa", "eagle3")] == [
        "pld", "medusa_pld", "eagle3_pld"]


def test_capabilities_are_declared_not_probed(model):
    drafts = drafts_for(model)
    sps = build_source("sps", model, options=MethodOptions(draft_layers=1))
    lookahead = build_source("lookahead", model)
    eagle = build_source("eagle3", model, drafts["eagle3"])
    medusa = build_source("medusa", model, drafts["medusa"])
    assert sps.own_acceptance and sps.reads_verify_logits and sps.stateful and not sps.copyable
    assert lookahead.reads_verify_logits and not lookahead.own_acceptance
    assert eagle.stateful and eagle.copyable and eagle.feature_layers and not eagle.reads_verify_logits
    assert not (medusa.stateful or medusa.feature_layers) and medusa.spawn() is medusa
    # combinations inherit what their parts need, and refuse parts with their own rules
    combined = build_source("eagle3_pld", model, drafts["eagle3"])
    assert combined.stateful and combined.copyable and combined.feature_layers == eagle.feature_layers
    row = combined.spawn()
    assert row is not combined and row._feature_source is not combined._feature_source
    assert not FallbackCandidates(PromptLookupCandidates(), medusa).stateful
    for own in (sps, lookahead):
        with pytest.raises(ValueError, match="own acceptance or verify feedback"):
            MergedCandidates(medusa, own)
    with pytest.raises(ValueError, match="at most one feature-level draft"):
        MergedCandidates(eagle, build_source("eagle2", model, drafts["eagle1"]))
    with pytest.raises(ValueError, match="cannot give each row a copy"):
        BatchedTreeDecoder(model, candidates=lookahead)
    # the decoder keeps every node's logits for a source that reads them (no lazy lm_head)
    assert TreeDecoder(model, candidates=lookahead)._lazy_lm_head is None
    assert TreeDecoder(model, candidates=medusa)._lazy_lm_head is not None


def test_no_capability_probing_in_inference():
    """Sources declare what they are (source.CandidateSource); nothing in inference/ asks with hasattr."""
    offenders = []
    for path in sorted((REPO / "inference").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_chat_and_bench_share_the_method_flags():
    from specheads.inference import bench, chat

    for parse in (chat.parse_args, bench.parse_args):
        new = parse(["--eagle-top-k", "4", "--pld-tokens", "7"])
        old = parse(["--tree-top-k", "4", "--pld-tokens", "7"])  # chat's former name stays an alias
        assert new.eagle_top_k == old.eagle_top_k == 4 and new.pld_tokens == 7


def test_a_registered_method_runs_in_the_bench(tmp_path, monkeypatch, tiny_llama_dir):
    """Adding a method is one registration: the bench takes it by name, next to the built-in ones."""
    from specheads.inference import bench

    monkeypatch.setitem(METHODS, "pld_short", Method(
        "pld_short", "prompt lookup with 3-token chains", batched=True,
        source=lambda ctx: PromptLookupCandidates(3, 3, ctx.device)))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Say hi hi hi"]}) + "\n")
    results = bench.main(["--model", str(tiny_llama_dir), "--questions", str(questions), "--methods",
                          "baseline,pld_short", "--max-new-tokens", "10", "--dtype", "fp64", "--out",
                          str(tmp_path / "bench")])
    assert results["methods"]["pld_short"]["overall"]["greedy_match"] == 1.0
