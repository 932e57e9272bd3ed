"""Issue 33, heads and exports: heads on the wrong base are named, a damaged heads folder is one error line, and an
export onto a full disk leaves the files that were there as they were.

The entry points run as a user runs them (subprocesses from the repository root)."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from specheads.heads import EagleConfig, EagleDraft, MedusaConfig, MedusaHeads, load_heads
from specheads.heads.fingerprint import KEY, base_fingerprint

from conftest import snapshot

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def other_base_dir(tmp_path_factory, tiny_llama_dir):
    """The tiny Llama's twin: same sizes and tokenizer, other weights (another seed)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(tiny_llama_dir))
    path = tmp_path_factory.mktemp("other-base")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(path)
    return path


def test_heads_on_another_base_of_the_same_sizes_are_named(tmp_path, tiny_llama_dir, other_base_dir):
    """Heads saved with their base's fingerprint warn, naming both, when loaded with another base of the same sizes
    (they used to load without a word); on their own base, or saved without a fingerprint (older heads), silent."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    other = AutoModelForCausalLM.from_pretrained(other_base_dir)
    assert base_fingerprint(base) == base_fingerprint(base.to(torch.bfloat16).float())  # dtype-independent
    heads = MedusaHeads(MedusaConfig.for_base(base.config, str(tiny_llama_dir), num_heads=2))
    heads.save_pretrained(tmp_path / "medusa", extra={KEY: base_fingerprint(base)})
    draft = EagleDraft(EagleConfig.for_base(base.config, str(tiny_llama_dir), variant="eagle3"))
    draft.save_pretrained(tmp_path / "eagle", extra={KEY: base_fingerprint(base)})
    for folder in ("medusa", "eagle"):
        with pytest.warns(UserWarning, match=rf"{folder} were trained on another base model than .*other-base.*"
                                             rf"{base_fingerprint(other)}.*saved with {base_fingerprint(base)}"):
            load_heads(tmp_path / folder, other)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_heads(tmp_path / folder, base)
    heads.save_pretrained(tmp_path / "old")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_heads(tmp_path / "old", other)

    chat = subprocess.run([sys.executable, "inference/chat.py", "--model", str(other_base_dir), "--heads",
                           str(tmp_path / "medusa"), "--prompt", "hi", "--max-new-tokens", "4", "--tree", "[[0]]"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert "were trained on another base model" in chat.stderr


def test_damaged_heads_folder_is_one_error_line(tmp_path, tiny_llama_dir):
    """A torn config.json (a copy cut short) stops chat.py with one line naming the file; nothing is written."""
    from transformers import AutoConfig

    heads = MedusaHeads(MedusaConfig.for_base(AutoConfig.from_pretrained(tiny_llama_dir), str(tiny_llama_dir)))
    heads.save_pretrained(tmp_path / "heads")
    config = tmp_path / "heads" / "config.json"
    config.write_text(config.read_text()[:40])
    before = snapshot(tmp_path)
    chat = subprocess.run([sys.executable, "inference/chat.py", "--model", str(tiny_llama_dir), "--heads",
                           str(tmp_path / "heads"), "--prompt", "hi"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert chat.returncode != 0 and "Traceback" not in chat.stderr, chat.stderr[-2000:]
    assert f"{config}: not valid JSON" in chat.stderr.strip().splitlines()[-1]
    assert snapshot(tmp_path) == before


def test_export_onto_a_full_disk_leaves_the_old_export_whole(tmp_path):
    """scripts/export.py --overwrite onto a disk that fills up (a 4 KB file-size limit): the export fails with one
    line, the earlier export in --out is byte for byte what it was, and no temporary file is left."""
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, hidden_size=16, vocab_size=64, own_lm_head=True))
    heads.save_pretrained(tmp_path / "heads")
    command = [sys.executable, "scripts/export.py", "--format", "vllm-medusa", "--heads", str(tmp_path / "heads"),
               "--out", str(tmp_path / "out")]
    assert subprocess.run(command, cwd=REPO, capture_output=True, timeout=120).returncode == 0
    before = snapshot(tmp_path / "out")
    with torch.no_grad():
        heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=2, hidden_size=32, vocab_size=256, own_lm_head=True))
    heads.save_pretrained(tmp_path / "heads")  # a larger export now: ~100 KB of weights
    limited = ("import resource, runpy, signal, sys\n"
               "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG\n"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
               "sys.argv = sys.argv[1:]\n"
               "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", limited, *command[1:], "--overwrite"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout
    assert "File too large" in result.stderr, result.stderr[-2000:]
    assert snapshot(tmp_path / "out") == before
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_heads"] == 2
