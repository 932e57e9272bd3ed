"""scripts/bench.py end to end on a tiny model: every method, one process, all outputs written."""

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def heads_dir(tmp_path, tiny_llama_dir):
    from transformers import AutoConfig

    from specheads.heads import MedusaConfig, MedusaHeads

    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_base(AutoConfig.from_pretrained(tiny_llama_dir), str(tiny_llama_dir),
                                              num_heads=2))
    heads.save_pretrained(tmp_path / "heads", extra={"tree": [[0], [1], [0, 0]]})
    return tmp_path / "heads"


def test_bench_writes_results_for_every_method(tmp_path, tiny_llama_dir, heads_dir):
    from specheads.inference import bench

    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello", "And then?"]}) + "\n"
        + json.dumps({"question_id": "b", "category": "code", "turns": ["Write code"]}) + "\n")
    out = tmp_path / "bench"
    results = bench.main(["--model", str(tiny_llama_dir), "--heads", str(heads_dir), "--questions", str(questions),
                          "--methods", "baseline,hf_unpacked,prompt_lookup,plain,pld,medusa,medusa_pld", "--max-new-tokens",
                          "12", "--dtype", "fp64", "--out", str(out)])
    assert set(results["methods"]) == {"baseline", "hf_unpacked", "prompt_lookup", "plain", "pld", "medusa", "medusa_pld"}
    for name, method in results["methods"].items():
        assert set(method["per_category"]) == {"qa", "code"}
        overall = method["overall"]
        assert overall["tokens_per_s"] > 0 and overall["tau"] >= 1.0
        assert "speedup" in overall
        if name != "baseline":
            assert "greedy_match" in overall
            spread = overall["speedup_per_question"]  # single questions' speedups around the mean
            assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    # lossless in fp64: our decoders give HF greedy's tokens
    assert results["methods"]["plain"]["overall"]["greedy_match"] == 1.0
    assert results["methods"]["hf_unpacked"]["overall"]["greedy_match"] == 1.0
    assert results["methods"]["medusa"]["overall"]["greedy_match"] == 1.0
    assert results["methods"]["pld"]["overall"]["greedy_match"] == 1.0
    assert results["methods"]["medusa_pld"]["overall"]["greedy_match"] == 1.0
    assert results["methods"]["plain"]["overall"]["tau"] == pytest.approx(1.0)
    assert "step_overhead" in results["methods"]["medusa"]["overall"]
    assert results["accepted_length_histogram"]["medusa"]
    for name in ("results.json", "results.md", "results.png"):
        assert (out / name).stat().st_size > 0
    assert "| medusa |" in (out / "results.md").read_text()
    assert "Against `hf_unpacked`" in (out / "results.md").read_text()


def test_questions_skip_and_limit(tmp_path):
    from specheads.inference import bench

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": str(i), "category": "qa", "turns": ["hi"]}) + "\n"
                            for i in range(5)))
    assert [q["question_id"] for q in bench.load_questions(path, limit=2, skip=3)] == ["3", "4"]
    assert [q["question_id"] for q in bench.load_questions(path, limit=2)] == ["0", "1"]
    with pytest.raises(ValueError, match="skip-questions 5"):
        bench.load_questions(path, skip=5)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"question_id": str(i), "category": "coding" if i % 2 else "qa",
                                         "turns": ["hi"]}) + "\n" for i in range(6)))
    assert [q["question_id"] for q in bench.load_questions(mixed, limit=2, categories=["coding"])] == ["1", "3"]
    with pytest.raises(ValueError, match="no question of category 'math' \\(it has coding, qa\\)"):
        bench.load_questions(mixed, categories=["coding", "math"])


def test_bench_rejects_unknown_method(tmp_path):
    from specheads.inference import bench

    with pytest.raises(SystemExit, match="unknown method"):
        bench.main(["--methods", "baseline,warp", "--out", str(tmp_path)])


