# Recipes and benchmark replays: every committed head, dataset and result is made by one target here
# (included by the Makefile, which keeps set-up, the demo and the tests; `make help` lists both).
.PHONY: ablation dflash-published distill-smol-t1 eagle3-t1 distill-throughput medusa1 eagle eagle1 eagle3 distill-eagle3 medusa2 bench-qwen distill distill-qwen qwen-eagle qwen-medusa bench-smol bench-test tune-sampled compare-dflash results \
	prompts distill-mix distill-qwen-mix eagle3-mix bench-mix

# The full Medusa-1 recipe (~55 minutes on 2 cores, 41 of them training; the committed heads/trained/smollm2-135m-medusa1
# used its config with heads.draft_vocab_size=8192 from the start): train Medusa-1 heads on SmolLM2-135M-Instruct's own
# answers and print their held-out accuracy, restrict their proposals to the 8192 most frequent answer tokens (92% of
# held-out answer tokens; the heads' cost per step falls from ~6 to ~1 ms), pick their tree for this machine, then
# benchmark them (alone, and with prompt lookup trusted by match length: lookup_with_heads) against HF greedy, HF prompt
# lookup and our prompt lookup. --resume: a second run continues (or just re-reports) instead of redoing it.
RUN := runs/smollm2-135m-medusa1
medusa1: setup
	$(BIN)/python train/medusa.py --config configs/smollm2-135m.yaml --resume
	$(BIN)/python scripts/draft_vocab.py --heads $(RUN)/heads --size 8192
	$(BIN)/python scripts/build_tree.py --heads $(RUN)/heads --prompts 16
	$(BIN)/python scripts/bench.py --heads $(RUN)/heads --questions data/questions/sharegpt-dev.jsonl \
		--methods baseline,prompt_lookup,pld,medusa,medusa_pld --temperature 0 --max-new-tokens 128 --max-questions 20 \
		--out $(RUN)/bench

# The committed EAGLE drafts for SmolLM2, one recipe each (resumable: run the same target again after a stop):
# eagle1 ~25 minutes, eagle3 ~4 hours on 2 cores (its stages: configs/smollm2-135m-eagle3-recipe.yaml); `make eagle`
# trains both, tunes their trees for this machine and benchmarks them against the Medusa heads and HF.
EAGLE1 := runs/smollm2-135m-eagle1
EAGLE3 := runs/smollm2-135m-eagle3-recipe
eagle1: setup
	$(BIN)/python train/eagle.py --config configs/smollm2-135m-eagle1.yaml --resume
eagle3: setup
	$(BIN)/python train/eagle.py --config configs/smollm2-135m-eagle3-recipe.yaml --resume
# The T=1 draft: the committed T=0 draft and one epoch on SmolLM2's T=1 samples (~65 minutes on one core).
SMOL_CHAT_T1 := data/distilled/smollm2-135m-sharegpt-train-3000-t1.jsonl
eagle3-t1: setup $(SMOL_CHAT_T1)
	$(BIN)/python train/eagle.py --config configs/smollm2-135m-eagle3-t1.yaml --resume
eagle: eagle1 eagle3
	$(BIN)/python scripts/tune_eagle_tree.py --heads $(EAGLE1)/heads
	$(BIN)/python scripts/tune_eagle_tree.py --heads $(EAGLE3)/heads --prompts 6
	$(BIN)/python scripts/bench.py --heads $(RUN)/heads \
		--drafts $(EAGLE1)/heads,$(EAGLE3)/heads \
		--questions data/questions/sharegpt-dev.jsonl --methods baseline,medusa,medusa_pld,eagle2,eagle3,eagle3_pld \
		--temperature 0 --max-new-tokens 128 --max-questions 20 --out runs/bench-eagle

