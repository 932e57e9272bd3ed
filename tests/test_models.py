"""Model resolution: ids and paths pass through; the built-in GGUF converts once, atomically."""

import json

import pytest

from specheads.data import models


def test_hub_ids_and_paths_pass_through(tmp_path, monkeypatch):
    """A folder as it is; a Hub id the Hub answers for as it is (transformers fetches it); an unreachable Hub is
    tests/test_hub_ids.py's."""
    from specheads.heads import remote

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked = []
    monkeypatch.setattr(remote, "_ask_hub", lambda endpoint, repo, revision: asked.append(repo) or ("0" * 40, ""))
    assert models.resolve_model("lmsys/vicuna-7b-v1.3") == "lmsys/vicuna-7b-v1.3"
    assert asked == ["lmsys/vicuna-7b-v1.3"]
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)


def test_local_path_loads_like_any_model(tiny_llama_dir):
    model = models.load_base_model(str(tiny_llama_dir), "fp32")
    assert model.config.hidden_size == 32 and not model.training


def test_builtin_model_is_converted_once_and_reused():
    first = models.resolve_model("smollm2-135m-instruct")
    assert (models.Path(first) / "model.safetensors").is_file()
    assert models.resolve_model("smollm2-135m-instruct") == first


def tiny_stands_in_for_the_gguf(monkeypatch, tiny_llama_dir):
    """Conversion loads the tiny model instead of de-quantising the real GGUF (~30 s a time): what these tests
    check is the cache folder's life, and test_builtin_model_is_converted_once_and_reused converts the real one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_model, load_tokenizer = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def without_gguf(load):
        def loader(folder, gguf_file, **kwargs):
            assert (models.Path(folder) / gguf_file).is_file()
            return load(str(tiny_llama_dir), **kwargs)
        return loader

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", without_gguf(load_model))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", without_gguf(load_tokenizer))


def test_interrupted_conversion_leaves_no_usable_cache(tmp_path, monkeypatch, tiny_llama_dir):
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path))
    tiny_stands_in_for_the_gguf(monkeypatch, tiny_llama_dir)
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
    tiny_stands_in_for_the_gguf(monkeypatch, tiny_llama_dir)
    sources = models._source_files(models.BUILTIN_MODELS["smollm2-135m-instruct"], "smollm2-135m-instruct")
    stale = tmp_path / "models" / f"smollm2-135m-instruct-{models._cache_key(sources)}"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    path = models.resolve_model("smollm2-135m-instruct")
    assert path == str(stale) and (stale / "model.safetensors").is_file()
    assert json.loads((stale / "config.json").read_text())["hidden_size"] == 32  # rebuilt by the conversion


def test_missing_builtin_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setitem(models.BUILTIN_MODELS, "nothing", models.GGUFModel(
        files=(("no-such-wheel-xyz", "x.gguf"),), upstream_id="x", install_hint="pip install x"))
    with pytest.raises(FileNotFoundError, match="pip install x"):
        models.resolve_model("nothing")


def test_pick_dtype():
    import torch

    assert models.pick_dtype("fp32") is torch.float32
    assert models.pick_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown dtype"):
        models.pick_dtype("int3")


def test_split_gguf_parts_are_joined_in_order_once(monkeypatch, tmp_path):
    """A model split across wheels: the parts are concatenated in the listed order, into the cache, once."""
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path))
    parts = [tmp_path / f"part{i}.bin" for i in range(3)]
    for i, part in enumerate(parts):
        part.write_bytes(bytes([i]) * (1000 + i))
    monkeypatch.setattr(models, "_source_files", lambda spec, name: [(p, f"hash{i}") for i, p in enumerate(parts)])
    spec = models.GGUFModel(files=(("a", "x"), ("b", "y"), ("c", "z")), upstream_id="u", install_hint="h")
    joined = models._gguf_file(spec, "split")
    assert joined.read_bytes() == b"".join(p.read_bytes() for p in parts)
    assert joined.parent == tmp_path / "gguf" and not list(joined.parent.glob("*.partial"))
    before = joined.stat().st_mtime_ns
    assert models._gguf_file(spec, "split") == joined and joined.stat().st_mtime_ns == before  # not rewritten


def test_cache_key_follows_content_not_install_location():
    a = [(models.Path("/venv1/site-packages/m/model.gguf"), "abc")]
    b = [(models.Path("/venv2/lib/m/model.gguf"), "abc")]
    c = [(models.Path("/venv1/site-packages/m/model.gguf"), "abd")]
    assert models._cache_key(a) == models._cache_key(b) != models._cache_key(c)
