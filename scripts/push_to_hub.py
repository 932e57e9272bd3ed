"""Upload trained draft heads to the Hub, served by vLLM by the repo id, with a generated model card.

    python scripts/push_to_hub.py --heads runs/smollm2-135m-medusa1/heads --repo-id you/smollm2-135m-medusa1
    python scripts/push_to_hub.py --heads runs/smollm2-135m-medusa1/heads --repo-id you/x --dry-run /tmp/upload

Uploaded: at the repo's root the vLLM export the engine tests serve (so `vllm serve BASE --speculative-config
'{"model": "you/repo", ...}'` loads it by id; heads vLLM cannot serve get none, and the card says why); in
specheads/ the heads' config.json, model.safetensors and train_config.json (what `--heads you/repo` loads); and
the card (README.md): base model, license, training config and data, held-out accuracy, tree, the chat and
`vllm serve` commands, measured speed (<run>/bench/results.json). Medusa heads, EAGLE drafts and DFlash drafters.
--dry-run DIR writes exactly the files that would be uploaded and uploads nothing. Token: --token, HF_TOKEN
or `hf auth login`.
"""

from __future__ import annotations

import argparse

from specheads.heads.hub import DEFAULT_COMMIT_MESSAGE, HubUploadError, push_to_hub


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", required=True, help="Medusa heads, EAGLE draft or DFlash drafter folder (any format load_heads reads)")
    parser.add_argument("--repo-id", required=True, help="e.g. you/smollm2-135m-medusa1")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--revision", default=None, help="branch to upload to (created if missing)")
    parser.add_argument("--token", default=None)
    parser.add_argument("--message", default=DEFAULT_COMMIT_MESSAGE, help="commit message")
    parser.add_argument("--train-config", default=None, help="default: <run>/train_config.json")
    parser.add_argument("--bench", default=None, help="bench results.json; default: <run>/bench/results.json")
    parser.add_argument("--model", default=None, help="base model for the vLLM folder (Medusa heads ship its "
                                                      "lm_head); default: the one the heads name")
    parser.add_argument("--dry-run", default=None, metavar="DIR", help="write the files here, upload nothing")
    args = parser.parse_args(argv)
    try:
        where = push_to_hub(args.heads, args.repo_id, private=args.private, revision=args.revision,
                            token=args.token, dry_run_dir=args.dry_run, commit_message=args.message,
                            train_config=args.train_config, bench_results=args.bench, model=args.model)
    except (HubUploadError, FileNotFoundError, FileExistsError, ValueError) as err:
        raise SystemExit(f"push_to_hub.py: {err}") from err
    print(f"wrote the upload to {where} (dry run)" if args.dry_run else f"uploaded: {where}")


if __name__ == "__main__":
    main()
