"""Pick an EAGLE draft's dynamic-tree shape for this machine and store it with the draft: see --help
(the code lives in specheads.inference.tuning.eagle_tree)."""

from specheads.inference.tuning.eagle_tree import main

if __name__ == "__main__":
    main()
