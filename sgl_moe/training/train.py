"""Train the shipped Qwen3-MoE model from scratch on the stdlib corpus (fixed seed, CPU).

    python -m sgl_moe.training.train --out sgl_moe/models/tiny-qwen3-moe

Steps: corpus -> sentencepiece tokenizer -> HF ``Qwen3MoeForCausalLM`` trained with the
load-balancing auxiliary loss -> weights saved in bf16 (served in fp32) -> model card measured.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    """Seeds python, torch and the tokenizer trainer."""
    vocab_size: int = 4096
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 32
    top_k: int = 2
    """E/k = 16, the same ratio as Qwen3-30B-A3B and Qwen3-235B-A22B."""
    moe_intermediate_size: int = 128
    router_aux_loss_coef: float = 0.01
    """Weight of the Switch-style load-balancing loss."""
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 700
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    threads: int = 2


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def hf_config(cfg: TrainConfig):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=3 * cfg.hidden_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        num_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=4096, tie_word_embeddings=False,
        router_aux_loss_coef=cfg.router_aux_loss_coef, bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )


def train(out_dir: Path, cfg: TrainConfig, stop_after: int | None = None, corpus_root: Path | None = None
          ) -> list[dict]:
    """Train and save to ``out_dir``; returns the loss log.

    ``stop_after``: stop after that step without saving the model (reproducibility checks): the
    schedule still follows ``cfg.steps``, so the losses equal those of the full run. ``corpus_root``: the
    stdlib directory to read the corpus from (default: this interpreter's; the shipped run read Python
    3.11.7's, ``MODEL_CARD.md``).
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3MoeForCausalLM

    from sgl_moe.training.corpus import load_corpus, tokenize_docs
    from sgl_moe.training.tokenizer import export_hf_tokenizer, train_sentencepiece

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t_start = time.time()

    corpus = load_corpus(corpus_root)
    print(f"corpus: {len(corpus.train)} train files ({corpus.train_chars / 1e6:.1f} M chars), "
          f"{len(corpus.heldout)} held-out files ({corpus.heldout_chars / 1e6:.2f} M chars)", flush=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sp_model = train_sentencepiece(corpus.train, Path(tmp) / "tokenizer", cfg.vocab_size, cfg.seed)
        shutil.copy(sp_model, out_dir / "tokenizer.model")
    export_hf_tokenizer(out_dir / "tokenizer.model", out_dir)
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    t_tok = time.time()
    stream = torch.tensor(tokenize_docs(tokenizer, corpus.train, eos_id=2), dtype=torch.long)
    print(f"tokenizer trained and corpus tokenized: {stream.numel() / 1e6:.2f} M train tokens "
          f"({time.time() - t_start:.0f} s)", flush=True)

    model = Qwen3MoeForCausalLM(hf_config(cfg))
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    n_windows = stream.numel() - cfg.seq_len - 1
    t_train = time.time()
    log: list[dict] = []
    for step in range(cfg.steps):
        starts = torch.randint(0, n_windows, (cfg.batch_size,), generator=gen)
        batch = torch.stack([stream[s : s + cfg.seq_len] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        out = model(input_ids=batch, labels=batch, output_router_logits=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == cfg.steps - 1:
            elapsed = time.time() - t_train
            lm_loss = out.loss.item() - cfg.router_aux_loss_coef * out.aux_loss.item()
            rec = {"step": step, "lm_loss": round(lm_loss, 4), "aux_loss": round(out.aux_loss.item(), 4),
                   "tok_per_s": round((step + 1) * cfg.batch_size * cfg.seq_len / elapsed)}
            log.append(rec)
            print(f"step {step:5d}/{cfg.steps}  lm_loss {rec['lm_loss']:.3f}  aux {rec['aux_loss']:.3f}  "
                  f"{rec['tok_per_s']} tok/s  {elapsed:.0f} s", flush=True)
        if stop_after is not None and step >= stop_after:
            return log
    train_seconds = time.time() - t_train

    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(out_dir)
    # Stored in bf16 to stay small; every engine serves it in fp32 (exact: bf16 -> fp32 is lossless).
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "training.json").write_text(json.dumps({
        "train_config": asdict(cfg),
        "train_tokens_available": int(stream.numel()),
        "train_tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "tokenizer_seconds": round(t_tok - t_start, 1),
        "train_seconds": round(train_seconds, 1),
        "log": log,
    }, indent=2) + "\n")
    print(f"saved to {out_dir} (training {train_seconds:.0f} s, total {time.time() - t_start:.0f} s)", flush=True)
    return log


def main(argv: list[str] | None = None) -> None:
    from sgl_moe.training.corpus import stdlib_root

    parser = argparse.ArgumentParser(prog="python -m sgl_moe.training.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output model directory")
    parser.add_argument("--corpus-root", type=Path, default=None, metavar="DIR",
                        help="the Python stdlib directory to read the corpus from (default: this interpreter's, "
                        f"{stdlib_root()}); the shipped model's is the stdlib of the Python its MODEL_CARD.md names, "
                        "and another patch version's stdlib is another corpus")
    defaults = TrainConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.corpus_root is not None and not any(args.corpus_root.glob("*.py")):
        parser.error(f"--corpus-root {args.corpus_root}: not a Python stdlib directory (no .py files in it)")
    cfg = TrainConfig(**{k: getattr(args, k) for k in asdict(defaults)})
    print(f"corpus: the stdlib at {args.corpus_root or stdlib_root()}", flush=True)
    train(args.out, cfg, corpus_root=args.corpus_root)
    from sgl_moe.training.model_card import write_model_card

    write_model_card(args.out)


if __name__ == "__main__":
    main()
