"""The low-rank manipulation's top-r correction on a Mistral-7B-sized FFN matrix (14336 x 4096,
float32): the float64 full SVD it used against the small-side Gram matrix (engine), same answer.

Run: python benchmarks/svd_topr.py [--rows 14336] [--cols 4096] [--rank 8]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.experiments.manipulate.run import low_rank


def full_svd(matrix: torch.Tensor, rank: int) -> torch.Tensor:
    """The straightforward version: a float64 SVD of the whole matrix."""
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    return ((u[:, :rank] * s[:rank]) @ vh[:rank]).to(matrix.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=14336)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    # a weight difference: a few strong directions over noise, like two neighbouring layers' gap
    signal = torch.randn(args.rows, 32, generator=generator) @ torch.randn(32, args.cols, generator=generator)
    matrix = 0.02 * torch.randn(args.rows, args.cols, generator=generator) + 0.002 * signal
    times = {}
    for name, fn in (("gram", low_rank), ("full_svd", full_svd)):
        started = time.perf_counter()
        result = fn(matrix, args.rank)
        times[name] = time.perf_counter() - started
        print(f"{name}: {times[name]:.2f} s")
        if name == "gram":
            ours = result
    difference = float((ours.double() - result.double()).norm() / result.double().norm())
    print(f"{args.rows}x{args.cols} float32, rank {args.rank}, torch threads {torch.get_num_threads()}; "
          f"relative difference {difference:.2e}")
    print(f"ratio svd_topr: {times['full_svd'] / times['gram']:.1f}")


if __name__ == "__main__":
    main()
