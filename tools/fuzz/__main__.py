"""``python -m tools.fuzz``: see ``tools.fuzz.cli``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
