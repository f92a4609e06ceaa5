"""`python -m loadtest.bench`: the engine benchmark (engine_bench.py), run beside the product, not by it."""

import argparse
import sys

from loadtest.bench import engine_bench

parser = argparse.ArgumentParser(prog="python -m loadtest.bench", description=engine_bench.__doc__.splitlines()[0])
engine_bench.configure(parser)
sys.exit(int(engine_bench.run(parser.parse_args()) or 0))
