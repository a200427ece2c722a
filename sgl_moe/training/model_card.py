"""Measure the shipped model and write its model card (``MODEL_CARD.md`` + ``model_card.json``).

    python -m sgl_moe.training.model_card sgl_moe/models/tiny-qwen3-moe

Figures, all on held-out stdlib files (never trained on):
- perplexity of the model against a unigram baseline (train-set token frequencies, add-one smoothed);
- per-layer expert-load entropy of the top-k assignments (bits; the maximum is log2 E);
- how often a layer's top-1 expert is guessed from the previous layer's top-1 (a successor table
  fit on training tokens), against always guessing the layer's most frequent top-1 expert.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def _router_choices(model, stream, seq_len: int, max_tokens: int):
    """Per layer: top-k expert ids [N, k] for up to max_tokens tokens; and total NLL / count."""
    import torch

    top_k = model.config.num_experts_per_tok
    n_layers = model.config.num_hidden_layers
    choices: list[list] = [[] for _ in range(n_layers)]
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, min(len(stream), max_tokens) - seq_len, seq_len):
            ids = torch.tensor(stream[start : start + seq_len + 1]).unsqueeze(0)
            out = model(input_ids=ids[:, :-1], output_router_logits=True)
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            nll -= logp.gather(-1, ids[:, 1:].unsqueeze(-1)).sum().item()
            count += seq_len
            for layer, logits in enumerate(out.router_logits):
                choices[layer].append(torch.topk(logits.reshape(-1, logits.shape[-1]), top_k, dim=-1).indices)
    return [torch.cat(c) for c in choices], nll, count


def measure(model_dir: Path, max_heldout_tokens: int = 200_000, max_fit_tokens: int = 200_000) -> dict:
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3MoeForCausalLM

    from sgl_moe.training.corpus import load_corpus, tokenize_docs

    torch.set_num_threads(2)
    model = Qwen3MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = model.config
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    corpus = load_corpus()
    train_stream = tokenize_docs(tok, corpus.train, eos_id=2)
    heldout_stream = tokenize_docs(tok, corpus.heldout, eos_id=2)

    counts = torch.bincount(torch.tensor(train_stream), minlength=cfg.vocab_size).double() + 1.0
    unigram_logp = torch.log(counts / counts.sum())
    seq_len = 512
    held_choices, nll, n = _router_choices(model, heldout_stream, seq_len, max_heldout_tokens)
    # The unigram baseline is scored on exactly the tokens the model predicted.
    n_windows = n // seq_len
    tgt = torch.cat([torch.tensor(heldout_stream[w * seq_len + 1 : (w + 1) * seq_len + 1]) for w in range(n_windows)])
    unigram_nll = -unigram_logp[tgt].sum().item()

    # Successor tables are fit on training tokens (a sample from the start of the stream).
    fit_choices, _, _ = _router_choices(model, train_stream, seq_len, max_fit_tokens)
    E = cfg.num_experts
    layers = []
    for layer in range(cfg.num_hidden_layers):
        assign = held_choices[layer].reshape(-1)
        load = torch.bincount(assign, minlength=E).double()
        p = load / load.sum()
        entropy = -(p[p > 0] * torch.log2(p[p > 0])).sum().item()
        row = {"layer": layer, "load_entropy_bits": round(entropy, 3), "max_entropy_bits": round(math.log2(E), 3),
               "max_over_mean_load": round((load.max() / load.mean()).item(), 3)}
        if layer > 0:
            prev_fit, cur_fit = fit_choices[layer - 1][:, 0], fit_choices[layer][:, 0]
            table = torch.zeros(E, E, dtype=torch.long)
            table.index_put_((prev_fit, cur_fit), torch.ones_like(prev_fit), accumulate=True)
            guess2 = torch.topk(table, 2, dim=1).indices  # two most frequent successors per expert
            majority = torch.bincount(cur_fit, minlength=E).argmax()
            prev_h, cur_h = held_choices[layer - 1][:, 0], held_choices[layer][:, 0]
            row["top1_from_prev_acc"] = round((guess2[prev_h, 0] == cur_h).double().mean().item(), 4)
            row["top1_from_prev_acc_at2"] = round((guess2[prev_h] == cur_h[:, None]).any(1).double().mean().item(), 4)
            row["top1_majority_baseline_acc"] = round((cur_h == majority).double().mean().item(), 4)
        layers.append(row)

    params = sum(p.numel() for p in model.parameters())
    active = params - (cfg.num_hidden_layers * (E - cfg.num_experts_per_tok) * 3 * cfg.hidden_size
                       * cfg.moe_intermediate_size)
    training = json.loads((model_dir / "training.json").read_text()) if (model_dir / "training.json").exists() else {}
    return {
        "architecture": "Qwen3MoeForCausalLM",
        "parameters": params,
        "active_parameters_per_token": active,
        "weights_file_bytes": (model_dir / "model.safetensors").stat().st_size,
        "config": {k: getattr(cfg, k) for k in ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                                                "moe_intermediate_size", "router_aux_loss_coef"]},
        "corpus": {"train_files": len(corpus.train), "train_chars": corpus.train_chars,
                   "train_tokens": len(train_stream),
                   "heldout_files": len(corpus.heldout), "heldout_tokens": len(heldout_stream)},
        "heldout_tokens_scored": n,
        "heldout_perplexity": round(math.exp(nll / n), 3),
        "unigram_perplexity": round(math.exp(unigram_nll / n), 3),
        "layers": layers,
        "training": {k: training.get(k) for k in ["train_seconds", "tokenizer_seconds", "train_tokens_seen",
                                                  "train_config"]},
    }


def render(card: dict, model_dir: Path) -> str:
    import platform
    import sys

    c, t = card["config"], card["training"]
    tc = t.get("train_config") or {}
    lines = [
        f"# {model_dir.name}", "",
        "A small Mixture-of-Experts language model in the Qwen3-MoE architecture, trained from scratch on the",
        "Python standard library's sources by `sgl_moe.training.train`. It exists so that the whole serving",
        "stack (SGLang workers, router, runtime patches) runs for real on a 2-core CPU. It is not useful for",
        "anything but testing and measuring the system.", "",
        "## Reproduce", "",
        "```", f"python -m sgl_moe.training.train --out sgl_moe/models/{model_dir.name} --steps {tc.get('steps')} "
        f"--seed {tc.get('seed')}", "```", "",
        f"Measured with Python {sys.version.split()[0]} ({platform.machine()}); the corpus is that Python's stdlib,",
        "so another patch version gives a slightly different corpus: add `--corpus-root` with that version's stdlib",
        "directory to read it from another interpreter.", "",
        "## Shape", "",
        "| | |", "|---|---|",
        f"| layers (all MoE) | {c['num_hidden_layers']} |",
        f"| hidden / heads / kv heads / head dim | {c['hidden_size']} / {c['num_attention_heads']} / "
        f"{c['num_key_value_heads']} / {c['head_dim']} |",
        f"| experts / top-k / expert intermediate | {c['num_experts']} / {c['num_experts_per_tok']} / "
        f"{c['moe_intermediate_size']} |",
        f"| vocabulary (sentencepiece BPE, byte fallback) | {c['vocab_size']} |",
        f"| parameters / active per token | {card['parameters'] / 1e6:.2f} M / "
        f"{card['active_parameters_per_token'] / 1e6:.2f} M |",
        f"| weights file (bf16; served in fp32) | {card['weights_file_bytes'] / 1e6:.1f} MB |",
        f"| load-balancing loss coefficient | {c['router_aux_loss_coef']} |", "",
        "## Corpus and training", "",
        f"- Corpus: `.py` files of the stdlib (tests excluded), {card['corpus']['train_files']} train files "
        f"({card['corpus']['train_chars'] / 1e6:.1f} M chars, {card['corpus']['train_tokens'] / 1e6:.2f} M tokens), "
        f"{card['corpus']['heldout_files']} held-out files ({card['corpus']['heldout_tokens']} tokens), "
        "split by a hash of the path.",
        f"- Training: {tc.get('steps')} steps x {tc.get('batch_size')} x {tc.get('seq_len')} tokens "
        f"({(t.get('train_tokens_seen') or 0) / 1e6:.2f} M tokens), AdamW, lr {tc.get('lr')} cosine, "
        f"seed {tc.get('seed')}.",
        f"- Training time on this machine (2 x86-64 cores, no GPU): {t.get('train_seconds')} s "
        f"(tokenizer and corpus: {t.get('tokenizer_seconds')} s).", "",
        "## Quality (held-out files)", "",
        f"- Perplexity: **{card['heldout_perplexity']}** vs unigram baseline **{card['unigram_perplexity']}** "
        f"({card['heldout_tokens_scored']} tokens, 512-token windows).", "",
        "## Routing", "",
        "Expert-load entropy of the top-k assignments (bits; uniform = log2 E), and how often a layer's top-1",
        "expert equals the most frequent successor of the previous layer's top-1 (table fit on training",
        "tokens), against always guessing the layer's most frequent top-1 expert.", "",
        "| layer | load entropy (bits) | max/mean load | top-1 from previous layer | ... within 2 guesses | "
        "majority baseline |",
        "|---|---|---|---|---|---|",
    ]
    for r in card["layers"]:
        lines.append(f"| {r['layer']} | {r['load_entropy_bits']} / {r['max_entropy_bits']} | "
                     f"{r['max_over_mean_load']} | "
                     f"{r.get('top1_from_prev_acc', '-')} | {r.get('top1_from_prev_acc_at2', '-')} | "
                     f"{r.get('top1_majority_baseline_acc', '-')} |")
    lines += ["", "Figures are in `model_card.json`, written by `python -m sgl_moe.training.model_card`.", ""]
    return "\n".join(lines)


def write_model_card(model_dir: Path) -> dict:
    card = measure(model_dir)
    (model_dir / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (model_dir / "MODEL_CARD.md").write_text(render(card, model_dir))
    print(render(card, model_dir))
    return card


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sgl_moe.training.model_card", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    write_model_card(parser.parse_args(argv).model_dir)


if __name__ == "__main__":
    main()
