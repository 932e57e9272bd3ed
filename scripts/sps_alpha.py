"""Does draft-model speculative sampling behave as Leviathan et al.'s model predicts?

    python scripts/sps_alpha.py --draft-layers 8 --gammas 1,2,4,auto --max-questions 5 --max-new-tokens 96

For each γ, decodes the first turn of each question with DraftModelCandidates and compares the measured
tokens per verify step with (1 − α^{γ+1}) / (1 − α), α being measured on the same run (mean Σ min(p, q)
over drafted positions; 1[argmax p = draft] at T=0). The model assumes acceptances are i.i.d.; real
text accepts in runs (easy stretches, loops), which shows up as measured ≠ predicted. Also prints the
measured cost ratio c and the predicted and measured speedup over plain decoding.
"""

from __future__ import annotations

import argparse
import torch

from specheads.data.models import load_base_model, load_tokenizer
from specheads.inference.bench import load_questions
from specheads.inference.decoder import SamplingConfig, TreeDecoder
from specheads.inference.generate import chat_input_ids, eos_token_ids
from specheads.inference.speculative import DraftModelCandidates, expected_tokens_per_step, self_draft


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument("--gammas", default="1,2,4,auto")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--max-questions", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", default="auto")
    return parser.parse_args(argv)


def run(decoder, prompts, max_new_tokens, sampling, eos) -> tuple[list[int], float]:
    """Tokens per verify step over all prompts, and mean tokens/s."""
    lengths, speeds = [], []
    for i, ids in enumerate(prompts):
        sampling.seed = i
        decoder.generate_ids(ids, max_new_tokens, sampling, eos)
        lengths += decoder.stats.accepted_lengths
        speeds.append(decoder.stats.tokens_per_s)
    return lengths, sum(speeds) / len(speeds)


def main(argv=None):
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.model)
    model = load_base_model(args.model, args.dtype)
    eos = eos_token_ids(model, tokenizer)
    prompts = [chat_input_ids(tokenizer, q["turns"][0]) for q in load_questions(args.questions, args.max_questions)]
    sampling = SamplingConfig(temperature=args.temperature)
    draft = self_draft(model, args.draft_layers)
    plain = TreeDecoder(model)
    run(plain, prompts[:1], 8, sampling, eos)  # warm-up
    _, plain_speed = run(plain, prompts, args.max_new_tokens, sampling, eos)
    print(f"{args.model} ({model.dtype}), draft = first {args.draft_layers} of {model.config.num_hidden_layers} layers, "
          f"T={args.temperature}, {len(prompts)} questions × {args.max_new_tokens} tokens; plain {plain_speed:.1f} tok/s\n")
    print("| γ | α | τ measured (per step) | (1−α^{γ+1})/(1−α) | c | predicted speedup | measured speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for gamma in args.gammas.split(","):
        source = DraftModelCandidates(draft, gamma if gamma == "auto" else int(gamma), device=model.device)
        decoder = TreeDecoder(model, candidates=source)
        lengths, speed = run(decoder, prompts, args.max_new_tokens, sampling, eos)
        alpha = source.alpha_sum / max(source.alpha_count, 1)
        mean_gamma = source.draft_forwards / max(source.verify_forwards, 1)  # γ varies under 'auto'
        predicted = expected_tokens_per_step(alpha, round(mean_gamma))
        c = source.cost_ratio
        print(f"| {gamma} (mean {mean_gamma:.1f}) | {alpha:.3f} | {sum(lengths) / len(lengths):.2f} | {predicted:.2f} "
              f"| {c:.3f} | {predicted / (mean_gamma * c + 1):.2f}x | {speed / plain_speed:.2f}x |")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
