"""TensorFlow reference for `trainrun bench`: time to 98 % test accuracy with the tutorial model.

The peers' settings, as `specs/bench/tta_single.toml`: Keras, the tutorial model (reshape
28×28×1 → conv2d 32 3×3 relu → flatten → dense 128 relu → dense 10, logits), SGD 0.05 with
momentum 0.9, batch 64, MNIST scaled to [0, 1] and shuffled every epoch, the whole test split
evaluated every 200 steps, stopping at the first evaluation at or above the target. The clock
starts when this script starts (before TensorFlow is imported), as `trainrun bench` times a
job from launch to exit.

    python3 -m pip install tensorflow-cpu
    taskset -c 0,1 python3 benches/tf_tta.py --data ../shared/data/mnist

Prints `tf tta target T reached R at step S wall_s W` and the same as JSON on the last line.
"""

import time

LAUNCHED = time.perf_counter()

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def idx(path):
    import numpy as np

    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("TRAINRUN_DATA_DIR", "../shared/data/mnist"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.98)
    ap.add_argument("--every", type=int, default=200)
    ap.add_argument("--max-steps", type=int, default=5 * 937)
    ap.add_argument("--seed", type=int, default=42, help="weights and data order (trainrun's run.seed)")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError:
        print("skipped: tensorflow is not installed (python3 -m pip install tensorflow-cpu)")
        return 0
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.keras.utils.set_random_seed(args.seed)

    f = lambda name: os.path.join(args.data, name)  # noqa: E731
    x_train = idx(f("train-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y_train = idx(f("train-labels-idx1-ubyte.gz")).astype(np.int64)
    x_test = idx(f("t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y_test = idx(f("t10k-labels-idx1-ubyte.gz")).astype(np.int64)

    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        metrics=["accuracy"],
    )

    class StopAtTarget(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps, self.reached = 0, 0.0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps % args.every == 0:
                _, acc = self.model.evaluate(x_test, y_test, batch_size=1000, verbose=0)
                self.reached = acc
                if acc >= args.target or self.steps >= args.max_steps:
                    self.model.stop_training = True

    stop = StopAtTarget()
    epochs = -(-args.max_steps // (len(x_train) // 64))
    model.fit(x_train, y_train, batch_size=64, epochs=epochs, shuffle=True, verbose=0, callbacks=[stop])
    wall = time.perf_counter() - LAUNCHED
    row = {
        "peer": "tensorflow",
        "version": tf.__version__,
        "target": args.target,
        "reached": stop.reached,
        "seed": args.seed,
        "steps": stop.steps,
        "wall_s": wall,
    }
    print(f"tf tta target {args.target} reached {stop.reached:.4f} at step {stop.steps} wall_s {wall:.2f}")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
