"""The text files of the canary checkpoint: tokenizer.json, tokenizer_config.json,
config.json, generation_config.json. Every one is written with sorted keys so that two
builds are byte-identical."""

from __future__ import annotations

import json

from kvdiag.canary import design as D
from kvdiag.canary.vocab import EOT, IM_END, IM_START, ROLES, SPECIAL, Vocab, canary_words, token

# ChatML without newlines: "<|im_start|>user word word<|im_end|>". Canary words are
# space-prefixed BPE tokens, so the template puts one space before the (trimmed) content and
# none anywhere else; the generation prompt ends with the bare token "assistant".
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] }}"
    "{%- if message['content'] | trim %}{{- ' ' + message['content'] | trim }}{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant' }}{%- endif %}"
)

# Qwen2's pre-tokenizer regex (what transformers' Qwen2Tokenizer rebuilds in any case)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def dumps(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def tokenizer_dict(vocab: Vocab) -> dict:
    """tokenizer.json, written out field by field (not via a library's serialiser, whose
    format changes between versions) in Qwen2's layout: NFC, Qwen2 regex split, byte-level."""
    byte_level = {"add_prefix_space": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": vocab.ids[t], "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True} for t in SPECIAL],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", **byte_level, "trim_offsets": False},
        "decoder": {"type": "ByteLevel", **byte_level, "trim_offsets": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(vocab.tokens) if t not in SPECIAL},
                  "merges": [list(m) for m in vocab.merges]},
    }


def check_words(tok, vocab: Vocab) -> None:
    """Every canary word must be one token after a space, every role word one bare token."""
    words = [w for w in canary_words()]
    enc = tok.encode_batch([" " + w for w in words], add_special_tokens=False)
    bad = [w for w, e in zip(words, enc) if e.ids != [vocab.ids[token(w)]]]
    bad += [r for r in ROLES if tok.encode(r, add_special_tokens=False).ids != [vocab.ids[r]]]
    if bad:
        raise RuntimeError(f"canary words that do not tokenize to one token: {bad[:10]}")


def tokenizer_json(vocab: Vocab) -> str:
    from tokenizers import Tokenizer

    text = dumps(tokenizer_dict(vocab))
    check_words(Tokenizer.from_str(text), vocab)
    return text


def tokenizer_config(vocab: Vocab) -> str:
    return dumps({
        # transformers 5 loads every model_type qwen2 tokenizer as Qwen2Tokenizer, which
        # rebuilds this very BPE from tokenizer.json; say so rather than pretend otherwise
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(vocab.ids[t]): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True} for t in SPECIAL},
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": EOT,
        "unk_token": None,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": D.MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    })


def model_config(vocab: Vocab) -> str:
    ids = vocab.ids
    return dumps({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": len(vocab),
        "hidden_size": D.HIDDEN,
        "intermediate_size": D.INTERMEDIATE,
        "num_hidden_layers": 2,
        "num_attention_heads": D.NUM_HEADS,
        "num_key_value_heads": D.NUM_KV_HEADS,
        "head_dim": D.HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": D.MAX_POSITIONS,
        "rms_norm_eps": 1e-06,
        # transformers 5 reads rope_parameters; older readers (and vLLM) rope_theta
        "rope_theta": D.ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": D.ROPE_THETA},
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": [ids[IM_END], ids[EOT]],
        "pad_token_id": ids[EOT],
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    })


def generation_config(vocab: Vocab) -> str:
    ids = vocab.ids
    return dumps({
        "eos_token_id": [ids[IM_END], ids[EOT]],
        "pad_token_id": ids[EOT],
        "bos_token_id": None,
        "do_sample": False,
    })
