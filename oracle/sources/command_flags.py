"""The ``vllm serve`` flags the parser knows: those that feed the decision, and those it
accepts and ignores knowingly because they do not change which runner can serve.

``nargs``: 0 = a switch (``--no-X`` negates it), 1 = one value, ``"+"`` = one or more values.
A flag in neither table is an error that names it: nothing is silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlagSpec:
    name: str  # canonical long name, e.g. "--tensor-parallel-size"
    nargs: int | str
    field: str | None = None  # DeploymentConfig field set directly, or None: handled by name
    aliases: tuple[str, ...] = ()


DECISION_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("--model", 1, "model"),
    FlagSpec("--tensor-parallel-size", 1, "tensor_parallel_size", ("-tp",)),
    FlagSpec("--pipeline-parallel-size", 1, "pipeline_parallel_size", ("-pp",)),
    FlagSpec("--data-parallel-size", 1, "data_parallel_size", ("-dp",)),
    FlagSpec("--prefill-context-parallel-size", 1, "prefill_context_parallel_size", ("-pcp",)),
    FlagSpec("--decode-context-parallel-size", 1, "decode_context_parallel_size", ("-dcp",)),
    FlagSpec("--enable-expert-parallel", 0, "enable_expert_parallel", ("-ep",)),
    FlagSpec("--distributed-executor-backend", 1, "distributed_executor_backend"),
    FlagSpec("--enable-dbo", 0, "enable_dbo"),
    FlagSpec("--ubatch-size", 1, "ubatch_size"),
    FlagSpec("--enable-elastic-ep", 0, "enable_elastic_ep"),
    FlagSpec("--enable-eplb", 0, "enable_eplb"),
    FlagSpec("--enforce-eager", 0, "enforce_eager"),
    FlagSpec("--logits-processors", "+", "logits_processors"),
    FlagSpec("--kv-sharing-fast-prefill", 0, "kv_sharing_fast_prefill"),
    FlagSpec("--mamba-cache-mode", 1, "mamba_cache_mode"),
    FlagSpec("--cpu-offload-gb", 1, "cpu_offload_gb"),
    FlagSpec("--async-scheduling", 0, "async_scheduling"),
    FlagSpec("--enable-prefix-caching", 0, "enable_prefix_caching"),
    FlagSpec("--enable-lora", 0, "lora"),
    FlagSpec("--quantization", 1, "quantization", ("-q",)),
    # handled by name (command.py): JSON values, dotted sub-keys, or derived fields
    FlagSpec("--speculative-config", 1),
    FlagSpec("--compilation-config", 1, None, ("-cc",)),
    FlagSpec("--kv-transfer-config", 1),
    FlagSpec("--hf-overrides", 1),
    FlagSpec("--runner", 1),
    FlagSpec("--convert", 1),
    FlagSpec("--task", 1),
    FlagSpec("--attention-backend", 1),
    FlagSpec("--config", 1),
    # where the model's config.json is read (oracle/sources/hub.py), not fields themselves
    FlagSpec("--revision", 1, "_revision"),
    FlagSpec("--hf-config-path", 1, "_hf_config_path"),
)

# Accepted and ignored: serving, memory, tokenizer, parser, multimodal-processing and kernel
# tuning options. None of them changes which runner can serve the deployment.
IGNORED_FLAGS: dict[str, int | str] = {
    # server and API
    "--host": 1, "--port": 1, "--served-model-name": "+", "--api-key": 1, "--root-path": 1,
    "--uvicorn-log-level": 1, "--disable-log-requests": 0, "--enable-log-requests": 0,
    "--disable-log-stats": 0, "--disable-uvicorn-access-log": 0, "--allowed-local-media-path": 1,
    "--tool-server": 1, "--max-log-len": 1, "--disable-fastapi-docs": 0,
    # chat, tools, reasoning
    "--chat-template": 1, "--chat-template-content-format": 1, "--enable-auto-tool-choice": 0,
    "--tool-call-parser": 1, "--tool-call-parser-plugin": 1, "--tool-parser-plugin": 1,
    "--reasoning-parser": 1, "--reasoning-parser-plugin": 1, "--reasoning-config": 1,
    "--generation-config": 1, "--default-chat-template-kwargs": 1, "--response-role": 1,
    # model loading and tokenizer
    "--trust-remote-code": 0, "--dtype": 1, "--load-format": 1, "--config-format": 1,
    "--tokenizer": 1, "--tokenizer-mode": 1, "--download-dir": 1,
    "--model-impl": 1, "--seed": 1, "--max-model-len": 1, "--model-class-name": 1,
    "--language-model-only": 0, "--skip-tokenizer-init": 0,
    # memory and scheduling budgets
    "--gpu-memory-utilization": 1, "--kv-cache-dtype": 1, "--kv-cache-memory-bytes": 1,
    "--block-size": 1, "--swap-space": 1, "--max-num-seqs": 1, "--max-num-batched-tokens": 1,
    "--enable-chunked-prefill": 0, "--max-cudagraph-capture-size": 1,
    "--disable-cascade-attn": 0, "--optimization-level": 1, "-O": 1,
    # kernels and backends
    "--moe-backend": 1, "--linear-backend": 1, "--mamba-backend": 1,
    "--mamba-ssm-cache-dtype": 1, "--mm-encoder-attn-backend": 1, "--attention-config": 1,
    "--kernel-config": 1, "--enable-flashinfer-autotune": 0, "--additional-config": 1,
    # multimodal processing
    "--limit-mm-per-prompt": 1, "--mm-processor-kwargs": 1, "--mm-processor-cache-gb": 1,
    "--mm-processor-cache-type": 1, "--mm-encoder-tp-mode": 1, "--media-io-kwargs": 1,
    "--skip-mm-profiling": 0,
    # LoRA details (enabling LoRA is a decision flag)
    "--lora-modules": "+", "--max-lora-rank": 1, "--max-loras": 1,
    # multi-node placement (the sizes are decision flags)
    "--data-parallel-size-local": 1, "--data-parallel-address": 1, "--data-parallel-rpc-port": 1,
    "--data-parallel-start-rank": 1, "--nnodes": 1, "--node-rank": 1, "--master-addr": 1,
    "--master-port": 1, "--headless": 0,
    # vllm-omni (diffusion / audio pipelines served by `vllm serve --omni`)
    "--omni": 0, "--deploy-config": 1, "--task-type": 1, "--num-gpus": 1, "--usp": 1,
    "--ring": 1, "--ulysses-degree": 1, "--cfg-parallel-size": 1, "--text-encoder-tp-size": 1,
    "--vae-patch-parallel-size": 1, "--vae-parallel-mode": 1, "--vae-use-tiling": 0,
    "--enable-cpu-offload": 0, "--enable-distributed-layerwise-offload": 0,
    "--dlo-no-use-allgather": 0, "--dlo-resident-layers": 1, "--use-hsdp": 0,
    "--hsdp-shard-size": 1, "--diffusion-attention-backend": 1, "--init-timeout": 1,
    "--stage-init-timeout": 1, "--async-chunk": 0,
}

# Sub-keys of JSON-valued decision flags that do not change the decision.
IGNORED_SPECULATIVE_KEYS = (
    "model", "draft_tensor_parallel_size", "moe_backend", "enforce_eager", "quantization",
    "prompt_lookup_max", "prompt_lookup_min", "max_model_len", "revision", "disable_by_batch_size",
    "draft_model_config", "speculative_token_tree", "rejection_sample_method", "attention_backend",
    "use_local_argmax_reduction", "disable_padded_drafter_batch", "draft_sample_method",
)
COMPILATION_MODE_NUMBERS = {0: "none", 1: "stock_torch_compile", 2: "dynamo_trace_once",
                            3: "vllm_compile"}
POOLING_CONVERSIONS = {"embed", "classify", "reward", "score", "embedding", "classification"}
