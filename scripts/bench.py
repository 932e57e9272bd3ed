"""Benchmark decoding methods on the same questions in one process: see `python scripts/bench.py --help`
(the benchmark lives in specheads.inference.bench)."""

from specheads.inference.bench import main

if __name__ == "__main__":
    main()
