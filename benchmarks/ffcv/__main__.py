"""``python -m benchmarks.ffcv``: :func:`benchmarks.ffcv.compare.main`."""
import sys

from benchmarks.ffcv.compare import main

sys.exit(main())
