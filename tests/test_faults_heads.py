"""Issue 33, heads and exports: heads on the wrong base are named, a damaged heads folder is one error line, and an
export onto a full disk leaves the files that were there as they were.

The entry points run as a user runs them (subprocesses from the repository root)."""

import json
import os
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


# ---- issue 45: exports never over their inputs, mismatched configs, unwritable folders, a full disk -----------

FULL_DISK = ("import resource, runpy, signal, sys\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
             "sys.argv = sys.argv[1:]\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def script(*args, limit: int | None = None) -> subprocess.CompletedProcess:
    """A script run from the repository root as a user runs it (under a file-size limit: a disk that fills up)."""
    command = [sys.executable, *map(str, args)] if limit is None else \
        [sys.executable, "-c", FULL_DISK.format(limit=limit), *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def assert_one_line_refusal(result, *words) -> str:
    assert result.returncode != 0, result.stdout[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert str(word) in last, (word, last)
    return last


@pytest.fixture()
def medusa2_run(tmp_path, tiny_llama_dir):
    """R/heads: Medusa-2 heads with their LoRA adapter inside (heads/adapter), as a medusa2 run leaves them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    heads = MedusaHeads(MedusaConfig.for_base(base.config, str(tiny_llama_dir), num_heads=2))
    run = tmp_path / "run"
    heads.save_pretrained(run / "heads", extra={"adapter": "adapter"})
    get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])).save_pretrained(
        run / "heads" / "adapter")
    return run


def test_export_never_writes_over_above_or_inside_its_input(medusa2_run, tiny_llama_dir):
    """`export.py --format merged --heads R/heads --out R --overwrite` rewrote R/heads/config.json (the adapter
    reference gone: the run could never be merged again); prepare_out_dir only checked that the folders differ.
    An --out that is, holds or lies inside an input (the heads, a local --model) is refused before any work, one
    line naming both."""
    heads = medusa2_run / "heads"
    before = snapshot(medusa2_run, tiny_llama_dir)
    for out, how in ((medusa2_run, f"holds the heads folder {heads}"), (heads, "is the heads folder itself"),
                     (heads / "exported", f"is inside the heads folder {heads}")):
        result = script("scripts/export.py", "--format", "merged", "--heads", heads, "--out", out, "--overwrite")
        assert_one_line_refusal(result, "export.py", f"output folder {out}", how)
        assert snapshot(medusa2_run, tiny_llama_dir) == before
    result = script("scripts/export.py", "--format", "merged", "--heads", heads, "--model", tiny_llama_dir,
                    "--out", tiny_llama_dir / "merged")
    assert_one_line_refusal(result, f"is inside the base model {tiny_llama_dir}")
    assert snapshot(medusa2_run, tiny_llama_dir) == before
    from specheads.heads.export import export
    from specheads.heads.files import OutputPathError

    with pytest.raises(OutputPathError, match="holds the heads folder"):  # the library, not only the command line
        export("merged", heads, medusa2_run, overwrite=True)
    assert snapshot(medusa2_run, tiny_llama_dir) == before


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_export_of_a_config_that_disagrees_with_its_weights(tmp_path, tiny_llama_dir, kind):
    """config.json's hidden_size edited (or copied from another run): one line naming the weights file, the
    tensor and the config (Medusa's was a load_state_dict traceback of size mismatches)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_dir)
    folder = tmp_path / kind
    if kind == "medusa":
        MedusaHeads(MedusaConfig.for_base(config, str(tiny_llama_dir), num_heads=2)).save_pretrained(folder)
    else:
        EagleDraft(EagleConfig.for_base(config, str(tiny_llama_dir), variant="eagle3")).save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "hidden_size": 48}))
    before = snapshot(tmp_path)
    result = script("scripts/export.py", "--format", "vllm-medusa" if kind == "medusa" else "vllm-eagle3",
                    "--heads", folder, "--out", tmp_path / "out", "--model", tiny_llama_dir)
    assert_one_line_refusal(result, "export.py", folder / "model.safetensors", "has shape", "expected" if
                            kind == "eagle3" else f"{folder / 'config.json'} (hidden_size 48")
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_export_to_an_out_that_cannot_be_written(tmp_path):
    """A read-only --out (or one under a file): one line naming it, before any work (it was a PermissionError
    traceback from mkdir)."""
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1, hidden_size=16, vocab_size=64, own_lm_head=True))
    heads.save_pretrained(tmp_path / "heads")
    (tmp_path / "a-file").write_text("x")
    outs = [tmp_path / "a-file" / "out"]
    if os.geteuid() != 0:  # root writes into read-only folders
        (tmp_path / "read-only").mkdir(mode=0o555)
        outs.append(tmp_path / "read-only" / "out")
    before = snapshot(tmp_path)
    for out in outs:
        result = script("scripts/export.py", "--format", "vllm-medusa", "--heads", tmp_path / "heads", "--out", out)
        assert_one_line_refusal(result, "export.py", "cannot be written")
        assert snapshot(tmp_path) == before


def test_tune_eagle_tree_onto_a_full_disk(tmp_path, tiny_llama_dir):
    """tune_eagle_tree.py storing its choice on a disk that fills up: config.json kept whole, one line naming it
    (the message was the raw OSError's, after a traceback)."""
    from transformers import AutoConfig

    draft = tmp_path / "eagle3"
    EagleDraft(EagleConfig.for_base(AutoConfig.from_pretrained(tiny_llama_dir), str(tiny_llama_dir),
                                    variant="eagle3")).save_pretrained(draft)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n")
    before = snapshot(tmp_path)
    size = (draft / "config.json").stat().st_size
    result = script("scripts/tune_eagle_tree.py", "--model", tiny_llama_dir, "--heads", draft, "--questions",
                    questions, "--prompts", "1", "--max-new-tokens", "4", "--shapes", "2,2,3", "--dtype", "fp32",
                    limit=size + 16)  # the old config fits, the one with the measurements does not
    assert_one_line_refusal(result, "tune_eagle_tree.py", draft / "config.json", "File too large", "as it was")
    assert snapshot(tmp_path) == before
    assert not list(draft.glob(".*tmp*"))