# Medusa-1 on ShareGPT's original answers vs Medusa-1 on self-distilled answers (make medusa1's heads) vs Medusa-2
# (make medusa1's heads trained on jointly with a LoRA adapter), each with its own tree, in one benchmark run.
# Needs `make medusa1` first; ~35 min of training on 2 cores.
M1_SHAREGPT := runs/smollm2-135m-medusa1-sharegpt
M2 := runs/smollm2-135m-medusa2
medusa2: setup
	$(BIN)/python train/medusa.py --config configs/smollm2-135m-sharegpt.yaml --resume
	$(BIN)/python train/medusa.py --config configs/smollm2-135m-medusa2.yaml --resume
	$(BIN)/python scripts/build_tree.py --heads $(M1_SHAREGPT)/heads --prompts 16
	$(BIN)/python scripts/build_tree.py --heads $(M2)/heads --prompts 16
	$(BIN)/python scripts/bench.py --heads sharegpt=$(M1_SHAREGPT)/heads,distilled=$(RUN)/heads,medusa2=$(M2)/heads \
		--questions data/questions/sharegpt-dev.jsonl --methods baseline,prompt_lookup,medusa --temperature 0 \
		--max-new-tokens 128 --max-questions 20 --out runs/bench-medusa2

# The training-free methods on the 1.5B target against HF's own, at T=0 and T=1 (~40 minutes on 2 cores).
SEED_METHODS := baseline,hf_unpacked,hf_prompt_lookup,hf_assisted,pld,sps,lookahead
bench-qwen: setup-qwen
	for t in 0 1; do $(BIN)/python scripts/bench.py --model $(QWEN) --methods $(SEED_METHODS) --temperature $$t \
		--questions data/questions/sharegpt-dev.jsonl --max-new-tokens 96 --max-questions 8 \
		--out runs/bench-qwen-seed-t$$t || exit 1; done

# An EAGLE-3 draft for the 1.5B target (configs/qwen2.5-coder-1.5b-eagle3.yaml: its own answers to 600 offline
# code/extraction/math prompts and half its 1,200 ShareGPT training answers, all committed; lm_head started from
# the base's), its tree shape tuned on 4 dev prompts, then benchmarked on the test split (never tuned on) alone
# and with prompt lookup, against HF and the committed Medusa heads in the same run: T=0 on the 15 coding prompts,
# on the first 24 (3 per category: HF, HF prompt lookup, eagle3, eagle3_pld), T=1 on the first 24 (HF, eagle3,
# eagle3_sampled); each bench is skipped once its results exist and pinned to one core (BENCH_CPU; the first two
# can run side by side with BENCH_CPU=1 on one of them). Training: one epoch of 289 updates, ~16 s each on 2
# cores (the 1.5B's forward is most of it; its states are cached per conversation, so an interrupted run
# continues from its last checkpoint and recomputes nothing it cached).
# QWEN_RUN pins it, e.g. QWEN_RUN="OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python".
QWEN_DISTILLED ?= data/distilled/qwen2.5-coder-1.5b-sharegpt-train.jsonl
QWEN_EAGLE := runs/qwen2.5-coder-1.5b-eagle3
QWEN_RUN ?= $(BIN)/python
QWEN_EAGLE_BENCH := $(BENCH) --model $(QWEN) --drafts $(QWEN_EAGLE)/heads --heads heads/trained/qwen2.5-coder-1.5b-medusa \
	--questions data/questions/sharegpt-test.jsonl --max-new-tokens 96
qwen-eagle: setup-qwen
	$(QWEN_RUN) train/eagle.py --config configs/qwen2.5-coder-1.5b-eagle3.yaml --resume
	grep -q eagle_tree $(QWEN_EAGLE)/heads/config.json || $(QWEN_RUN) scripts/tune_eagle_tree.py --model $(QWEN) \
		--heads $(QWEN_EAGLE)/heads --prompts 4 --max-new-tokens 64 --shapes "4,4,10;6,5,18;8,6,26;10,7,40"
	test -f runs/bench-qwen-eagle3-test-coding-t0/results.json || $(QWEN_EAGLE_BENCH) --categories coding \
		--methods baseline,hf_prompt_lookup,medusa_pld,eagle3,eagle3_pld --temperature 0 \
		--out runs/bench-qwen-eagle3-test-coding-t0
	test -f runs/bench-qwen-eagle3-test-t0/results.json || $(QWEN_EAGLE_BENCH) --max-questions 24 \
		--methods baseline,hf_prompt_lookup,eagle3,eagle3_pld --temperature 0 --out runs/bench-qwen-eagle3-test-t0
	test -f runs/bench-qwen-eagle3-test-t1/results.json || $(QWEN_EAGLE_BENCH) --max-questions 24 \
		--methods baseline,eagle3,eagle3_sampled --temperature 1 --out runs/bench-qwen-eagle3-test-t1
	$(MAKE) results

