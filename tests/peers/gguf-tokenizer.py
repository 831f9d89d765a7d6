#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json, ...) from a
GGUF file's metadata: the PyPI `gguf` package reads the metadata, transformers' own GGUF
tokenizer converter (`integrations.gguf.gguf_tokenizer_mapping`, transformers 5) builds the
tokenizer. No torch (transformers' GGUF reader imports torch; `gguf`'s does not).

usage: gguf-tokenizer.py MODEL.gguf OUT_DIR

The peers of the client benchmark (GuideLLM, AIPerf) cannot fetch a tokenizer from the Hugging
Face hub here; they get this directory instead.
"""
import sys
from pathlib import Path

from gguf import GGUFReader
from transformers import PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    _SPECIAL_TOKENS,
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

model, out = Path(sys.argv[1]), Path(sys.argv[2])
reader = GGUFReader(str(model))
metadata = {name: field.contents() for name, field in reader.fields.items() if name.startswith(("tokenizer.", "general."))}
architecture = metadata["general.architecture"]
grouped = {
    group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
    for group, renames in GGUF_TOKENIZER_MAPPING.items()
}
tokenizer_dict, config = grouped["tokenizer"], grouped["tokenizer_config"]
for name, key in _SPECIAL_TOKENS.items():
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    if token_id is not None:
        config[name] = tokenizer_dict["tokens"][token_id]
backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
tok = PreTrainedTokenizerFast(tokenizer_object=backend, **config)
out.mkdir(parents=True, exist_ok=True)
tok.save_pretrained(str(out))
text = "Hello world, this is a test."
print(f"{architecture} tokenizer, {len(tok)} tokens -> {out}; {text!r} = {tok(text, add_special_tokens=False)['input_ids']}")
