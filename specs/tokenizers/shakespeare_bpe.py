"""Trains specs/tokenizers/shakespeare_bpe.json, the tokenizer of specs/shakespeare_bpe.toml.

A GPT-2-style byte-level BPE (GPT-2's pre-tokenizer regex, byte-level decoder, `<|endoftext|>`
as its one special token) with 1,024 ids, trained by Python's Hugging Face `tokenizers` on the
training plays only (`train.txt`, so Macbeth stays unseen). Deterministic: run again from the
repository root with the same `tokenizers` version (0.23.3 made the checked-in file) and the file
comes out byte for byte the same:

    python3 specs/tokenizers/shakespeare_bpe.py ../shared/data/shakespeare/train.txt
"""

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=1024,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tokenizer.train([sys.argv[1]], trainer)
tokenizer.save("specs/tokenizers/shakespeare_bpe.json")
