"""PyTorch reference for `trainrun bench`: `specs/shakespeare_char.toml`'s GPT, trained eagerly.

The same model (zoo `gpt`: token and learned position embeddings, 4 pre-LN blocks of causal
self-attention through `F.scaled_dot_product_attention` and a GELU MLP of ratio 4, a final layer
norm, the output head tied to the token embedding, no bias in the head; GPT-2's initialisation),
the same batch (12 random windows of 64 + 1 characters of `train.txt`), the same char vocabulary
(the sorted characters of `train.txt`), the same AdamW (1e-3, betas 0.9/0.99, epsilon 1e-7 as
Keras's default that trainrun keeps, weight decay 0.1 on tensors of rank ≥ 2 only), the same
schedule (linear warmup from 0 over 100 steps, cosine to 1e-4 at step 2,000), global-norm
clipping at 1.0, and the same validation (the mean loss over every position of Macbeth's
non-overlapping 65-character windows). Run it with a Python that has torch (`trainrun bench`
runs the one `TRAINRUN_BENCH_PYTHON` names):

    python3 -m pip install torch
    python3 benches/gpt_torch.py --threads 2
    python3 benches/gpt_torch.py --steps 200 --throughput-only

Prints progress lines, then one JSON line: steady tokens/s (steps after the first 10, evaluation
excluded), the final validation loss, launch-to-exit seconds, seconds from launch to the first
evaluation at or below `--target` (when given; `--eval-every` sets how often it evaluates), and
peak RSS in MB. Launch is this script's first line, so the import of torch counts, as trainrun's
start-up does. OpenMP keeps its own defaults unless the caller sets `OMP_WAIT_POLICY` (see below).
"""

import time

LAUNCHED = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=os.path.join(os.path.dirname(__file__), "../../shared/data/shakespeare"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2000, help="optimizer steps (the schedule spans 2,000 regardless)")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps besides the end (0: end only)")
    ap.add_argument("--target", type=float, default=None, help="report the time to this validation loss")
    ap.add_argument("--throughput-only", action="store_true", help="no validation, only tokens/s")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--bf16", action="store_true", help="forward and loss under torch.autocast(cpu, bfloat16)")
    args = ap.parse_args()
    # OpenMP's default wait policy (threads spin a while between parallel regions) is PyTorch's
    # best on a quiet machine: 16,500 tokens/s on the 2-core reference machine against 10,700
    # with OMP_WAIT_POLICY=PASSIVE (2026-11-24, load < 2.5). On a loaded machine the spinning
    # threads stall instead (380 tokens/s at load 8, where PASSIVE kept 4,800): set
    # OMP_WAIT_POLICY=PASSIVE there. `trainrun bench` is meant to run on a quiet machine.
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("skipped: torch is not installed (set TRAINRUN_BENCH_PYTHON to a Python with torch)")
        return 0
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)

    with open(os.path.join(args.data_dir, "train.txt"), encoding="utf-8") as f:
        train_text = f.read()
    with open(os.path.join(args.data_dir, "val.txt"), encoding="utf-8") as f:
        val_text = f.read()
    chars = sorted(set(train_text))
    index = {c: i for i, c in enumerate(chars)}
    train = torch.tensor([index[c] for c in train_text], dtype=torch.long)
    val = torch.tensor([index[c] for c in val_text], dtype=torch.long)
    vocab, block, batch = len(chars), args.block, args.batch

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.n_embd
            self.ln_1 = nn.LayerNorm(d, eps=1e-5)
            self.qkv = nn.Linear(d, 3 * d)
            self.attn_out = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d, eps=1e-5)
            self.fc = nn.Linear(d, 4 * d)
            self.proj = nn.Linear(4 * d, d)

        def forward(self, x):
            n, t, d = x.shape
            h = args.n_head
            q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(n, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_out(y.transpose(1, 2).reshape(n, t, d))
            return x + self.proj(F.gelu(self.fc(self.ln_2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, args.n_embd)
            self.wpe = nn.Embedding(block, args.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(args.n_layer))
            self.ln_f = nn.LayerNorm(args.n_embd, eps=1e-5)
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * args.n_layer) if name.endswith(("attn_out.weight", "proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            return self.ln_f(x) @ self.wte.weight.t()

    model = Gpt()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    base_lr, final_lr, warmup, total = 1e-3, 1e-4, 100, 2000
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=base_lr,
        betas=(0.9, 0.99),
        eps=1e-7,
    )

    def lr_at(step):
        if step < warmup:
            return base_lr * step / warmup
        t = min((step - warmup) / (total - warmup), 1.0)
        alpha = final_lr / base_lr
        return base_lr * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * t)) + alpha)

    val_windows = (len(val) - (block + 1)) // block + 1
    val_starts = torch.arange(val_windows) * block

    @torch.no_grad()
    def evaluate():
        model.eval()
        total_loss, rows = 0.0, 0
        for s in val_starts.split(256):
            w = torch.stack([val[i : i + block + 1] for i in s.tolist()])
            logits = model(w[:, :-1])
            total_loss += F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1), reduction="sum").item()
            rows += w.shape[0] * block
        model.train()
        return total_loss / rows

    gen = torch.Generator().manual_seed(args.seed)
    steady_from = min(args.steps // 5, 10)
    steady_s, steady_tokens = 0.0, 0
    reached, val_loss, loss = None, None, float("nan")
    for step in range(args.steps):
        started = time.perf_counter()
        starts = torch.randint(len(train) - block, (batch,), generator=gen)
        w = torch.stack([train[i : i + block + 1] for i in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(w[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        loss = loss.item()
        took = time.perf_counter() - started
        if step >= steady_from:
            steady_s += took
            steady_tokens += batch * block
        done = step + 1
        if (done % 100) == 0:
            print(f"step {done} loss {loss:.4f} {steady_tokens / max(steady_s, 1e-9):.0f} tokens/s", flush=True)
        last = done == args.steps
        if not args.throughput_only and (last or (args.eval_every and done % args.eval_every == 0)):
            val_loss = evaluate()
            at = time.perf_counter() - LAUNCHED
            print(f"step {done} val_loss {val_loss:.4f} at {at:.1f} s", flush=True)
            if reached is None and args.target is not None and val_loss <= args.target:
                reached = at
                break
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result = {
        "tokens_per_s": steady_tokens / max(steady_s, 1e-9),
        "train_loss": loss,
        "val_loss": val_loss,
        "wall_s": time.perf_counter() - LAUNCHED,
        "time_to_target_s": reached,
        "peak_rss_mb": peak,
        "threads": args.threads,
        "bf16": args.bf16,
        "params": sum(p.numel() for p in model.parameters()),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
