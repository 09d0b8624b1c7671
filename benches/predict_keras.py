"""Keras reference for `trainrun predict`'s throughput (`trainrun bench --only predict`): the
tutorial CNN of `specs/base/mnist_tutorial.toml` (reshape to 28×28×1, conv2d 32 3×3 relu,
flatten, dense 128 relu, dense 10, then softmax as predict writes probabilities) through
`model.predict` over the 10,000 MNIST test images from `TRAINRUN_DATA_DIR`, in batches of
`--batch` (`model.predict`'s default is 32), on `--threads` threads. Prints one JSON line:
examples/s of a whole `model.predict` call, the best of `--rounds` calls after one warm-up call
(which traces the function; the weights are random: a dense product's speed does not depend on
them).

    python3 -m pip install tensorflow-cpu
    python3 benches/predict_keras.py --threads 2 --batch 32
"""

import argparse
import gzip
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError:
        print("skipped: tensorflow is not installed (python3 -m pip install tensorflow-cpu)")
        return
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    d = os.environ.get("TRAINRUN_DATA_DIR", "../shared/data/mnist")
    gz = os.path.join(d, "t10k-images-idx3-ubyte.gz")
    raw = gzip.open(gz).read() if os.path.exists(gz) else open(os.path.join(d, "t10k-images-idx3-ubyte"), "rb").read()
    x = np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28).astype(np.float32) / 255
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
            tf.keras.layers.Softmax(),
        ]
    )
    model.predict(x, batch_size=a.batch, verbose=0)
    best = 0.0
    for _ in range(a.rounds):
        t = time.perf_counter()
        model.predict(x, batch_size=a.batch, verbose=0)
        best = max(best, len(x) / (time.perf_counter() - t))
    print(json.dumps({"examples_per_s": best, "batch": a.batch, "threads": a.threads}))


if __name__ == "__main__":
    main()
