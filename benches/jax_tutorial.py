"""JAX reference for `trainrun bench`: the tutorial model's training step, jitted whole.

The strongest CPU peer: XLA fuses the step (forward, backward and the SGD update) into one
computation, so this is the figure trainrun's engine is held against. Same shape as trainrun's
tutorial model (reshape 28×28×1 → conv2d 32 3×3 relu valid → flatten → dense 128 relu →
dense 10, sparse categorical cross-entropy from logits), same seeded random images, same
timing rule (median step time after a warm-up).

    python3 -m pip install "jax[cpu]"
    taskset -c 0,1 python3 benches/jax_tutorial.py --threads 2 --batch 64

Prints one line per configuration, `jax batch B threads T update U ms/step M examples/s E`,
then the same as JSON on the last line.
"""

import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[64])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--momentum", action="store_true", help="SGD with momentum 0.9 instead of plain SGD")
    args = ap.parse_args()
    # XLA reads its flags at import: one intra-op pool of exactly `threads` threads.
    os.environ["XLA_FLAGS"] = (
        f"--xla_cpu_multi_thread_eigen={'true' if args.threads > 1 else 'false'} "
        f"intra_op_parallelism_threads={args.threads}"
    )
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print('skipped: jax is not installed (python3 -m pip install "jax[cpu]")')
        return 0

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)

        def glorot(k, shape, fan_in, fan_out):
            lim = (6.0 / (fan_in + fan_out)) ** 0.5
            return jax.random.uniform(k, shape, jnp.float32, -lim, lim)

        return {
            "conv_k": glorot(k1, (3, 3, 1, 32), 9, 9 * 32),
            "conv_b": jnp.zeros((32,), jnp.float32),
            "d1_k": glorot(k2, (26 * 26 * 32, 128), 26 * 26 * 32, 128),
            "d1_b": jnp.zeros((128,), jnp.float32),
            "d2_k": glorot(k3, (128, 10), 128, 10),
            "d2_b": jnp.zeros((10,), jnp.float32),
        }

    def forward(p, x):
        x = x.reshape((-1, 28, 28, 1))
        y = jax.lax.conv_general_dilated(x, p["conv_k"], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = jax.nn.relu(y + p["conv_b"])
        y = y.reshape((y.shape[0], -1))
        y = jax.nn.relu(y @ p["d1_k"] + p["d1_b"])
        return y @ p["d2_k"] + p["d2_b"]

    def loss_fn(p, x, labels):
        logits = forward(p, x)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    lr, mom = 0.01, 0.9

    @jax.jit
    def sgd_step(p, x, labels):
        g = jax.grad(loss_fn)(p, x, labels)
        return jax.tree_util.tree_map(lambda w, d: w - lr * d, p, g)

    @jax.jit
    def momentum_step(state, x, labels):
        p, v = state
        g = jax.grad(loss_fn)(p, x, labels)
        v = jax.tree_util.tree_map(lambda v, d: mom * v - lr * d, v, g)
        p = jax.tree_util.tree_map(lambda w, v: w + v, p, v)
        return (p, v)

    rows = []
    for batch in args.batch:
        key = jax.random.PRNGKey(7)
        kx, ky = jax.random.split(key)
        x = jax.random.uniform(kx, (batch, 784), jnp.float32)
        labels = jax.random.randint(ky, (batch,), 0, 10)
        params = init(jax.random.PRNGKey(42))
        if args.momentum:
            state = (params, jax.tree_util.tree_map(jnp.zeros_like, params))
            step = momentum_step
        else:
            state = params
            step = sgd_step
        times = []
        for i in range(5 + args.steps):
            t = time.perf_counter()
            state = jax.block_until_ready(step(state, x, labels))
            if i >= 5:
                times.append(time.perf_counter() - t)
        times.sort()
        median = times[len(times) // 2]
        row = {
            "peer": "jax",
            "version": jax.__version__,
            "batch": batch,
            "threads": args.threads,
            "update": "sgd momentum 0.9" if args.momentum else "sgd",
            "ms_per_step": median * 1e3,
            "examples_per_s": batch / median,
        }
        rows.append(row)
        print(
            f"jax batch {batch} threads {args.threads} update {row['update']} "
            f"ms/step {row['ms_per_step']:.2f} examples/s {row['examples_per_s']:.0f}"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
