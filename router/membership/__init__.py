"""The workers: adding and removing them, their info, health and tokenizer checks, and the KV-cache events that
fill the committed tables."""
