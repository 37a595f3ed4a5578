"""`python -m benchmarks`: run every benchmark (each also runs alone: python -m benchmarks.NAME)."""

import runpy
import sys

BENCHMARKS = ["benchmarks.train_throughput", "benchmarks.train_llama"]

if __name__ == "__main__":
    for name in BENCHMARKS:
        print(f"=== {name}", flush=True)
        sys.argv = [name]
        runpy.run_module(name, run_name="__main__")