# Medusa heads for the 1.5B target on its 1,200 answers (3 heads, 16k-token draft vocabulary): epoch 1 runs
# the 1.5B and caches its states (~52 min on 2 cores), epochs 2-4 read them (~10 min); their tree is chosen
# here, then every method runs at T=0 and T=1 in one benchmark per temperature.
QWEN_MEDUSA := runs/qwen2.5-coder-1.5b-medusa
QWEN_METHODS := $(SEED_METHODS),medusa,medusa_pld
qwen-medusa: setup-qwen
	$(BIN)/python train/medusa.py --config configs/qwen2.5-coder-1.5b-medusa.yaml --resume
	$(BIN)/python scripts/build_tree.py --model $(QWEN) --heads $(QWEN_MEDUSA)/heads --prompts 8 --answer-tokens 96 \
		--budgets 2,4,6,8,12,16,24 --timed-prompts 3 --timed-tokens 64 --timed-budgets 3
	for t in 0 1; do $(BIN)/python scripts/bench.py --model $(QWEN) --heads $(QWEN_MEDUSA)/heads \
		--methods $(QWEN_METHODS) --temperature $$t --questions data/questions/sharegpt-dev.jsonl \
		--max-new-tokens 96 --max-questions 8 --out runs/bench-qwen-medusa-t$$t || exit 1; done

# Every method on SmolLM2 with make medusa1's heads at T=0 and T=1, against HF greedy, HF prompt lookup and HF
# assisted generation in the same run (needs `make medusa1` first; ~35 minutes on 2 cores).
bench-smol: setup
	for t in 0 1; do $(BIN)/python scripts/bench.py --heads $(RUN)/heads --methods $(SEED_METHODS),medusa,medusa_pld \
		--temperature $$t --questions data/questions/sharegpt-dev.jsonl --max-new-tokens 96 --max-questions 10 \
		--out runs/bench-smol-all-t$$t || exit 1; done

# The README's results: the committed drafts on the test split (data/questions/sharegpt-test.jsonl, never tuned
# on), against HF in the same run. One thread pinned to one core (BENCH_CPU), so other work on the machine's
# other core cannot stall it: two OpenMP threads sharing a core with another job ran several times slower.
# SmolLM2 T=0 on all 120 prompts with the T=0 draft (~40 min), T=1 on the first 24 (3 per category, ~20 min)
# with the T=1 draft (eagle3-t1), Qwen2.5-Coder-1.5B T=0 on the 15 coding prompts; then the results pages.
BENCH_CPU ?= 0
BENCH := OMP_NUM_THREADS=1 taskset -c $(BENCH_CPU) $(BIN)/python scripts/bench.py
SMOL_DRAFTS := --heads heads/trained/smollm2-135m-medusa1 --drafts heads/trained/smollm2-135m-eagle3
SMOL_DRAFTS_T1 := --heads heads/trained/smollm2-135m-medusa1 --drafts heads/trained/smollm2-135m-eagle3-t1
TEST_SPLIT := --questions data/questions/sharegpt-test.jsonl --max-new-tokens 128
bench-test: setup setup-qwen
	$(BENCH) $(SMOL_DRAFTS) --methods baseline,hf_prompt_lookup,medusa_pld,eagle3,eagle3_pld --temperature 0 \
		$(TEST_SPLIT) --out runs/bench-smol-test-t0
	$(BENCH) $(SMOL_DRAFTS_T1) --methods baseline,hf_prompt_lookup,medusa_pld,eagle3,eagle3_pld,eagle3_sampled \
		--eagle-sample-k 2 --eagle-sample-width 1 --eagle-sample-depth 4 \
		--temperature 1 $(TEST_SPLIT) --max-questions 24 --out runs/bench-smol-test-t1
	$(BENCH) --model $(QWEN) --heads heads/trained/qwen2.5-coder-1.5b-medusa --categories coding \
		--methods baseline,hf_prompt_lookup,pld,medusa_pld --temperature 0 \
		--questions data/questions/sharegpt-test.jsonl --max-new-tokens 96 --out runs/bench-qwen-test-coding-t0
	$(MAKE) results