def test_bench_eagle_methods_are_lossless(tmp_path, tiny_llama_dir):
    from specheads.inference import bench
    from transformers import AutoConfig

    from specheads.heads import EagleConfig, EagleDraft

    base_config = AutoConfig.from_pretrained(tiny_llama_dir)
    folders = []
    for variant in ("eagle1", "eagle3"):
        torch.manual_seed(0)
        draft = EagleDraft(EagleConfig.for_base(base_config, str(tiny_llama_dir), variant=variant,
                                                draft_vocab_size=1000))
        draft.save_pretrained(tmp_path / variant)
        folders.append(str(tmp_path / variant))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello", "More"]}) + "\n")
    results = bench.main(["--model", str(tiny_llama_dir), "--eagle-heads", ",".join(folders), "--questions",
                          str(questions), "--methods", "baseline,eagle2,eagle3,eagle3_pld", "--max-new-tokens", "10",
                          "--eagle-tokens", "6", "--eagle-min-prob", "0.001", "--dtype", "fp64",
                          "--out", str(tmp_path / "bench")])
    for method in ("eagle2", "eagle3", "eagle3_pld"):
        assert results["methods"][method]["overall"]["greedy_match"] == 1.0
    with pytest.raises(SystemExit, match="eagle3"):
        bench.main(["--model", str(tiny_llama_dir), "--eagle-heads", folders[0], "--questions", str(questions),
                    "--methods", "eagle3", "--out", str(tmp_path / "b2")])
    # batch mode: the same drafts, three first turns two at a time
    with questions.open("a") as f:
        for i, turn in enumerate(["Count to five.", "Say yes yes yes."]):
            f.write(json.dumps({"question_id": f"b{i}", "category": "qa", "turns": [turn]}) + "\n")
    results = bench.main(["--model", str(tiny_llama_dir), "--eagle-heads", ",".join(folders), "--questions",
                          str(questions), "--methods", "baseline,eagle2,eagle3,eagle3_pld", "--batch-size", "2",
                          "--max-new-tokens", "10", "--eagle-tokens", "6", "--dtype", "fp64",
                          "--out", str(tmp_path / "batched")])
    assert results["questions"] == 3 and results["pld_combine"] == "by-match"
    for method in ("eagle2", "eagle3", "eagle3_pld"):
        assert results["methods"][method]["overall"]["greedy_match"] == 1.0, method


def test_bench_takes_a_dflash_drafter_beside_an_eagle_draft(tmp_path, tiny_llama_dir):
    """--drafts: a DFlash folder and an EAGLE-3 one in one run, each method given its own kind; lossless in fp64;
    Medusa heads there are refused by name."""
    from specheads.inference import bench
    from transformers import AutoConfig

    from specheads.heads import DFlashConfig, DFlashDraft, EagleConfig, EagleDraft, MedusaConfig, MedusaHeads

    base_config = AutoConfig.from_pretrained(tiny_llama_dir)
    torch.manual_seed(0)
    DFlashDraft(DFlashConfig.for_base(base_config, str(tiny_llama_dir), block_size=4, num_layers=1,
                                      target_layer_ids=[0])).save_pretrained(tmp_path / "dflash")
    EagleDraft(EagleConfig.for_base(base_config, str(tiny_llama_dir), variant="eagle3",
                                    draft_vocab_size=1000)).save_pretrained(tmp_path / "eagle3")
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello", "More"]}) + "\n")
    drafts = f"{tmp_path / 'dflash'},{tmp_path / 'eagle3'}"
    results = bench.main(["--model", str(tiny_llama_dir), "--drafts", drafts, "--questions", str(questions),
                          "--methods", "baseline,dflash,dflash_pld,eagle3", "--max-new-tokens", "10",
                          "--eagle-tokens", "6", "--dtype", "fp64", "--out", str(tmp_path / "bench")])
    for method in ("dflash", "dflash_pld", "eagle3"):
        assert results["methods"][method]["overall"]["greedy_match"] == 1.0, method
        cost = results["methods"][method]["overall"]["step_cost"]  # in HF greedy's time per token
        assert cost["verify"] > 0 and cost["draft"] > 0 and cost["rest"] >= 0, cost
    assert "what limits each method" in (tmp_path / "bench" / "results.md").read_text()
    from specheads.inference.bench.results import refigure
    refigure(tmp_path / "bench")  # the same figures again from records.json
    assert json.loads((tmp_path / "bench" / "results.json").read_text()) == json.loads(json.dumps(results))
    MedusaHeads(MedusaConfig(hidden_size=base_config.hidden_size, vocab_size=base_config.vocab_size, num_heads=2,
                             base_model_name_or_path=str(tiny_llama_dir))).save_pretrained(tmp_path / "medusa")
    with pytest.raises(SystemExit, match="Medusa heads"):
        bench.main(["--model", str(tiny_llama_dir), "--drafts", str(tmp_path / "medusa"), "--questions",
                    str(questions), "--methods", "dflash", "--out", str(tmp_path / "b2")])


