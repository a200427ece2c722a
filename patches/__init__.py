"""sgl_moe.patches: named, idempotent transforms of SGLang's MoE execution, each behind a --moe-* flag.

No patch exists yet; with every flag at its default, SGLang's own code path runs untouched.
"""
