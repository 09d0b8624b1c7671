"""The Python peers of `trainrun bench --only corpus` (src/bench/corpus.rs), one measurement a
process so the bench can alternate trainrun and Python: the corpus is a UTF-8 file cut into
documents at every blank line ("\n\n"), exactly as the bench cuts it.

  tiktoken --corpus F --ranks R      GPT-2's encoding (the ranks as the bench wrote them from
                                     trainrun's bundled ones: one hex token a line, the line
                                     its rank, so nothing is downloaded), encode_ordinary_batch
                                     on 2 threads
  tokenizers --corpus F --tokenizer T   tokenizers' encode_batch (and encode_batch_fast where
                                     it exists), add_special_tokens=False, RAYON_NUM_THREADS=2
  write-parquet --corpus F --out P   the documents as a `text` column, pq.write_table's defaults
  pyarrow --parquet P                iter_batches over the `text` column, 2 threads

Each prints one JSON line last; a missing package prints "skipped: …" instead and exits 3.
Only the work is timed: not the interpreter's start, the imports or loading the tokenizer.
"""

import argparse
import json
import os
import sys
import time


def need(module):
    try:
        return __import__(module)
    except ImportError as e:
        print(f"skipped: {sys.executable} cannot import {module} ({e}); python3 -m pip install {module}")
        sys.exit(3)


def documents(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read().split("\n\n")


def tiktoken_row(args):
    tiktoken = need("tiktoken")
    from tiktoken_ext import openai_public

    with open(args.ranks, encoding="ascii") as f:
        ranks = {bytes.fromhex(line): rank for rank, line in enumerate(f.read().split())}
    # r50k_base's pattern and special token, with the bench's ranks instead of a download.
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    enc = tiktoken.Encoding(**openai_public.r50k_base())
    docs = documents(args.corpus)
    enc.encode_ordinary_batch(docs[:100], num_threads=2)
    start = time.perf_counter()
    tokens = sum(len(ids) for ids in enc.encode_ordinary_batch(docs, num_threads=2))
    print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}))


def tokenizers_row(args):
    os.environ.setdefault("RAYON_NUM_THREADS", "2")
    tokenizers = need("tokenizers")
    t = tokenizers.Tokenizer.from_file(args.tokenizer)
    docs = documents(args.corpus)
    t.encode_batch(docs[:100], add_special_tokens=False)
    row = {}
    for how in ["encode_batch", "encode_batch_fast"]:
        if not hasattr(t, how):
            continue
        start = time.perf_counter()
        tokens = sum(len(e.ids) for e in getattr(t, how)(docs, add_special_tokens=False))
        row[how] = {"tokens": tokens, "seconds": time.perf_counter() - start}
    print(json.dumps(row))


def write_parquet(args):
    need("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = documents(args.corpus)
    pq.write_table(pa.table({"text": docs}), args.out)
    meta = pq.ParquetFile(args.out).metadata
    print(json.dumps({"rows": meta.num_rows, "row_groups": meta.num_row_groups}))


def pyarrow_row(args):
    pa = need("pyarrow")
    import pyarrow.parquet as pq

    pa.set_cpu_count(2)
    start = time.perf_counter()
    rows = nbytes = 0
    for batch in pq.ParquetFile(args.parquet).iter_batches(columns=["text"]):
        rows += batch.num_rows
        nbytes += batch.column(0).nbytes
    print(json.dumps({"rows": rows, "bytes": nbytes, "seconds": time.perf_counter() - start}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("row", choices=["tiktoken", "tokenizers", "write-parquet", "pyarrow"])
    p.add_argument("--corpus")
    p.add_argument("--ranks")
    p.add_argument("--tokenizer")
    p.add_argument("--out")
    p.add_argument("--parquet")
    args = p.parse_args()
    {"tiktoken": tiktoken_row, "tokenizers": tokenizers_row, "write-parquet": write_parquet, "pyarrow": pyarrow_row}[
        args.row
    ](args)


if __name__ == "__main__":
    main()
