"""Writes MNIST as Parquet shards the way the Hugging Face Hub lays out an export, for
examples/mnist_parquet.toml: OUT/mnist-parquet/train-0000{0..3}-of-00004.parquet and
test-00000-of-00001.parquet, each row a `pixels` column (784 uint8 values, a fixed-size list)
and a `label` column (int64), row groups of 5,000 rows.

Usage: python3 examples/mnist_to_parquet.py DIR [OUT]
(OUT defaults to DIR) where DIR holds the four MNIST IDX files (train-images-idx3-ubyte.gz, ...); `trainrun` fetches
them into its data folder on a first MNIST run. Needs pyarrow (python3 -m pip install pyarrow).
"""

import gzip
import os
import struct
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4 : 4 + 4 * dims])
    return shape, data[4 + 4 * dims :]


def table(images, labels):
    (n, rows, cols), pixels = idx(images)
    _, classes = idx(labels)
    values = pa.array(memoryview(pixels), type=pa.uint8())
    return pa.table({
        "pixels": pa.FixedSizeListArray.from_arrays(values, rows * cols),
        "label": pa.array(list(classes), type=pa.int64()),
    })


def main():
    src = sys.argv[1]
    out = os.path.join(sys.argv[2] if len(sys.argv) > 2 else src, "mnist-parquet")
    os.makedirs(out, exist_ok=True)
    train = table(os.path.join(src, "train-images-idx3-ubyte.gz"), os.path.join(src, "train-labels-idx1-ubyte.gz"))
    shards = 4
    per = train.num_rows // shards
    for s in range(shards):
        name = f"train-{s:05d}-of-{shards:05d}.parquet"
        pq.write_table(train.slice(s * per, per), os.path.join(out, name), row_group_size=5000)
    test = table(os.path.join(src, "t10k-images-idx3-ubyte.gz"), os.path.join(src, "t10k-labels-idx1-ubyte.gz"))
    pq.write_table(test, os.path.join(out, "test-00000-of-00001.parquet"), row_group_size=5000)
    print(f"wrote {out}: {train.num_rows} training rows in {shards} files, {test.num_rows} test rows")


if __name__ == "__main__":
    main()
