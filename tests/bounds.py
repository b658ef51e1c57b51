"""Numerical bounds derived from the computation, for tests that compare two runs of the same training whose sums
run in different orders (1 vs 2 processes, DDP vs FSDP, tensor-parallel matmuls): they hold on every CPU's kernels
because they never rest on the digits one machine printed (docs/ci.md)."""

from __future__ import annotations

import math

ADAMW_BETAS = (0.9, 0.999)  # TrainingArguments' defaults (a recipe without train.optimizer_args)
BULK_QUANTILE, BULK_TOL = 0.99, 1e-3  # weights_agree's bulk bound, in units of adam_reach


def adam_reach(steps: int, lr: float, betas: tuple[float, float] = ADAMW_BETAS) -> float:
    """The furthest AdamW (no weight decay) can move one element in `steps` steps at a learning rate of at most
    `lr`, whatever the gradients.

    Step t moves an element by lr * m_t / (sqrt(v_t) + eps) with the bias-corrected moments
    m_t = (1-b1)/(1-b1^t) * sum_i b1^(t-i) g_i and v_t = (1-b2)/(1-b2^t) * sum_i b2^(t-i) g_i^2. Cauchy-Schwarz on
    sum_i (b1^(t-i) / b2^((t-i)/2)) * (b2^((t-i)/2) g_i) bounds |m_t| / sqrt(v_t) by
    rho_t = (1-b1)/(1-b1^t) * sqrt((1-b2^t)/(1-b2)) * sqrt(sum_k<t (b1^2/b2)^k): 1 at t=1, 1.001 at t=2, 1.006 at t=4
    (eps, warmup and gradient clipping only shrink the step). A run's update lies within lr * sum_t rho_t of its
    start (4 steps at lr 1e-2: 0.0401; the largest measured update in tests/distributed/test_runs.py is 0.0401)."""
    b1, b2 = betas
    return lr * sum((1 - b1) / (1 - b1 ** t) * math.sqrt((1 - b2 ** t) / (1 - b2))
                    * math.sqrt(sum((b1 * b1 / b2) ** k for k in range(t))) for t in range(1, steps + 1))


def weights_agree(got: dict, want: dict, base: dict | None, *, steps: int, lr: float) -> None:
    """Two runs of the same AdamW training whose gradients are summed in different orders hold the same weights,
    to a bound derived from the computation rather than from one CPU's digits.

    A different summation order changes a float32 gradient by about its rounding error (n * 2^-24 of the sum of
    |terms|: 1e-6 to 1e-5 relative here), and AdamW's step m/sqrt(v) is scale-free: an element whose gradient is
    well above that level takes the same step to ~1e-5 of a step. An element whose gradient is within rounding of
    zero at some step is different: AdamW divides by sqrt(v) of that near-zero gradient, so the rounding decides its
    step, and it may move anywhere within adam_reach. Which elements those are, and how many (0 to 10 of 8,192 in
    one matrix, by the CPU's kernels), is not a property of the code, so the bound never counts them:
    - every element: |got - want| <= 2 * adam_reach, the most two AdamW runs from one start can differ;
    - the bulk: the 99th percentile of |got - want| over the elements either run moved <= 1e-3 * adam_reach.
      Summation order puts it near 1e-5 of a step (measured, 1 vs 2 processes, full fine-tuning: at most 6.7e-5 *
      adam_reach with AVX-512 kernels, 2.6e-5 with AVX2); a real bug (a rank training alone on its half of the
      batch, a missing all-reduce, a mis-gathered or mis-split matrix) changes every gradient by O(1) and puts it
      near adam_reach (measured for one rank alone: 0.98 to 1.8). Near-zero gradients would need 1% of a tensor's
      elements within 1e-5 of zero to move the percentile.
    `base` (the starting weights) picks the elements that moved; None: all of them (LoRA's A/B all train)."""
    import torch

    reach = adam_reach(steps, lr)
    assert set(got) == set(want) and want
    for name in want:
        diff = (got[name].double() - want[name].double()).abs().flatten()
        assert float(diff.max()) <= 2 * reach, (name, float(diff.max()), 2 * reach)
        if base is not None:
            diff = diff[((want[name] != base[name]) | (got[name] != base[name])).flatten()]
        if diff.numel():
            bulk = float(torch.quantile(diff, BULK_QUANTILE))
            assert bulk <= BULK_TOL * reach, f"{name}: 99% of elements within {bulk:.2e}, bound {BULK_TOL * reach:.2e}"
