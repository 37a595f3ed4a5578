"""`python -m sluice` is the `sluice` command (the CUDA compatibility re-exec uses it)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
