"""Spec sections of the user models the tests train: a tiny HF Llama (GQA), a tiny HF GPT-2 and a
plain nn.Module with a ModuleList of blocks (tests/fixtures/block_models.py)."""

from __future__ import annotations

LLAMA_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}
# Dropout off: every layout draws its own masks, and parity with the reference needs none.
GPT2_CONFIG = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": False}
TEXT = {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 16}

LLAMA_SPEC = {"name": "llama", "model": {"hf": {"model_type": "llama", "config": LLAMA_CONFIG}}, "data": TEXT}
GPT2_SPEC = {"name": "gpt2", "model": {"hf": {"model_type": "gpt2", "config": GPT2_CONFIG}}, "data": TEXT}
TOKEN_MLP_SPEC = {"name": "token-mlp", "data": TEXT,
                  "model": {"entrypoint": "tests.fixtures.block_models:token_mlp", "args": {"width": 32, "depth": 2},
                            "tp_plan": {"layers.*.up": "colwise", "layers.*.down": "rowwise"}}}
GPT_SPEC = {"name": "gpt", "model": {"name": "gpt", "n_layers": 2, "d_model": 32, "n_heads": 4, "seq_len": 16},
            "data": {"name": "text:pystdlib", "max_bytes": 200_000}}
# A tiny Mixtral: 4 experts per layer, 2 per token (transformers' stacked experts and router).
MIXTRAL_CONFIG = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
                  "num_local_experts": 4, "num_experts_per_tok": 2}
MIXTRAL_SPEC = {"name": "mixtral", "model": {"hf": {"model_type": "mixtral", "config": MIXTRAL_CONFIG}}, "data": TEXT}