def test_tune_eagle_tree_stores_the_fastest_shape(tmp_path, tiny_llama_dir):
    from specheads.inference.tuning import eagle_tree as tune_eagle_tree
    from transformers import AutoConfig

    from specheads.heads import EagleConfig, EagleDraft

    EagleDraft(EagleConfig.for_base(AutoConfig.from_pretrained(tiny_llama_dir), str(tiny_llama_dir))
               ).save_pretrained(tmp_path / "eagle1")
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n")
    chosen = tune_eagle_tree.main(["--model", str(tiny_llama_dir), "--heads", str(tmp_path / "eagle1"),
                                   "--questions", str(questions), "--prompts", "1", "--max-new-tokens", "4",
                                   "--dtype", "fp32"])
    stored = EagleDraft.from_pretrained(tmp_path / "eagle1").extra_config
    assert stored["eagle_tree"] == chosen
    assert len(stored["eagle_tree_measurements"]["candidates"]) == len(tune_eagle_tree.CANDIDATES)


def test_build_tree_times_the_best_estimated_budgets_and_stores_the_fastest(tmp_path, tiny_llama_dir, heads_dir,
                                                                            monkeypatch):
    from specheads.inference.tuning import medusa_tree as build_tree
    from conftest import synthetic_sharegpt, write_jsonl

    from specheads.heads import MedusaHeads
    from specheads.inference.timing import interleaved_speeds

    timed_budgets = []

    def slowest_estimate_wins(decoders, *args, **kwargs):
        """Real timings, except that the timed budget the estimate ranked last is made the fastest."""
        speeds = interleaved_speeds(decoders, *args, **kwargs)
        timed_budgets.extend(name for name in decoders if name != "plain")
        speeds[timed_budgets[-1]] = (1e6, 1.0)
        return speeds

    monkeypatch.setattr(build_tree, "interleaved_speeds", slowest_estimate_wins)
    trees = {}  # budget (nodes incl. root) -> the tree build_tree made for it (few observed paths can make it smaller)
    make_tree = build_tree.tree_from_path_frequencies

    def recorded_tree(frequencies, num_nodes):
        trees[num_nodes + 1] = make_tree(frequencies, num_nodes)
        return trees[num_nodes + 1]

    monkeypatch.setattr(build_tree, "tree_from_path_frequencies", recorded_tree)
    data = tmp_path / "conversations.jsonl"
    write_jsonl(data, synthetic_sharegpt(12))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "a", "category": "qa", "turns": ["Hello"]}) + "\n")
    result = build_tree.main(["--heads", str(heads_dir), "--model", str(tiny_llama_dir), "--dtype", "fp32",
                              "--dataset", str(data), "--heldout-size", "4", "--prompts", "2", "--answer-tokens", "8",
                              "--top-k", "3", "--budgets", "2,3", "--prefix-length", "8", "--questions", str(questions),
                              "--timed-prompts", "1", "--timed-budgets", "2", "--timed-tokens", "6"])
    assert len(timed_budgets) == 2 and result["chosen_by"] == "timed"
    by_estimate = sorted(result["budgets"], key=lambda row: -row["estimated_speedup"])
    assert timed_budgets == [row["nodes"] for row in by_estimate[:2]]  # the estimate's two best, best first
    stored = MedusaHeads.from_pretrained(heads_dir).extra_config
    assert [tuple(p) for p in stored["tree"]] == [tuple(p) for p in result["tree"]]
    # the measured winner's tree, not the estimate's pick
    assert [tuple(p) for p in stored["tree"]] == [tuple(p) for p in trees[timed_budgets[-1]]]
    assert trees[timed_budgets[-1]] != trees[timed_budgets[0]]