# The sampled EAGLE tree's shape (eagle3_sampled), chosen at T=1 on the tune split: five shapes, the fastest
# became SampledEagleCandidates' default (2 children, 1 node expanded per level, 4 levels). ~20 minutes.
SAMPLED_SHAPES := k2w2d5 k3w2d6 k2w1d6 k2w1d4 k1w1d4
tune-sampled: setup
	for s in $(SAMPLED_SHAPES); do k=$$(echo $$s | cut -c2); w=$$(echo $$s | cut -c4); d=$$(echo $$s | cut -c6); \
		$(BENCH) --drafts heads/trained/smollm2-135m-eagle3 --methods baseline,eagle3,eagle3_sampled \
		--eagle-sample-k $$k --eagle-sample-width $$w --eagle-sample-depth $$d --temperature 1 \
		--questions data/questions/sharegpt-tune.jsonl --max-questions 16 --max-new-tokens 64 \
		--out runs/tune-sampled-$$s || exit 1; done

# DFlash against EAGLE-3 on the same data and updates: both from scratch on the same self-distilled answers (the
# same cached hidden states: EAGLE-3's run extracts them, DFlash's reads them), 120 updates of 8 sequences each, one
# core. EAGLE-3 trains every answer position through 4 unrolled steps; DFlash trains blocks at dflash.anchors
# positions per sequence (64 here: at its config's 16 an update costs a tenth of EAGLE-3's and learned little).
# Their held-out rollout acceptance every 40 updates, then both on the first 24 test prompts (3 per category) at T=0
# and T=1 in one run (--experiment: their own tables, not the README's); then EAGLE-3 again with the
# acceptance-aligned loss (eagle.loss=ce+tv) against its ce run. ~1.5 hours on one core (CMP_CPU).
CMP_CPU ?= 1
CMP_TRAIN := OMP_NUM_THREADS=1 taskset -c $(CMP_CPU) $(BIN)/python
CMP_BUDGET := train.max_steps=120 train.eval_every=40 train.best_by=tau_t0 train.save_every=20
CMP_BENCH := $(CMP_TRAIN) scripts/bench.py \
	--drafts runs/cmp-eagle3/heads,runs/cmp-dflash/heads $(TEST_SPLIT) --max-questions 24 --experiment dflash-vs-eagle3
compare-dflash: setup
	$(CMP_TRAIN) train/eagle.py --config configs/smollm2-135m-eagle3.yaml train.output_dir=runs/cmp-eagle3 $(CMP_BUDGET) \
		eagle.loss=ce --resume
	$(CMP_TRAIN) train/dflash.py --config configs/smollm2-135m-dflash.yaml train.output_dir=runs/cmp-dflash $(CMP_BUDGET) \
		dflash.anchors=64 --resume
	$(CMP_BENCH) --methods baseline,eagle3,dflash --temperature 0 --out runs/bench-cmp-t0
	$(CMP_BENCH) --methods baseline,eagle3,eagle3_sampled,dflash --temperature 1 --out runs/bench-cmp-t1
	$(CMP_TRAIN) train/eagle.py --config configs/smollm2-135m-eagle3.yaml train.output_dir=runs/cmp-eagle3-tv \
		$(CMP_BUDGET) eagle.loss=ce+tv --resume

