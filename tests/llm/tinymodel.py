"""A tiny causal LM built in-process (no download): a byte-level BPE tokenizer trained on a few
sentences, with a chat template, and a 2-layer Llama of random weights, saved as a local
transformers model directory. Seconds to build; used by the LLM tests and benchmarks/llm.py."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today? I am fine, thank you.",
    "flowserve streams tokens through a graph of nodes",
    "a small model says small things",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def build_tiny_model(path: Path, layers: int = 2, hidden: int = 64, vocab: int = 320, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_llm_model(repo: Path, name: str, model_dir: Path, backend: str = "vllm", **engine: object) -> Path:
    """Triton's vLLM layout: <repo>/<name>/config.pbtxt and 1/model.json (the transformers engine
    unless ``engine`` says otherwise)."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(
        f'backend: "{backend}"\ninstance_group [{{ count: 1 kind: KIND_MODEL }}]\n'
    )
    doc: dict[str, object] = {"engine": "transformers", "model": str(model_dir), **engine}
    if doc["engine"] == "transformers":  # a small KV cache (vLLM sizes its own)
        doc = {"page_size": 16, "num_blocks": 64, **doc}
    (folder / "1" / "model.json").write_text(json.dumps(doc))
    return folder
