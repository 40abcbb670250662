#!/usr/bin/env python3
"""The rounding cost of folding W4A16's -8 offset out of the dequantization (docs/perf-notes.md, Open).

Today a weight reaches the tensor cores as f16((u - 8) s). The fold makes it f16(u s) (one hfma2 on
the 1024 + u the lop3 trick gives: exact, 1024 s is a power-of-two multiple of s) and adds
-8 s X_g afterwards (X_g a token's sum of x over group g). This compares both against the exact
product on random Llama-like shapes (k 4096, group 128, f16 x and scales). Needs numpy.

usage: tools/w4a16_fold_error.py [--n 512] [--k 4096] [--group 128] [--tokens 16]
"""
import argparse

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    groups = args.k // args.group
    u = rng.integers(0, 16, size=(args.n, args.k)).astype(np.float64)
    s = (rng.uniform(0.5, 2.0, size=(args.n, groups)) * 2e-3).astype(np.float16).astype(np.float64)
    s_k = np.repeat(s, args.group, axis=1)
    x = rng.standard_normal((args.tokens, args.k)).astype(np.float16).astype(np.float64)
    exact = x @ ((u - 8) * s_k).T
    today = (x @ ((u - 8) * s_k).astype(np.float16).astype(np.float64).T).astype(np.float32)
    x_g = x.reshape(args.tokens, groups, args.group).sum(axis=2).astype(np.float32)
    folded = (x @ (u * s_k).astype(np.float16).astype(np.float64).T).astype(np.float32) - 8 * (x_g @ s.T.astype(np.float32))

    def errors(y):
        d = y.astype(np.float64) - exact
        return np.abs(d).max() / np.abs(exact).max(), np.sqrt((d ** 2).mean() / (exact ** 2).mean())

    for name, y in (("f16((u - 8) s), today", today), ("f16(u s) - 8 s X_g, folded", folded)):
        worst, rms = errors(y)
        print(f"{name:28s} worst {worst:.2e}  rms {rms:.2e}  (relative to the largest / rms output)")


if __name__ == "__main__":
    main()
