"""PyTorch eager reference for `trainrun predict`'s throughput (`trainrun bench --only
predict`): a model of trainrun's under `torch.inference_mode`, softmax included, in batches of
`--batch`, on `--threads` threads. trainrun keeps images channels-last; PyTorch runs NCHW, so
the input is permuted once per batch, as a user porting the model would. `--model`:

- `tutorial` (default): the tutorial CNN of `specs/base/mnist_tutorial.toml` (conv2d 32 3×3
  relu, flatten, dense 128 relu, dense 10) on the 10,000 MNIST test images from
  `TRAINRUN_DATA_DIR` (trainrun's predict batch for this model is 385: its 32 MiB activation
  budget);
- `mnist_fast`: `specs/mnist_fast.toml`'s CNN (conv2d 16 relu, max pool, batch norm, conv2d 32
  relu, max pool, batch norm, flatten, dense 10) on the same images;
- `resnet20`: the zoo's ResNet-20 (as in `benches/predict_keras.py`) on `--examples` random
  32×32×3 images.

Prints one JSON line: examples/s over the whole pass, the best of `--rounds` passes after one
warm-up pass (the model's weights are random: throughput does not depend on them).

    python3 benches/predict_torch.py --threads 2 --batch 385
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
    return np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28, 1).astype(np.float32) / 255


def resnet20(torch):
    nn = torch.nn

    def conv_bn(cin, cout, size, stride):
        pad = size // 2
        return nn.Sequential(nn.Conv2d(cin, cout, size, stride, pad, bias=False), nn.BatchNorm2d(cout, eps=1e-3))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.a, self.b = conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, 1)
            self.shortcut = conv_bn(cin, cout, 1, stride) if stride > 1 else nn.Identity()

        def forward(self, x):
            return torch.relu(self.b(torch.relu(self.a(x))) + self.shortcut(x))

    layers, cin = [conv_bn(3, 16, 3, 1), nn.ReLU()], 16
    for stage in range(3):
        for block in range(3):
            cout, stride = 16 << stage, 2 if stage > 0 and block == 0 else 1
            layers.append(Block(cin, cout, stride))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def model_and_inputs(name, examples, np, torch):
    nn = torch.nn
    if name == "resnet20":
        x = np.random.default_rng(0).random((examples, 32, 32, 3), dtype=np.float32)
        return resnet20(torch), torch.from_numpy(x)
    layers = {
        "tutorial": [nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Flatten(), nn.Linear(26 * 26 * 32, 128), nn.ReLU(),
                     nn.Linear(128, 10)],
        "mnist_fast": [nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.BatchNorm2d(16, eps=1e-3),
                       nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.BatchNorm2d(32, eps=1e-3), nn.Flatten(),
                       nn.Linear(5 * 5 * 32, 10)],
    }[name]
    return nn.Sequential(*layers), torch.from_numpy(mnist_test_images(np))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=385)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", choices=["tutorial", "mnist_fast", "resnet20"], default="tutorial")
    ap.add_argument("--examples", type=int, default=1024, help="random images for resnet20")
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError:
        print("skipped: torch is not installed (see ../shared/tools/torch-cpu-venv.sh)")
        return
    torch.set_num_threads(a.threads)
    model, x = model_and_inputs(a.model, a.examples, np, torch)
    model = model.eval()

    def one_pass():
        out = []
        with torch.inference_mode():
            for i in range(0, len(x), a.batch):
                b = x[i : i + a.batch].permute(0, 3, 1, 2)
                out.append(torch.softmax(model(b), dim=1))
        return torch.cat(out)

    one_pass()
    best = 0.0
    for _ in range(a.rounds):
        t = time.perf_counter()
        one_pass()
        best = max(best, len(x) / (time.perf_counter() - t))
    print(json.dumps({"examples_per_s": best, "batch": a.batch, "threads": a.threads, "model": a.model}))


if __name__ == "__main__":
    main()