# DFlash as published (REFERENCE §4b; configs/smollm2-135m-dflash-published.yaml) beside the ablation's EAGLE-3 base
# arm: the same 800 answers and 200 held-out conversations, one pinned core (CMP_CPU), held-out rollout τ every 50
# updates into its evaluations.jsonl. ~14 s an update on one core (every answer position an anchor); interrupted or
# finished early, a rerun continues from the last checkpoint. `make results` renders the τ-against-updates table.
DFLASH_PUBLISHED := runs/smollm2-135m-dflash-published
CURVE_RUNS := runs/ablation/base $(DFLASH_PUBLISHED)
dflash-published: setup
	$(CMP_TRAIN) train/dflash.py --config configs/smollm2-135m-dflash-published.yaml --resume

# Every stored benchmark (data/benchmarks/) and every finished one in runs/ of the same name pattern, the test-split
# runs first (the README's headline reads them first).
BENCH_NAMES := $(sort $(notdir $(wildcard data/benchmarks/*)) $(patsubst runs/%/results.json,%,$(wildcard \
	runs/bench-*/results.json runs/tune-*/results.json)))
TEST_BENCHES := $(filter %-test-t0 %-test-t1 %-test-coding-t0,$(BENCH_NAMES))
BENCHES := $(TEST_BENCHES) $(filter-out $(TEST_BENCHES),$(BENCH_NAMES))
# README and docs/results.md from the committed benchmarks (runs/<name> is stored in data/benchmarks first when
# a new run exists there; a benchmark neither place holds is left out).
results: setup
	$(BIN)/python scripts/results.py --run heads/trained/smollm2-135m-medusa1 --run heads/trained/smollm2-135m-eagle3 \
		--run heads/trained/smollm2-135m-eagle3-t1 \
		--run heads/trained/qwen2.5-coder-1.5b-medusa --store data/benchmarks \
		$(foreach a,$(ABLATION_DONE),--ablation runs/ablation/$(a)) \
		$(foreach r,$(CURVE_RUNS),$(if $(wildcard $(r)/evaluations.jsonl $(r)/eval.json),--curve $(r))) \
		$(foreach b,$(BENCHES),$(if $(wildcard runs/$(b)/results.json),--bench runs/$(b),$(if \
			$(wildcard data/benchmarks/$(b)/results.json),--bench data/benchmarks/$(b))))

# QWEN_LIMIT=1200 QWEN_DISTILLED=data/distilled/qwen2.5-coder-1.5b-sharegpt-train-1200.jsonl: the committed file of
# twice the answers (made by copying the 600-answer file there first: the script resumes, so only 600 are new, ~28 min).
QWEN_LIMIT ?= 600
distill-qwen: setup-qwen
	$(BIN)/python scripts/self_distill.py --model $(QWEN) --out $(QWEN_DISTILLED) --split train --limit $(QWEN_LIMIT) \
		--batch-size 32 --max-new-tokens 160 --max-prompt-tokens 256

# Self-distillation's answers/hour and tokens/s, HF against vLLM on the same 200 prompts in one run (docs/training.md).
# bf16 is the speed (what `make distill` runs on a bf16 CPU), fp32 the greedy agreement; 6 GiB of KV cache lets vLLM
# run the 200 answers at once.
distill-throughput: setup setup-engines
	for dtype in bf16 fp32; do VLLM_CPU_KVCACHE_SPACE=6 $(BIN)/python scripts/distill_throughput.py \
		--model smollm2-135m-instruct --prompts 200 --max-new-tokens 128 --dtype $$dtype \
		--out runs/distill-throughput-$$dtype || exit 1; done

# Regenerate the self-distilled training data of the SmolLM2 recipes (SmolLM2's own answers; ~15 minutes).
DISTILLED := data/distilled/smollm2-135m-sharegpt-train.jsonl
SMOL_DISTILL := $(BIN)/python scripts/self_distill.py --split train --batch-size 48 --max-new-tokens 192 --max-prompt-tokens 384
distill: setup
	$(SMOL_DISTILL) --out $(DISTILLED) --limit 1200

