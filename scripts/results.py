"""Regenerate the results pages (README summary, docs/results.md) from finished runs: see --help
(the code lives in specheads.inference.bench.results)."""

from specheads.inference.bench.results import main

if __name__ == "__main__":
    main()
