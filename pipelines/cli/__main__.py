"""`python -m pipelines.cli`: the `cdc` command (what `cdc run` starts its stream with)."""

from pipelines.cli import main

if __name__ == "__main__":  # importing this module (a walk over the packages) runs nothing
    main()
