#!/usr/bin/env python3
"""PyTorch eager reference for src/engine/layers/bench.rs: forward + backward of nanoGPT's CPU
"baby" Shakespeare model (4 layers, 4 heads, n_embd 128, block 64, batch 12, dropout 0), float32,
F.scaled_dot_product_attention, exact GELU, median step over 30 steps after 3 warm-up steps.

    python3 tests/bench/torch_gpt_blocks.py [threads]   # a Python with torch

Compare with `cargo test --release --lib engine::layers::bench -- --ignored --nocapture`, run
alternately in one sitting (the host's timing moves ±30 % run to run).
"""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, DIM, HEADS, LAYERS, VOCAB = 12, 64, 128, 4, 4, 65


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(DIM, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(DIM), Attention(), nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(DIM)

    def forward(self, ids):
        h = self.wte(ids) + self.wpe(torch.arange(SEQ))
        return self.ln_f(self.blocks(h)) @ self.wte.weight.T


def median_step(model, x, steps=30):
    """Median wall-clock forward, backward, step, and the median CPU time of a step (all threads)."""
    dy = torch.randn(model(x).shape)
    rows = []
    for i in range(steps + 3):
        model.zero_grad(set_to_none=False)
        c0, t0 = time.process_time(), time.perf_counter()
        y = model(x)
        t1 = time.perf_counter()
        y.backward(dy)
        t2, c1 = time.perf_counter(), time.process_time()
        if i >= 3:
            rows.append((t1 - t0, t2 - t1, t2 - t0, c1 - c0))
    return [sorted(col)[len(col) // 2] for col in zip(*rows)]


def report(name, model, x, threads):
    f, b, step, cpu = median_step(model, x)
    tokens = BATCH * SEQ
    print(f"torch {name} threads {threads}: fwd+bwd {1e3 * step:7.2f} ms (fwd {1e3 * f:6.2f}, bwd {1e3 * b:6.2f})"
          f" → {tokens / step:7.0f} tokens/s; CPU {1e3 * cpu:7.2f} ms/step → {tokens / cpu:7.0f} tokens/CPU-s",
          flush=True)


if __name__ == "__main__":
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    report("4 blocks", nn.Sequential(*[Block() for _ in range(LAYERS)]), torch.randn(BATCH, SEQ, DIM), threads)
    report("gpt (tied head)", Gpt(), torch.randint(0, VOCAB, (BATCH, SEQ)), threads)
