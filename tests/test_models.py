"""Model resolution: ids and paths pass through; the built-in GGUF converts once, atomically."""

import pytest

from specheads.data import models


def test_hub_ids_and_paths_pass_through(tmp_path):
    assert models.resolve_model("lmsys/vicuna-7b-v1.3") == "lmsys/vicuna-7b-v1.3"
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)


def test_local_path_loads_like_any_model(tiny_llama_dir):
    model = models.load_base_model(str(tiny_llama_dir), "fp32")
    assert model.config.hidden_size == 32 and not model.training


def test_builtin_model_is_converted_once_and_reused():
    first = models.resolve_model("smollm2-135m-instruct")
    assert (models.Path(first) / "model.safetensors").is_file()
    assert models.resolve_model("smollm2-135m-instruct") == first


def test_interrupted_conversion_leaves_no_usable_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path))
    from transformers import PreTrainedTokenizerBase

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("simulated interruption while writing the tokenizer")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", crash)
    with pytest.raises(KeyboardInterrupt):
        models.resolve_model("smollm2-135m-instruct")
    model_dirs = [p for p in (tmp_path / "models").iterdir() if p.is_dir()]
    assert model_dirs == []  # the half-written copy was removed, never renamed into place

    # A folder without the completion marker (e.g. from a hard kill) is rebuilt, not trusted.
    monkeypatch.undo()
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path))
    gguf = models._gguf_file(models.BUILTIN_MODELS["smollm2-135m-instruct"], "smollm2-135m-instruct")
    stale = tmp_path / "models" / f"smollm2-135m-instruct-{models._cache_key(gguf)}"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    path = models.resolve_model("smollm2-135m-instruct")
    assert path == str(stale) and (stale / "model.safetensors").is_file()


def test_missing_builtin_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setitem(models.BUILTIN_MODELS, "nothing", models.GGUFModel(
        distribution="no-such-wheel-xyz", file_in_distribution="x.gguf", upstream_id="x", install_hint="pip install x"))
    with pytest.raises(FileNotFoundError, match="pip install x"):
        models.resolve_model("nothing")


def test_pick_dtype():
    import torch

    assert models.pick_dtype("fp32") is torch.float32
    assert models.pick_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown dtype"):
        models.pick_dtype("int3")
