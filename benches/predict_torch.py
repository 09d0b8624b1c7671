"""PyTorch eager reference for `trainrun predict`'s throughput: the tutorial CNN of
`specs/base/mnist_tutorial.toml` (reshape to 28×28×1, conv2d 32 3×3 relu, flatten, dense 128
relu, dense 10), channels-last weights as trainrun keeps them (PyTorch runs NCHW, so the input
is permuted once per batch, as a user porting the model would), over the 10,000 MNIST test
images from `TRAINRUN_DATA_DIR`, in batches of `--batch` (trainrun's predict batch for this
model is 385: its 32 MiB activation budget), under `torch.inference_mode`, softmax included.
Prints one JSON line: examples/s over the whole pass, the best of `--rounds` passes after one
warm-up pass (the model's weights are random: throughput does not depend on them).

    python3 benches/predict_torch.py --threads 2 --batch 385
"""

import argparse
import gzip
import json
import os
import time



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=385)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError:
        print("skipped: torch is not installed (see ../shared/tools/torch-cpu-venv.sh)")
        return
    torch.set_num_threads(a.threads)
    d = os.environ.get("TRAINRUN_DATA_DIR", "../shared/data/mnist")
    gz = os.path.join(d, "t10k-images-idx3-ubyte.gz")
    raw = gzip.open(gz).read() if os.path.exists(gz) else open(os.path.join(d, "t10k-images-idx3-ubyte"), "rb").read()
    x = torch.from_numpy(np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28, 1).astype(np.float32) / 255)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(26 * 26 * 32, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    ).eval()

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
    print(json.dumps({"examples_per_s": best, "batch": a.batch, "threads": a.threads}))


if __name__ == "__main__":
    main()
