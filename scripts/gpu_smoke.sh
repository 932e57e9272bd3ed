#!/usr/bin/env bash
# The card's journey on GPUs, shortened to ~10 minutes on one GPU: what a GPU user runs first (README "On GPUs").
#
#   make gpu-smoke                                   # or: scripts/gpu_smoke.sh
#   SMOKE_MODEL=/models/vicuna-7b-v1.3 scripts/gpu_smoke.sh     # any local folder or Hub id
#
# 1. Medusa-1 heads: `accelerate launch` with DeepSpeed ZeRO-2 on every visible GPU, the Vicuna-7B recipe
#    (configs/vicuna7b.yaml, its vicuna_v1.1 template) on a ~1B Llama whose tokenizer, like Vicuna's, is a
#    sentencepiece model with no chat template; few updates. Then an EAGLE-3 draft the same way.
# 2. The push, as a dry run: the folder that would be uploaded, with its model card.
# 3. chat.py on CUDA with the pushed folder, and the bench (HF greedy, prompt lookup, Medusa, EAGLE-3) on CUDA in
#    bf16, printing τ, tokens/s and the speedup over HF greedy in the same run.
# Settings: SMOKE_MODEL (default TinyLlama/TinyLlama_v1.1), SMOKE_DATA (default sharegpt, the built-in ShareGPT),
# SMOKE_STEPS (default 40), SMOKE_OUT (default runs/gpu-smoke), PYTHON (default .venv/bin/python); for a CPU stand-in
# (tests/test_journey.py): SMOKE_DEVICE, SMOKE_DTYPE, SMOKE_TOKENS, SMOKE_QUESTIONS, SMOKE_QUESTION_FILE, SMOKE_DRAFT_VOCAB, SMOKE_OVERRIDES
# (more section.key=value for both trainings), SMOKE_LAUNCH_ARGS (more accelerate flags).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
ACCELERATE="$(dirname "$PY")/accelerate"
MODEL=${SMOKE_MODEL:-TinyLlama/TinyLlama_v1.1}
DATA=${SMOKE_DATA:-sharegpt}
STEPS=${SMOKE_STEPS:-40}
OUT=${SMOKE_OUT:-runs/gpu-smoke}
DEVICE=${SMOKE_DEVICE:-cuda}         # cpu: the same commands on a CPU (tests/test_journey.py runs them so, tiny)
DTYPE=${SMOKE_DTYPE:-bf16}
TOKENS=${SMOKE_TOKENS:-128}
QUESTIONS=${SMOKE_QUESTIONS:-16}
if [ "$DEVICE" = cuda ]; then
    PROCS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    if [ "$PROCS" -lt 1 ]; then
        echo "gpu_smoke.sh: no CUDA GPU is visible to $PY (torch.cuda.device_count() is 0)" >&2
        exit 2
    fi
    "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, '|', \
        ', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"
else
    PROCS=1
fi
echo "== $MODEL, $PROCS process(es) on $DEVICE, $STEPS updates, into $OUT"

SIZE=(model.name="$MODEL" data.dataset="$DATA" data.max_length=1024 data.heldout_size=64 data.max_heldout_eval=32
      train.max_steps="$STEPS" train.batch_size=4 train.eval_every=0 train.save_every=20 train.accept_positions=256
      ${SMOKE_OVERRIDES:-})
# shellcheck disable=SC2206  # SMOKE_LAUNCH_ARGS: extra accelerate flags, split on spaces
LAUNCH=("$ACCELERATE" launch --config_file configs/accelerate/deepspeed_zero2.yaml --num_processes "$PROCS"
        ${SMOKE_LAUNCH_ARGS:-})

echo "== 1. train (DeepSpeed ZeRO-2)"
"${LAUNCH[@]}" train/medusa.py --config configs/vicuna7b.yaml "${SIZE[@]}" train.output_dir="$OUT/medusa1" --resume
"${LAUNCH[@]}" train/eagle.py --config configs/vicuna7b-eagle3.yaml "${SIZE[@]}" eagle.draft_vocab_size="${SMOKE_DRAFT_VOCAB:-8192}" \
    train.output_dir="$OUT/eagle3" --resume

echo "== 2. push (dry run)"
"$PY" scripts/push_to_hub.py --heads "$OUT/medusa1/heads" --repo-id you/smoke-medusa1 --dry-run "$OUT/pushed-medusa1"
"$PY" scripts/push_to_hub.py --heads "$OUT/eagle3/heads" --repo-id you/smoke-eagle3 --dry-run "$OUT/pushed-eagle3"
ls -lR "$OUT/pushed-medusa1"   # root: the vLLM export (served by the repo id); specheads/: what --heads loads
grep -h -- "--speculative-config" "$OUT/pushed-medusa1/README.md" "$OUT/pushed-eagle3/README.md" || true

echo "== 3. chat and bench on $DEVICE ($DTYPE)"
"$PY" inference/chat.py --model "$MODEL" --heads "$OUT/pushed-medusa1" --device "$DEVICE" --dtype "$DTYPE" \
    --prompt "Give three tips for writing clear emails." --max-new-tokens "$TOKENS"
"$PY" inference/chat.py --model "$MODEL" --heads "$OUT/pushed-eagle3" --device "$DEVICE" --dtype "$DTYPE" \
    --prompt "Give three tips for writing clear emails." --max-new-tokens "$TOKENS"
"$PY" scripts/bench.py --model "$MODEL" --heads "$OUT/medusa1/heads" --drafts "$OUT/eagle3/heads" --device "$DEVICE" \
    --dtype "$DTYPE" --methods baseline,hf_prompt_lookup,medusa,eagle3,eagle3_pld \
    --questions "${SMOKE_QUESTION_FILE:-data/questions/sharegpt-test.jsonl}" --max-questions "$QUESTIONS" --max-new-tokens "$TOKENS" --out "$OUT/bench"
echo "== done: $OUT/bench/results.md"
