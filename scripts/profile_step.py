"""Where a decode step's time goes: the torch profiler over a few answers with trained heads.

    python scripts/profile_step.py --heads runs/smollm2-135m-medusa1/heads --prompts 3 [--eagle]

Prints the decoder's own split (tree forward, drafting, everything else per step) and the profiler's top
operators by self CPU time, so per-step Python and allocation overhead shows up next to the matmuls.
"""

from __future__ import annotations

import argparse
import json

from torch.profiler import ProfilerActivity, profile

from specheads.data.models import load_base_model, load_tokenizer
from specheads.heads.joint import load_adapted_base
from specheads.heads import load_heads
from specheads.inference.generate import chat_input_ids, eos_token_ids, make_decoder
from specheads.inference.cpu_verify import add_untuned_cpu_argument, prepare_cpu_verify


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--heads", required=True, help="Medusa heads or EAGLE draft folder")
    parser.add_argument("--questions", default="data/questions/sharegpt-dev.jsonl")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="auto")
    add_untuned_cpu_argument(parser)
    parser.add_argument("--rows", type=int, default=15, help="operators to list")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer(args.model)
    model = load_adapted_base(load_base_model(args.model, args.dtype), args.heads)
    heads = load_heads(args.heads, model)
    prepare_cpu_verify(model, heads, enabled=not args.untuned_cpu)
    decoder = make_decoder(model, heads)
    eos = eos_token_ids(model, tokenizer)
    with open(args.questions) as f:
        prompts = [chat_input_ids(tokenizer, json.loads(line)["turns"][0]) for line in list(f)[: args.prompts]]
    decoder.generate_ids(prompts[0], 16, eos_token_ids=eos)  # warm-up

    step = verify = draft = 0.0
    steps = tokens = 0
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for ids in prompts:
            tokens += len(decoder.generate_ids(ids, args.max_new_tokens, eos_token_ids=eos))
            s = decoder.stats
            step, verify, draft = step + s.step_seconds, verify + s.verify_seconds, draft + s.draft_seconds
            steps += len(s.accepted_lengths)
    print(f"{steps} steps, {tokens} tokens: per step {1000 * step / steps:.1f} ms = tree forward "
          f"{1000 * verify / steps:.1f} + drafting {1000 * draft / steps:.1f} + other {1000 * (step - verify - draft) / steps:.1f} "
          f"ms; step / (forward + draft) = {step / (verify + draft):.3f}")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