def test_tune_eagle_tree_rejects_bad_shapes():
    from specheads.inference.tuning import eagle_tree as tune_eagle_tree

    args = tune_eagle_tree.parse_args(["--heads", "d", "--shapes", "4,4,10;8,6,26"])
    assert args.shapes == [(4, 4, 10, 0.0), (8, 6, 26, 0.0)]
    assert tune_eagle_tree.parse_args(["--heads", "d", "--shapes", "4,4,10,0.05"]).shapes == [(4, 4, 10, 0.05)]
    for bad in ("4,4", "0,5,18", "4,4,1", "4,4,10;4,4,10", "a,b,c", "4,4,10,1.0", "4,4,10,-0.1", "4,4,10,0,1"):
        with pytest.raises(SystemExit):
            tune_eagle_tree.parse_args(["--heads", "d", "--shapes", bad])


def test_results_marks_benchmarks_from_before_pld_combine(tmp_path):
    from specheads.inference.bench import results

    for name, extra in (("old", {}), ("new", {"pld_combine": "first"})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(
            {"command": "python scripts/bench.py --methods baseline,medusa_pld", **extra}))
        (folder / "results.md").write_text("| method |\n")
    assert "merged trees" in results.render_bench(tmp_path / "old")
    assert "merged trees" not in results.render_bench(tmp_path / "new")


def test_results_summary_takes_each_method_from_its_largest_then_latest_run(tmp_path):
    from specheads.inference.bench import results

    def bench(name, model, temperature, questions, date, speedups):
        folder = tmp_path / name
        folder.mkdir()
        methods = {m: {"overall": {"speedup": s, "tau": 1.0 + s, "tokens_per_s": 10 * s},
                       "per_category": {"code": {"speedup": s, "tau": 1.0 + s}}} for m, s in speedups.items()}
        (folder / "results.json").write_text(json.dumps(
            {"model": model, "temperature": temperature, "questions": questions, "date": date, "methods": methods}))
        return folder

    folders = [bench("a", "small", 0.0, 40, "2026-01-01", {"baseline": 1.0, "medusa": 1.2, "eagle3": 1.5}),
               bench("b", "small", 0.0, 20, "2026-01-02", {"baseline": 1.0, "medusa": 1.9, "pld": 1.3}),
               bench("c", "small", 0.0, 20, "2026-01-03", {"baseline": 1.0, "pld": 1.1}),
               bench("d", "small", 1.0, 8, "2026-01-01", {"baseline": 1.0, "medusa": 1.1}),
               bench("e", "large", 0.0, 8, "2026-01-01", {"baseline": 1.0, "medusa": 0.9}),
               bench("f", "large", 0.0, 64, "2026-01-01", {"baseline": 1.0, "medusa": 3.0})]
    batched = json.loads((tmp_path / "f" / "results.json").read_text())
    (tmp_path / "f" / "results.json").write_text(json.dumps({**batched, "batch_size": 16}))
    chosen = results.summary_rows(folders)
    assert {key: folder.name for key, (_, folder) in chosen.items() if key[2] != "baseline"} == {
        ("small", 0.0, "medusa"): "a", ("small", 0.0, "eagle3"): "a", ("small", 0.0, "pld"): "c",
        ("small", 1.0, "medusa"): "d", ("large", 0.0, "medusa"): "e"}
    assert chosen[("small", 0.0, "baseline")][1].name == "a"  # its tokens/s, beside the methods it was run with
    summary = results.render_summary(folders)
    assert "| eagle3 | 2.50 | 15.0 | **1.50x** | – | 1.50x (2.50) | a |" in summary
    with_unpacked = bench("g", "large", 1.0, 8, "2026-01-01", {"baseline": 1.0, "hf_unpacked": 0.5, "medusa": 1.2})
    assert "| medusa | 2.20 | 12.0 | **1.20x** | 2.40x | 1.20x (2.20) | g |" in results.render_summary([with_unpacked])
    assert summary.index("**large**, T=0") < summary.index("**small**, T=0") < summary.index("**small**, T=1")