# ... and the EAGLE-3 recipe's files (~2.5 hours): the answers to train prompts 1-3,000 (the first 1,200 as above, then
# 1,800 more in the same file), then 3,001-4,800, 4,800-7,800, 7,800-10,800 and 10,800-13,800, each slice batched as
# when it was made (self_distill --skip). Resumable.
SMOL_ANSWERS := data/distilled/smollm2-135m-sharegpt-train
distill-eagle3: setup
	$(SMOL_DISTILL) --out $(SMOL_ANSWERS)-3000.jsonl --limit 1200
	$(SMOL_DISTILL) --out $(SMOL_ANSWERS)-3000.jsonl --limit 3000
	$(SMOL_DISTILL) --out $(SMOL_ANSWERS)-3000-4800.jsonl --skip 3000 --limit 1800
	for start in 4800 7800 10800; do $(SMOL_DISTILL) --out $(SMOL_ANSWERS)-$$start-$$((start + 3000)).jsonl \
		--skip $$start --limit 3000 || exit 1; done

# Data beyond chat (issue 48): code, extraction and math prompts made offline from Python's standard library and
# seeded templates (data/prompts/offline-mix.jsonl, data/prompt_sources.py), SmolLM2's answers to them through vLLM
# (~15 minutes on 2 cores; resumable), one more epoch of the committed EAGLE-3 draft on them mixed with chat
# (configs/smollm2-135m-eagle3-mix.yaml, ~50 minutes on one core), and its test-split benchmark beside the
# committed draft's (bench-smol-test-t0), per category, with the committed draft's tree (10/7/40 @0.03).
MIX_PROMPTS := data/prompts/offline-mix.jsonl
prompts: setup
	$(BIN)/python scripts/make_prompts.py --out $(MIX_PROMPTS)
distill-mix: setup setup-engines
	VLLM_CPU_KVCACHE_SPACE=6 $(BIN)/python scripts/self_distill.py --dataset $(MIX_PROMPTS) --backend vllm \
		--batch-size 48 --max-new-tokens 192 --max-prompt-tokens 384 --out data/distilled/smollm2-135m-offline-mix.jsonl
# The 1.5B's answers to the first 600 of them that fit 256 tokens, for its EAGLE-3 recipe (vLLM pinned to core 0).
distill-qwen-mix: setup-qwen setup-engines
	VLLM_CPU_KVCACHE_SPACE=6 VLLM_CPU_OMP_THREADS_BIND=0 $(BIN)/python scripts/self_distill.py --model $(QWEN) \
		--dataset $(MIX_PROMPTS) --backend vllm --limit 600 --batch-size 100 --max-new-tokens 160 \
		--max-prompt-tokens 256 --out data/distilled/qwen2.5-coder-1.5b-offline-mix.jsonl
eagle3-mix: setup
	$(CMP_TRAIN) train/eagle.py --config configs/smollm2-135m-eagle3-mix.yaml --resume
bench-mix: setup
	$(BENCH) --drafts runs/smollm2-135m-eagle3-mix/heads --methods baseline,eagle3,eagle3_pld --temperature 0 \
		--eagle-top-k 10 --eagle-depth 7 --eagle-tokens 40 --eagle-min-prob 0.03 \
		$(TEST_SPLIT) --experiment eagle3-mix --out runs/bench-smol-test-mix-t0

