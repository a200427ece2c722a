"""Reproducible training of the shipped model: corpus, tokenizer, MoE language model, model card."""
