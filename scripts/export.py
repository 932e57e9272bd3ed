"""Convert trained heads into the format another serving tool loads.

    python scripts/export.py --format vllm-medusa --heads runs/smollm2-135m-medusa1/heads --out exports/vllm-medusa
    python scripts/export.py --format specheads --heads medusa-vicuna-7b-v1.3 --out heads/vicuna   # import

Formats (specheads.heads.export.EXPORTS; one module per format in heads/formats/): merged (Medusa-2 heads: out/model is the base with their LoRA
adapter folded in, out/heads the heads; then `--model out/model --heads out/heads`; the heads folder itself,
with its adapter/ inside, is the adapter-plus-heads form that chat.py and bench.py load as it is), vllm-medusa (config.json + model.safetensors as vLLM's Medusa draft
model reads them; heads that share the base lm_head need it, taken from --model, default the base named in
the heads' config; vLLM cannot load a draft vocabulary, so heads with one go out at the full vocabulary),
faster-decoding (FasterDecoding/Medusa v0.1, the layout TGI loads: config.json + medusa_lm_head.safetensors,
each head with its own projection), specheads (any folder MedusaHeads reads, e.g. FasterDecoding/Medusa v0.1 or vLLM Medusa,
into specheads' own format), and the EAGLE formats vllm-eagle, sglang-eagle (EagleDraft folders of variant
eagle1), vllm-eagle3 (speculators format; --model overrides the verifier it names) and sglang-eagle3 (variant
eagle3). `--format specheads` also turns an exported EAGLE folder back into an EagleDraft folder.
"""

from __future__ import annotations

import argparse

from specheads.heads.export import EXPORTS, export
from specheads.heads.files import check_no_overlap, check_writable
from specheads.heads.weights import UnsafeWeightsError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", required=True, choices=sorted(EXPORTS))
    parser.add_argument("--heads", required=True, help="heads folder to convert")
    parser.add_argument("--out", required=True, help="output folder (created; must be empty unless --overwrite)")
    parser.add_argument("--model", default=None, help="base model (Hub id, folder or built-in name) where the "
                                                      "format needs its weights; default: the heads' base")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    parser.add_argument("--llama-layer", action="store_true",
                        help="vllm-eagle3: give an EAGLE-3 draft with another architecture's layer (old Qwen2-style "
                             "drafts) the Llama layer vLLM builds, dropping its attention biases (a warning names "
                             "them; measure acceptance again)")
    args = parser.parse_args(argv)
    options = {"llama_layer": True} if args.llama_layer else {}
    if options and args.format != "vllm-eagle3":
        parser.error("--llama-layer applies to --format vllm-eagle3 only")
    try:
        # before any work: --out never is, holds or lies inside --heads or a local --model, and can be written
        check_no_overlap(args.out, [("heads folder", args.heads), ("base model", args.model)])
        check_writable(args.out, create=False)
        out = export(args.format, args.heads, args.out, model=args.model, overwrite=args.overwrite, **options)
    except (NotImplementedError, OSError, UnsafeWeightsError, ValueError) as err:  # OSError: a full or read-only disk
        raise SystemExit(f"export.py: {err}") from err
    print(f"wrote {args.format} to {out}")


if __name__ == "__main__":
    main()
