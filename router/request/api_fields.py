"""SGLang 0.5.23's request fields per endpoint: what the router accepts and forwards.

Hard-coded because the router cannot import SGLang; ``tests/router/test_request_parsing.py`` compares
them with SGLang's own classes, so an upgrade that changes them fails loudly.
"""

from __future__ import annotations

GENERATE = "/generate"
SCORE = "/v1/score"
DECISIONS = "/v1/decisions"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

GENERATE_FIELDS = frozenset({
    "audio_data", "background", "bootstrap_host", "bootstrap_pair_key", "bootstrap_port", "bootstrap_room",
    "cache_salt", "conversation_id", "custom_labels", "custom_logit_processor", "data_parallel_rank",
    "decode_tp_size", "disagg_prefill_dp_rank", "encoder_urls", "external_trace_header", "extra_key",
    "http_worker_ipc", "image_data", "image_max_dynamic_patch", "images_config", "input_embeds", "input_ids",
    "kv_hints", "log_metrics", "logprob_start_len", "lora_id", "lora_path", "max_dynamic_patch",
    "max_thinking_tokens", "min_dynamic_patch", "mm_content_hashes", "mm_hashes", "mm_processor_kwargs",
    "modalities", "multi_item_delimiter_indices", "need_wait_for_mm_inputs", "no_logs", "num_items_assigned",
    "positional_embed_overrides", "priority", "received_time", "require_reasoning", "return_bytes",
    "return_entropy", "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs",
    "return_flat_raw_top_logprobs_b64", "return_hidden_states", "return_indexer_topk", "return_logprob",
    "return_prompt_token_ids", "return_routed_experts", "return_sampling_mask", "return_text_in_logprobs", "rid",
    "routed_dp_rank", "routed_experts_start_len", "routing_key", "sampling_logprobs_mode", "sampling_params",
    "session_id", "session_params", "stream", "text", "token_ids_logprob", "token_indices_to_pool",
    "top_logprobs_num", "use_audio_in_video", "video_data", "video_config", "video_max_dynamic_patch",
    "watermark",
})
"""``sglang.srt.managers.io_struct.GenerateReqInput`` fields."""

_PD_ROUTING_FIELDS = frozenset({"bootstrap_host", "bootstrap_port", "bootstrap_room", "disagg_prefill_dp_rank",
                                "routed_dp_rank"})

COMPLETION_FIELDS = _PD_ROUTING_FIELDS | frozenset({
    "best_of", "cache_salt", "custom_labels", "custom_logit_processor", "custom_params", "data_parallel_rank",
    "ebnf", "echo", "extra_key", "frequency_penalty", "ignore_eos", "images_config", "json_schema", "logit_bias",
    "logprobs", "lora_path", "max_tokens", "min_p", "min_tokens", "mm_processor_kwargs", "model", "n",
    "no_stop_trim", "presence_penalty", "priority", "prompt", "regex", "repetition_penalty", "response_format",
    "return_cached_tokens_details", "return_hidden_states", "return_routed_experts", "return_spec_tokens_details",
    "return_token_ids", "rid", "routed_experts_start_len", "seed", "session_id", "session_params",
    "skip_special_tokens", "stop", "stop_regex", "stop_token_ids", "stream", "stream_options", "suffix",
    "temperature", "top_k", "top_p", "user", "watermark",
})
"""``sglang.srt.entrypoints.openai.protocol.CompletionRequest`` fields."""

CHAT_FIELDS = _PD_ROUTING_FIELDS | frozenset({
    "cache_salt", "chat_template_kwargs", "continue_final_message", "custom_logit_processor", "custom_params",
    "data_parallel_rank", "ebnf", "extra_key", "frequency_penalty", "ignore_eos", "images_config", "input_ids",
    "logit_bias", "logprobs", "lora_path", "max_completion_tokens", "max_dynamic_patch", "max_tokens",
    "messages", "min_dynamic_patch", "min_p", "min_tokens", "mm_processor_kwargs", "model", "n", "no_stop_trim",
    "parallel_tool_calls", "presence_penalty", "priority", "reasoning_effort", "regex", "repetition_penalty",
    "response_format", "return_cached_tokens_details", "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64", "return_hidden_states", "return_input_ids_in_sglext", "return_meta_info",
    "return_output_ids_in_sglext", "return_prompt_token_ids", "return_routed_experts", "return_sampling_mask",
    "return_spec_tokens_details", "return_token_ids", "rid", "routed_experts_start_len", "sampling_logprobs_mode",
    "seed", "separate_reasoning", "session_id", "session_params", "skip_special_tokens", "stop", "stop_regex",
    "stop_token_ids", "stream", "stream_options", "stream_reasoning", "task", "temperature", "thinking",
    "tool_choice", "tools", "top_k", "top_logprobs", "top_p", "use_audio_in_video", "user", "video_config",
    "watermark",
})
"""``sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest`` fields."""

CHAT_VALIDATOR_INPUTS = frozenset({"reasoning"})
"""Read from the raw chat body by ``ChatCompletionRequest.normalize_reasoning_inputs``; not fields."""

SCORE_FIELDS = frozenset({
    "apply_softmax", "embed_override_token_id", "item_embed_overrides", "item_first", "items", "label_token_ids",
    "model", "query", "query_embed_overrides", "return_pooled_hidden_states", "return_token_logprobs",
    "score_extraction_token", "temperature",
})
"""``sglang.srt.entrypoints.openai.protocol.ScoringRequest`` fields."""

DECISION_FIELDS = frozenset({
    "chat_template_kwargs", "images", "input", "model", "prompt_format_version", "questions",
    "return_prompt_token_ids", "temperature",
})
"""``sglang.srt.entrypoints.openai.protocol.DecisionRequest`` fields (SGLang forbids any other)."""

ACCEPTED_FIELDS = {
    GENERATE: GENERATE_FIELDS,
    COMPLETIONS: COMPLETION_FIELDS,
    CHAT: CHAT_FIELDS | CHAT_VALIDATOR_INPUTS,
    SCORE: SCORE_FIELDS,
    DECISIONS: DECISION_FIELDS,
}
