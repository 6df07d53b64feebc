"""`python -m summrl.sweep status|pull|cancel <sweep folder>`: the managed jobs of a sweep (summrl.cloud.sweep)."""

import sys

from summrl.cloud.sweep import main

if __name__ == "__main__":
    sys.exit(main())