def test_results_store_copies_benchmarks_so_a_fresh_clone_can_regenerate_the_section(tmp_path):
    from specheads.inference.bench import results

    run = tmp_path / "runs" / "bench-x"
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"command": "python scripts/bench.py"}')
    (run / "results.md").write_text("| method |\n")
    (run / "records.json").write_text("[]")  # per-question records stay behind
    store = tmp_path / "data" / "benchmarks"
    copies = results.store_benchmarks([run], store)
    assert copies == [store / "bench-x"]
    assert sorted(p.name for p in copies[0].iterdir()) == ["results.json", "results.md"]
    assert results.render_bench(copies[0]) == results.render_bench(run)
    assert results.store_benchmarks(copies, store) == copies  # storing the stored copies again is a no-op
    with pytest.raises(results.ResultsError, match="share a folder name"):
        results.store_benchmarks([run, copies[0]], tmp_path / "elsewhere")


def test_readme_headline_lists_our_fastest_methods_and_hfs_peers():
    """The README's one results table (scripts/results.py), from the committed benchmark results."""
    from specheads.inference.bench import results

    runs = [REPO / "data" / "benchmarks" / name for name in ("bench-smol-t0", "bench-smol-t1", "bench-smol-batch-4")]
    assert results.render_headline(runs).splitlines()[2:] == []  # README results come from the test split only
    table = results.render_headline(runs, split="dev").splitlines()
    smol_t0 = [line for line in table if line.startswith("| smollm2-135m-instruct | 0 |")]
    assert [line.split(" | ")[2] for line in smol_t0] == ["eagle3_pld", "medusa_pld", "pld", "hf_prompt_lookup",
                                                        "hf_assisted"]
    assert "| 3.48 | 2.74x | 0.15 | 20 (bench-smol-t0) |" in smol_t0[0]  # run before the interval existed: none shown
    rows = [line for line in table if line.startswith("| smollm2")]
    assert len(rows) == 2 * 5  # (T=0, T=1) x (3 of ours + 2 peers); the batched run has its own tables
    assert table[-2:] == ["- bench-smol-t0: Machine noise: not measured.", "- bench-smol-t1: Machine noise: not measured."]


