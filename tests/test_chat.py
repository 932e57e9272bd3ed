"""chat.py driven through stdin, and streaming text with stop strings."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specheads.heads import MedusaConfig, MedusaHeads
from specheads.inference.generate import stream_text

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_heads_dir(tmp_path_factory, tiny_llama_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    heads = MedusaHeads(MedusaConfig.for_base(config, str(tiny_llama_dir), num_heads=2))
    path = tmp_path_factory.mktemp("heads")
    heads.save_pretrained(path, extra={"tree": [[0], [1], [0, 0]]})
    return path


def run_chat(args, stdin):
    return subprocess.run([sys.executable, str(REPO / "inference" / "chat.py"), *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_chat_multi_turn_through_stdin(tiny_llama_dir, tiny_heads_dir):
    result = run_chat(["--model", str(tiny_llama_dir), "--heads", str(tiny_heads_dir), "--max-new-tokens", "8",
                       "--dtype", "fp32"], "Hello there\n/reset\nSecond question\n/quit\nnever read\n")
    assert result.returncode == 0, result.stderr
    stats_lines = [line for line in result.stdout.splitlines() if line.startswith("[") and "tau" in line]
    assert len(stats_lines) == 2 and all("tokens/s" in line for line in stats_lines)
    assert "[conversation cleared]" in result.stdout


def test_chat_prompt_once_and_no_heads(tiny_llama_dir):
    result = run_chat(["--model", str(tiny_llama_dir), "--no-heads", "--prompt", "Hi", "--max-new-tokens", "5",
                       "--dtype", "fp32"], "")
    assert result.returncode == 0, result.stderr
    assert "tau 1.00" in result.stdout


def test_chat_eof_exits_cleanly(tiny_llama_dir, tiny_heads_dir):
    result = run_chat(["--model", str(tiny_llama_dir), "--heads", str(tiny_heads_dir), "--dtype", "fp32"], "")
    assert result.returncode == 0 and "Traceback" not in result.stderr


class CharTokenizer:
    """Token i is the character chr(i); enough to test the text layer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def chunks(text, size=2):
    ids = [ord(c) for c in text]
    return (ids[i:i + size] for i in range(0, len(ids), size))  # a generator, as TreeDecoder.generate gives


def test_stream_text_stops_at_stop_string_without_showing_it():
    pieces = list(stream_text(chunks("Hello END world"), CharTokenizer(), stop_strings=["END"]))
    assert "".join(pieces) == "Hello "
    assert all("E" not in piece for piece in pieces)


def test_stream_text_without_stop_strings_is_the_whole_text():
    assert "".join(stream_text(chunks("abc def", 3), CharTokenizer())) == "abc def"
    # a partial stop-string prefix at the end is shown once the text ends
    assert "".join(stream_text(chunks("abc EN"), CharTokenizer(), ["END"])) == "abc EN"


def test_generate_stops_decoding_at_stop_string(tiny_llama_dir):
    from specheads.inference.generate import SpeculativeGenerator

    generator = SpeculativeGenerator.from_pretrained(str(tiny_llama_dir), dtype="fp32")
    full = generator.answer("Hi", max_new_tokens=30)
    assert len(full) > 4
    stop = full[2:4]
    cut = generator.answer("Hi", max_new_tokens=30, stop_strings=[stop])
    assert cut == full[: full.index(stop)]
    assert torch.is_tensor(generator.decoder.candidates.buffers.depths)


def test_chat_with_an_eagle_draft_answers_like_plain_decoding(tmp_path, tiny_llama_dir):
    from transformers import AutoConfig

    from specheads.heads import EagleConfig, EagleDraft

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny_llama_dir)
    EagleDraft(EagleConfig.for_base(config, str(tiny_llama_dir), variant="eagle3", draft_vocab_size=500)
               ).save_pretrained(tmp_path / "eagle3")
    common = ["--model", str(tiny_llama_dir), "--prompt", "Hi", "--max-new-tokens", "12", "--dtype", "fp32"]
    eagle = run_chat([*common, "--heads", str(tmp_path / "eagle3"), "--tree-tokens", "6"], "")
    plain = run_chat([*common, "--no-heads"], "")
    assert eagle.returncode == 0, eagle.stderr
    assert eagle.stdout.split("\n[")[0] == plain.stdout.split("\n[")[0]


def test_chat_with_prompt_lookup_answers_like_plain_decoding(tiny_llama_dir, tiny_heads_dir):
    common = ["--model", str(tiny_llama_dir), "--prompt", "Hi Hi Hi", "--max-new-tokens", "16", "--dtype", "fp32"]
    plain = run_chat([*common, "--no-heads"], "")
    for extra in (["--heads", str(tiny_heads_dir)], ["--no-heads"]):
        lookup = run_chat([*common, *extra, "--prompt-lookup"], "")
        assert lookup.returncode == 0, lookup.stderr
        assert lookup.stdout.split("\n[")[0] == plain.stdout.split("\n[")[0], extra


def test_make_decoder_with_prompt_lookup_picks_the_sources():
    from transformers import LlamaConfig, LlamaForCausalLM

    from specheads.inference.candidates import FallbackCandidates, PromptLookupCandidates
    from specheads.inference.generate import make_decoder

    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    heads = MedusaHeads(MedusaConfig.for_base(model.config, "tiny", num_heads=2))
    assert isinstance(make_decoder(model, prompt_lookup=True).candidates, PromptLookupCandidates)
    combined = make_decoder(model, heads, [[0], [1], [0, 0]], prompt_lookup=True).candidates
    assert isinstance(combined, FallbackCandidates)
    assert combined.sources[1].sources[0].buffers.num_nodes == 4  # the heads' own tree inside the merge
