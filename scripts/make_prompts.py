"""Write prompts beyond chat (code, extraction, math) from offline sources, for self-distillation.

    python scripts/make_prompts.py --out data/prompts/offline-mix.jsonl

The logic is specheads.data.prompt_sources (data/prompt_sources.py).
"""

from specheads.data.prompt_sources import main

if __name__ == "__main__":
    main()