def test_results_split_dev_and_test_and_compare_temperatures(tmp_path):
    """Runs on a *-test.jsonl question file are the test split (recorded, or read from an older run's command);
    the summary gives each split its own tables, and τ(T=1)/τ(T=0) per method on the same split."""
    from specheads.inference.bench import results

    def bench(name, questions_file, temperature, taus):
        folder = tmp_path / name
        folder.mkdir()
        methods = {m: {"overall": {"speedup": t, "tau": t, "tokens_per_s": 10 * t, "questions": 4,
                                   "speedup_ci95": [t - 0.1, t + 0.1]},
                       "per_category": {"code": {"speedup": t, "tau": t}}} for m, t in taus.items()}
        (folder / "results.json").write_text(json.dumps(
            {"model": "small", "temperature": temperature, "questions": 4, "date": "d", "methods": methods,
             **questions_file}))
        return folder

    test0 = bench("t0", {"questions_file": "data/questions/sharegpt-test.jsonl"}, 0.0, {"baseline": 1.0, "medusa": 2.0})
    test1 = bench("t1", {"command": "python scripts/bench.py --questions data/questions/sharegpt-test.jsonl"}, 1.0,
                  {"baseline": 1.0, "medusa": 1.5})
    dev0 = bench("d0", {"command": "python scripts/bench.py --max-questions 4"}, 0.0, {"baseline": 1.0, "medusa": 3.0})
    tune0 = bench("u0", {"questions_file": "data/questions/sharegpt-tune.jsonl"}, 0.0, {"baseline": 1.0, "medusa": 9.0})
    assert [results.split_of(json.loads((f / "results.json").read_text())) for f in (test0, test1, dev0, tune0)] == \
        ["test", "test", "dev", "tune"]
    summary = results.render_summary([test0, test1, dev0, tune0])
    assert "9.00x" not in summary  # runs that chose a setting keep to their own tables
    assert summary.index("T=0, test questions") < summary.index("T=0, dev questions")
    assert "| medusa | 2.00 | 1.50 | 0.75 | 2.00x | 1.50x | 4 / 4 |" in summary
    headline = results.render_headline([test0, test1, dev0])
    assert "| small | 0 | medusa | 2.00 | 2.00x (1.90-2.10) | – | 4 (t0) |" in headline and "3.00x" not in headline
    trial = bench("x0", {"questions_file": "data/questions/sharegpt-test.jsonl", "experiment": "dflash-vs-eagle3"},
                  0.0, {"baseline": 1.0, "medusa": 7.0})  # later and as large: would win the tie if it counted
    assert "7.00x" not in results.render_summary([test0, trial]) + results.render_headline([test0, trial])


def _record(new_tokens, seconds):
    return {"question_id": "q", "category": "c", "turns": [], "new_tokens": new_tokens, "seconds": seconds,
            "forwards": new_tokens}


def test_machine_noise_flags_a_run_whose_probe_forward_varied():
    """The noise measure on synthetic probe times (no model): CV of the fixed probe forward's time, flagged above
    the bound; HF greedy's spread (short answers left out) reported beside it; results.md says which."""
    import statistics

    from specheads.inference.bench.report import machine_noise, single_markdown

    baseline = [_record(100, 100 / rate) for rate in (50, 51, 25, 50.5)] + [_record(5, 5.0)]  # 1 tok/s, 5 tokens
    steady = [0.080, 0.081, 0.079, 0.0805]
    noise = machine_noise(steady, baseline, bound=0.1)
    assert noise["probes"] == 4 and noise["bound"] == 0.1 and not noise["noisy"]
    probe = noise["probe_seconds"]
    assert probe["min"] == pytest.approx(0.079) and probe["max"] == pytest.approx(0.081)
    assert probe["cv"] == pytest.approx(statistics.pstdev(steady) / statistics.fmean(steady))
    rates = noise["baseline_tokens_per_s"]  # the slow third question is text (a long prompt), not the machine
    assert rates["min"] == pytest.approx(25) and rates["cv"] > 0.2

    busy = [0.080, 0.080, 0.200, 0.160]  # half the run on a busy machine
    noise = machine_noise(busy, baseline, bound=0.1)
    assert noise["noisy"] and noise["probe_seconds"]["cv"] > 0.3
    assert not machine_noise(busy, baseline, bound=0.5)["noisy"]
    assert machine_noise([0.08], baseline)["probe_seconds"] is None and not machine_noise([0.08], baseline)["noisy"]

    results = {"model": "m", "dtype": "fp32", "temperature": 0, "max_new_tokens": 128, "questions": 4,
               "date": "d", "machine": "x",
               "methods": {"baseline": {"overall": {"tau": 1.0, "tokens_per_s": 40.0, "speedup": 1.0},
                                        "per_category": {"c": {"tau": 1.0, "speedup": 1.0}}}}}
    calm = single_markdown({**results, "noise": machine_noise(steady, baseline)})
    assert not any("Noisy" in line for line in calm) and any(line.startswith("Machine noise: a fixed probe")
                                                               for line in calm)
    warned = [line for line in single_markdown({**results, "noise": noise}) if "Noisy" in line]
    assert len(warned) == 1 and "CV 0.40" in warned[0] and "bound 0.10" in warned[0]


