"""Writes a Hugging Face model directory for Dynamo's mocker (`python -m dynamo.mocker
--model-path DIR`): the mocker loads no weights, only `config.json` (its model card: context
length, layers, KV heads for the KV-cache size) and the tokenizer. config.json comes from the
GGUF's own metadata (llama.cpp's `gemma3.*` keys, `Gemma3TextConfig`'s field names in
transformers' models/gemma3/configuration_gemma3.py); the tokenizer files are copied from the
directory gguf-tokenizer.py built (install.sh), so ids match llama.cpp's, and
tokenizer_config.json with Gemma 3's chat template (the frontend refuses a model without one)
from the given file (tests/fixtures/chat_templates/gemma3/).

usage: gguf-model-dir.py MODEL.gguf TOKENIZER_DIR TOKENIZER_CONFIG OUT_DIR
"""
import json
import shutil
import sys
from pathlib import Path

from gguf import GGUFReader


def main() -> None:
    gguf_path, tok_dir, tok_config, out = (Path(a) for a in sys.argv[1:5])
    fields = GGUFReader(gguf_path).fields
    arch = fields["general.architecture"].contents()
    if arch != "gemma3":
        sys.exit(f"gguf-model-dir.py: {gguf_path}: architecture {arch!r}, expected 'gemma3'")

    def meta(key: str):
        return fields[f"{arch}.{key}"].contents()

    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "max_position_embeddings": meta("context_length"),
        "hidden_size": meta("embedding_length"),
        "num_hidden_layers": meta("block_count"),
        "intermediate_size": meta("feed_forward_length"),
        "num_attention_heads": meta("attention.head_count"),
        "num_key_value_heads": meta("attention.head_count_kv"),
        "head_dim": meta("attention.key_length"),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon"),
        "rope_theta": meta("rope.freq_base"),
        "sliding_window": meta("attention.sliding_window"),
        "vocab_size": len(fields["tokenizer.ggml.tokens"].data),
        "bos_token_id": fields["tokenizer.ggml.bos_token_id"].contents(),
        "eos_token_id": fields["tokenizer.ggml.eos_token_id"].contents(),
        "pad_token_id": fields["tokenizer.ggml.padding_token_id"].contents(),
        "torch_dtype": "bfloat16",
    }
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tok_dir / "tokenizer.json", out / "tokenizer.json")
    shutil.copyfile(tok_config, out / "tokenizer_config.json")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