# τ per datum (issue 48, docs/results.md "Ablation"): EAGLE-3 drafts for SmolLM2 from scratch, each arm the base
# config (configs/smollm2-135m-eagle3-ablation.yaml: 800 greedy chat answers, 2 epochs, 200 updates) with one
# lever changed, trained on one pinned core (CMP_CPU), then benchmarked on the first 48 test prompts (6 per
# category) at T=0 with the committed draft's tree, and at T=1 on the first 24. Arms reading the same data share
# the cached base states. `make ablation` runs the arms neither finished in runs/ nor recorded in data/ablation/ (a
# fresh clone holds only the records; each arm resumes), then the results pages; `make ablation-ARM` runs one again.
# The T=1 arm reads SmolLM2's T=1 samples for the same 3,000 prompts ($(ABL_CHAT_T1) below, ~30 minutes on one core).
ABL_CONFIG := configs/smollm2-135m-eagle3-ablation.yaml
ABL_CHAT := data/distilled/smollm2-135m-sharegpt-train-3000.jsonl
ABL_OFFLINE := data/distilled/smollm2-135m-offline-mix.jsonl
ABL_CHAT_T1 := $(SMOL_CHAT_T1)
ABL_base :=
ABL_ttt7 := eagle.ttt_steps=7
ABL_epochs4 := train.epochs=4
ABL_mix := 'data.dataset=[{source: $(ABL_CHAT), weight: 0.13793}, {source: $(ABL_OFFLINE), weight: 0.26846}]'
ABL_layers2 := eagle.num_layers=2
ABL_sampled := 'data.dataset=[{source: $(ABL_CHAT_T1), weight: 0.27587}, {source: $(ABL_OFFLINE), weight: 0}]'
ABLATION_ARMS := base ttt7 epochs4 mix layers2 sampled
ABLATION_DONE := $(foreach a,$(ABLATION_ARMS),$(if $(wildcard runs/ablation/$(a)/bench-t1/results.json),$(a)))
ABLATION_RECORDED := $(foreach a,$(ABLATION_ARMS),$(if $(wildcard data/ablation/$(a).json),$(a)))
ABL_TREE := --eagle-top-k 10 --eagle-depth 7 --eagle-tokens 40 --eagle-min-prob 0.03
ablation: $(addprefix ablation-,$(filter-out $(ABLATION_DONE) $(ABLATION_RECORDED),$(ABLATION_ARMS)))
	$(MAKE) results
ablation-sampled: $(ABL_CHAT_T1)
ablation-%: setup
	$(CMP_TRAIN) train/eagle.py --config $(ABL_CONFIG) --resume train.output_dir=runs/ablation/$* $(ABL_$*)
	test -f runs/ablation/$*/bench-t0/results.json || $(CMP_TRAIN) scripts/bench.py --drafts runs/ablation/$*/heads \
		--methods baseline,eagle3 --temperature 0 $(ABL_TREE) $(TEST_SPLIT) --max-questions 48 \
		--experiment ablation-$* --out runs/ablation/$*/bench-t0
	test -f runs/ablation/$*/bench-t1/results.json || $(CMP_TRAIN) scripts/bench.py --drafts runs/ablation/$*/heads \
		--methods baseline,eagle3 --temperature 1 $(TEST_SPLIT) --max-questions 24 \
		--experiment ablation-$* --out runs/ablation/$*/bench-t1
# SmolLM2's T=1 samples through vLLM (~6,000 answers an hour on one core), for the same prompts as the greedy files:
# the first 3,000 (the sampled arm; the T=1 draft, eagle3-t1) and the 3,001st to 7,800th (the prompts of the
# -3000-4800 and -4800-7800 files: more contexts for a later stage, since ShareGPT's train side past the last
# distilled conversation is the benchmark's untouched tail, data/questions.py).
SMOL_T1_DISTILL := VLLM_CPU_KVCACHE_SPACE=4 $(BIN)/python scripts/self_distill.py --backend vllm --split train \
	--batch-size 48 --max-new-tokens 192 --max-prompt-tokens 384 --temperature 1 --seed 0
SMOL_CHAT_T1_MORE := $(SMOL_ANSWERS)-3000-7800-t1.jsonl
$(ABL_CHAT_T1): | setup-engines
	$(SMOL_T1_DISTILL) --limit 3000 --out $@.partial
	mv $@.partial $@
$(SMOL_CHAT_T1_MORE): | setup-engines
	$(SMOL_T1_DISTILL) --skip 3000 --limit 4800 --out $@.partial
	mv $@.partial $@
distill-smol-t1: $(ABL_CHAT_T1) $(SMOL_CHAT_T1_MORE)