def test_speedup_interval_resamples_questions():
    """The 95% interval of the speedup over resampled questions: a point when every question has the same ratio,
    around the estimate and wider for more spread-out ratios."""
    from specheads.inference.bench.report import speedup_interval

    base = [10.0, 20.0, 30.0, 40.0]
    assert speedup_interval([2 * b for b in base], base) == pytest.approx([2.0, 2.0])
    mixed = [b * r for b, r in zip(base * 5, [1.0, 3.0, 2.0, 1.5] * 5)]
    low, high = speedup_interval(mixed, base * 5)
    estimate = sum(mixed) / sum(base * 5)
    assert low < estimate < high and high - low > 0.2
    narrow = [b * r for b, r in zip(base * 5, [1.9, 2.1, 2.0, 2.0] * 5)]
    assert (lambda i: i[1] - i[0])(speedup_interval(narrow, base * 5)) < (high - low) / 4


def test_ablation_records_render_one_row_per_arm_with_its_lever(tmp_path):
    """`make ablation`: each finished arm's run folder becomes a record (data/ablation/<arm>.json) that renders
    its row on a fresh clone; the lever column is what the arm's config changes against the base arm's."""
    from specheads.inference.bench import ablation, results

    def arm(name, ttt, tau_t0, steps, layers=1):
        run = tmp_path / "runs" / name
        (run / "checkpoints" / f"step-{steps:06d}").mkdir(parents=True)
        (run / "checkpoints" / "step-000025").mkdir()
        config = {"eagle": {"ttt_steps": ttt}, "train": {"output_dir": str(run), "epochs": 2}}
        if name != "base":  # a setting added after the base arm was recorded (ablation.ADDED_SETTINGS)
            config["eagle"]["num_layers"] = layers
        (run / "train_config.json").write_text(json.dumps(config))
        (run / "eval.json").write_text(json.dumps({"tau_t0": tau_t0, "tau_t1": tau_t0 - 0.3, "top1": [0.4],
                                                   "throughput": {"seconds": 100.0 * ttt}}))
        for t, tau in (("0", tau_t0 - 0.2), ("1", tau_t0 - 0.5)):
            (run / f"bench-t{t}").mkdir()
            (run / f"bench-t{t}" / "results.json").write_text(json.dumps({
                "command": f"python scripts/bench.py --drafts {run}/heads", "temperature": int(t),
                "methods": {"eagle3": {"overall": {"tau": tau, "speedup": tau / 1.3, "tokens_per_s": 20.0,
                                                   "questions": 48},
                                       "per_category": {"math": {"tau": tau + 0.1, "speedup": 1.0}}}}}))
        return run

    store = tmp_path / "data" / "ablation"
    for run in (arm("ttt7", 7, 1.61, 200), arm("base", 4, 1.52, 200), arm("layers2", 4, 1.55, 200, layers=2)):
        ablation.store_arm(run, store)
    records = ablation.load_records(store)
    assert [r["arm"] for r in records] == ["base", "layers2", "ttt7"] and records[2]["updates"] == 200
    table = ablation.render_ablation(records)
    assert "| base | — | 200 | 400 | 1.520 | 1.220 | 1.02x (τ 1.32) | 0.78x (τ 1.02) |" in table
    assert "| ttt7 | `eagle.ttt_steps=7` | 200 | 700 | 1.610 | 1.310 |" in table  # output_dir is no lever
    assert "| layers2 | `eagle.num_layers=2` | 200 | 400 |" in table  # the base predates the setting: 1 then
    assert "| ttt7 | 1.51 |" in table  # per category
    page = tmp_path / "results.md"
    page.write_text(f"head\n{ablation.START}\nold\n{ablation.END}\ntail\n")
    results.replace_between_markers(page, table, ablation.START, ablation.END)
    assert page.read_text().startswith("head\n") and "old" not in page.read_text() and table in page.read_text()
    # an unfinished arm is named, not rendered half
    (tmp_path / "runs" / "half").mkdir()
    with pytest.raises(ablation.AblationError, match="half: no train_config.json"):
        ablation.record_arm(tmp_path / "runs" / "half")
    with pytest.raises(results.ResultsError, match="markers"):
        results.replace_between_markers(_no_markers(tmp_path), table, ablation.START, ablation.END)



