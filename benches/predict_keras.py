"""Keras reference for `trainrun predict`'s throughput (`trainrun bench --only predict`): a
model of trainrun's through `model.predict`, in batches of `--batch` (`model.predict`'s default
is 32), on `--threads` threads, softmax included as predict writes probabilities. `--model`:

- `tutorial` (default): the tutorial CNN of `specs/base/mnist_tutorial.toml` (reshape to
  28×28×1, conv2d 32 3×3 relu, flatten, dense 128 relu, dense 10) on the 10,000 MNIST test
  images from `TRAINRUN_DATA_DIR`;
- `mnist_fast`: `specs/mnist_fast.toml`'s CNN (conv2d 16 relu, max pool, batch norm, conv2d 32
  relu, max pool, batch norm, flatten, dense 10) on the same images;
- `resnet20`: the zoo's ResNet-20 (He et al.'s CIFAR ResNet: a 3×3 stem of 16 filters, three
  stages of three basic blocks of 16, 32, 64 filters, the second and third starting with stride
  2 through a 1×1 projection, global average pooling, dense 10) on `--examples` random
  32×32×3 images (no CIFAR files here; a dense product's speed does not depend on the values).

Prints one JSON line: examples/s of a whole `model.predict` call, the best of `--rounds` calls
after one warm-up call (which traces the function; the weights are random, as above).

    python3 -m pip install tensorflow-cpu
    python3 benches/predict_keras.py --threads 2 --batch 32 --model mnist_fast
"""

import argparse
import gzip
import json
import os
import time


def mnist_test_images(np):
    d = os.environ.get("TRAINRUN_DATA_DIR", "../shared/data/mnist")
    gz = os.path.join(d, "t10k-images-idx3-ubyte.gz")
    raw = gzip.open(gz).read() if os.path.exists(gz) else open(os.path.join(d, "t10k-images-idx3-ubyte"), "rb").read()
    return np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28).astype(np.float32) / 255


def resnet20(tf):
    L = tf.keras.layers

    def conv(filters, size, stride, x):
        return L.Conv2D(filters, size, strides=stride, padding="same", use_bias=False)(x)

    def bn(x):
        return L.BatchNormalization(momentum=0.99, epsilon=1e-3)(x)

    inputs = tf.keras.Input(shape=(32, 32, 3))
    x = L.ReLU()(bn(conv(16, 3, 1, inputs)))
    for stage in range(3):
        for block in range(3):
            filters, stride = 16 << stage, 2 if stage > 0 and block == 0 else 1
            y = L.ReLU()(bn(conv(filters, 3, stride, x)))
            y = bn(conv(filters, 3, 1, y))
            shortcut = bn(conv(filters, 1, stride, x)) if stride > 1 else x
            x = L.ReLU()(L.Add()([y, shortcut]))
    x = L.Dense(10)(L.GlobalAveragePooling2D()(x))
    return tf.keras.Model(inputs, L.Softmax()(x))


def model_and_inputs(name, examples, np, tf):
    L = tf.keras.layers
    if name == "resnet20":
        x = np.random.default_rng(0).random((examples, 32, 32, 3), dtype=np.float32)
        return resnet20(tf), x
    head = [L.InputLayer(shape=(28, 28)), L.Reshape(target_shape=(28, 28, 1))]
    layers = {
        "tutorial": [L.Conv2D(32, 3, activation="relu"), L.Flatten(), L.Dense(128, activation="relu"), L.Dense(10)],
        "mnist_fast": [
            L.Conv2D(16, 3, activation="relu"),
            L.MaxPooling2D(),
            L.BatchNormalization(),
            L.Conv2D(32, 3, activation="relu"),
            L.MaxPooling2D(),
            L.BatchNormalization(),
            L.Flatten(),
            L.Dense(10),
        ],
    }[name]
    return tf.keras.Sequential(head + layers + [L.Softmax()]), mnist_test_images(np)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", choices=["tutorial", "mnist_fast", "resnet20"], default="tutorial")
    ap.add_argument("--examples", type=int, default=1024, help="random images for resnet20")
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
    model, x = model_and_inputs(a.model, a.examples, np, tf)
    model.predict(x, batch_size=a.batch, verbose=0)
    best = 0.0
    for _ in range(a.rounds):
        t = time.perf_counter()
        model.predict(x, batch_size=a.batch, verbose=0)
        best = max(best, len(x) / (time.perf_counter() - t))
    print(json.dumps({"examples_per_s": best, "batch": a.batch, "threads": a.threads, "model": a.model}))


if __name__ == "__main__":
    main()
