"""Build the best static tree for Medusa heads on this machine and store it with them: see --help
(the code lives in specheads.inference.tuning.medusa_tree)."""

from specheads.inference.tuning.medusa_tree import main

if __name__ == "__main__":
    main()