def test_curve_records_render_each_evaluation_of_a_run_and_the_last_one_of_an_older_run(tmp_path):
    """`make dflash-published`: a run's evaluations.jsonl (one line per held-out evaluation, train/trainer.py)
    becomes a record (data/curves/<name>.json) whose rows render on a fresh clone; a run from before that file
    gives its eval.json at its last checkpoint; a torn line is named with its file and line."""
    from specheads.inference.bench import ablation, curves

    dflash = tmp_path / "runs" / "dflash"
    dflash.mkdir(parents=True)
    (dflash / "train_config.json").write_text(json.dumps({"dflash": {"anchors": 256}}))
    lines = [{"step": 50, "train_seconds": 700.4, "top1": [0.12, 0.05], "tau_t0": 1.04, "tau_t1": 1.03},
             {"step": 100, "train_seconds": 1400.0, "top1": [0.2], "tau_t0": 1.1, "tau_t1": 1.06}]
    (dflash / "evaluations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    eagle = tmp_path / "runs" / "ablation" / "base"
    (eagle / "checkpoints" / "step-000197").mkdir(parents=True)
    (eagle / "train_config.json").write_text(json.dumps({"eagle": {"ttt_steps": 4}}))
    (eagle / "eval.json").write_text(json.dumps({"top1": [0.296], "tau_t0": 1.375, "tau_t1": 1.2755,
                                                 "throughput": {"seconds": 1213.4}}))
    store = tmp_path / "data" / "curves"
    for run in (dflash, eagle):
        curves.store_curve(run, store)
    records = ablation.read_records(store)
    assert [r["name"] for r in records] == ["ablation-base", "dflash"]
    table = curves.render_curves(records)
    assert "| ablation-base | 197 | 1213 | 0.296 | 1.375 | 1.276 |" in table
    assert "| dflash | 50 | 700 | 0.120 | 1.040 | 1.030 |" in table
    assert "| dflash | 100 | 1400 | 0.200 | 1.100 | 1.060 |" in table
    # a rerun of the same config (a fresh clone's) that has not yet reached the stored record's last update keeps it
    (dflash / "evaluations.jsonl").write_text(json.dumps(lines[0]) + "\n")
    path, kept = curves.store_curve(dflash, store)
    assert kept is not None and [p["step"] for p in json.loads(path.read_text())["points"]] == [50, 100]
    (dflash / "train_config.json").write_text(json.dumps({"dflash": {"anchors": 64}}))  # another experiment: replaced
    assert curves.store_curve(dflash, store)[1] is None
    assert [p["step"] for p in json.loads(path.read_text())["points"]] == [50]
    with (dflash / "evaluations.jsonl").open("a") as f:
        f.write('{"step": 150, "train_sec')
    with pytest.raises(curves.AblationError, match=r"evaluations.jsonl, line 2: not valid JSON"):
        curves.record_curve(dflash)
    (tmp_path / "runs" / "fresh").mkdir()
    (tmp_path / "runs" / "fresh" / "train_config.json").write_text("{}")
    with pytest.raises(curves.AblationError, match="fresh: neither evaluations.jsonl nor eval.json"):
        curves.record_curve(tmp_path / "runs" / "fresh")


def _no_markers(tmp_path):
    page = tmp_path / "plain.md"
    page.write_text("no markers\n")
    return page
