"""Regenerate the assistant turns of a ShareGPT-format dataset with the base model itself.

    python scripts/self_distill.py --model smollm2-135m-instruct --dataset sharegpt \
        --out runs/distill/smollm2-sharegpt.jsonl --limit 1000 --max-new-tokens 256

Resumable (a rerun skips the conversations already written). The logic is specheads.data.distill (data/distill.py).
"""

from specheads.data.distill import main

if __name__ == "__main__":
    main()
