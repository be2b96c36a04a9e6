"""The first-call benchmark from a checkout: ipcshare/bench/first_call.py says what it
times; ``python tools/first_call_bench.py --help``."""

import sys

from ipcshare.bench.first_call import main

if __name__ == "__main__":
    sys.exit(main())
