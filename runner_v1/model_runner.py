"""runner_v1's model runner (MRV1 style, docs/architecture.md §5.3), the hub of the package.

Each step: apply finished/preempted ids and drop unscheduled rows, bind new and resumed
requests to rows of the persistent batch, condense; build every input with numpy from the
batch tables and copy it to the device (the block table whole); one forward (on CUDA, a
pure-decode step replays a captured graph, as MRV1 does: ``decode_graphs.py``); prompt
logprobs; sample; one host sync (``.tolist()``) for the sampled ids; verify drafts; append the
tokens to the batch; propose the next drafts from the CPU history.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from turnout.engine.capabilities import RunnerManifest, model_layer_architectures
from turnout.engine.config import DEVICE_TYPES, EngineConfig
from turnout.engine.errors import EngineConfigError
from turnout.engine.model import DecoderModel
from turnout.engine.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput, PromptLogprobs
from turnout.engine.runner_setup import POOLING_TASKS, TENSOR_PARALLEL_ARCHITECTURES, RunnerBase
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import NewRequestData, SchedulerOutput
from turnout.runner_v1.block_table import BlockTable
from turnout.runner_v1.cpu_offload import OffloadStats, apply_cpu_offload
from turnout.runner_v1.decode_graphs import V1DecodeGraphs
from turnout.runner_v1.input_batch import InputBatch, RequestView
from turnout.runner_v1.inputs import StepInputs, build_sampling_metadata, build_step_inputs
from turnout.runner_v1.logprobs import compute_logprobs
from turnout.runner_v1.sampler import apply_logits_processors, apply_masks, apply_penalties, sample
from turnout.runner_v1.spec_decode import SPECULATIVE_METHODS, accept_drafts, propose_ngram


@dataclass
class CachedRequestState:
    """Everything the runner keeps about a request across steps (also while preempted)."""

    req_id: str
    token_ids: list[int]  # prompt + output
    num_prompt_tokens: int
    sampling_params: SamplingParams | None
    block_ids: list[int]
    num_computed_tokens: int
    state_slot: int | None = None  # its Mamba state's slot (models with Mamba layers)


class V1ModelRunner(RunnerBase):
    """Implements :class:`engine.runner_protocol.ModelRunner` with a CPU persistent batch
    (set-up and pooling from :class:`engine.runner_setup.RunnerBase`)."""

    gpu_kv_fraction = 0.9
    cpu_kv_bytes = (
        1 << 30
    )  # CPU KV budget when none is given (vLLM uses 4 GiB; tests share small machines)

    def __init__(self, config: EngineConfig) -> None:
        spec = config.speculative_config
        if spec is not None and spec.method not in SPECULATIVE_METHODS:
            # The drafts of ngram_gpu and draft_model live on the device (runner_v2's design).
            raise EngineConfigError(
                f"Model Runner V1 does not support: speculative method '{spec.method}'"
            )
        super().__init__(config)
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(config.max_num_seqs, config.max_model_len)
        self.block_table = BlockTable(
            config.max_num_seqs, config.max_num_blocks_per_req, config.block_size
        )
        self.offload_stats = OffloadStats()
        # Mamba state slots, one per request from its admission to its finish or preemption:
        # unlike batch rows they never move, and a request left out of a step keeps its slot.
        self._free_state_slots = list(range(config.max_num_seqs - 1, -1, -1))
        self.decode_graphs: V1DecodeGraphs | None = None
        self.num_graph_steps = 0
        self.num_eager_steps = 0

    # ---- set-up ------------------------------------------------------------------------
    def load_model(self) -> None:
        super().load_model()
        if self.config.cpu_offload_gb > 0:
            assert self.model is not None
            self.offload_stats = apply_cpu_offload(
                self.model, self.config.cpu_offload_gb, self.device
            )

    def initialize_kv_cache(self, num_blocks: int) -> None:
        super().initialize_kv_cache(num_blocks)
        c = self.config
        # Decode graphs as MRV1 captures them; not for Mamba state (its slots are not in the
        # static buffers) nor with weights offloaded to the host (copied in per forward).
        if (
            self.device.type != "cuda"
            or c.enforce_eager
            or self.is_pooling
            or self.has_inner_state
            or c.cpu_offload_gb > 0
            or not isinstance(self.model, DecoderModel)
        ):
            return
        self.decode_graphs = V1DecodeGraphs(
            max_num_seqs=c.max_num_seqs,
            max_num_blocks_per_req=c.max_num_blocks_per_req,
            max_model_len=c.max_model_len,
            block_size=c.block_size,
            device=self.device,
        )
        with torch.inference_mode():
            self.decode_graphs.capture(self.model, self.kv_caches)

    # ---- the step ----------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        if scheduler_output.is_empty:
            return EMPTY_MODEL_RUNNER_OUTPUT
        with torch.inference_mode():
            if self.is_pooling:
                return self._execute_pooling(scheduler_output)
            return self._execute_decoder(scheduler_output)

    def _update_states(self, so: SchedulerOutput) -> None:
        # Ordering (docs/architecture.md §5.5): drop finished and preempted state before binding
        # anything.
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            state = self.requests.pop(req_id, None)
            if state is not None:
                self._release_state_slot(state)
            batch.remove_request(req_id)
        for req_id in so.preempted_req_ids:
            batch.remove_request(req_id)
            if req_id in self.requests:  # recomputed from position 0 on resume: its state goes
                self._release_state_slot(self.requests[req_id])
        for req_id in [r for r in batch.req_id_to_row if r not in so.num_scheduled_tokens]:
            batch.remove_request(req_id)  # not scheduled this step: its state waits outside
        to_add = [self._add_new(new) for new in so.scheduled_new_reqs]
        to_add += self._update_cached(so)
        for state in to_add:
            if not self.is_pooling:
                self._bind_row(state)
        for src, dst in batch.condense():
            self.block_table.move_row(src, dst)

    def _add_new(self, new: NewRequestData) -> CachedRequestState:
        state = CachedRequestState(
            new.req_id,
            list(new.prompt_token_ids),
            len(new.prompt_token_ids),
            new.sampling_params,
            list(new.block_ids),
            new.num_computed_tokens,
        )
        self.requests[new.req_id] = state
        self._take_state_slot(state)
        return state

    def _take_state_slot(self, state: CachedRequestState) -> None:
        if self.has_inner_state and state.state_slot is None:
            state.state_slot = self._free_state_slots.pop()

    def _release_state_slot(self, state: CachedRequestState) -> None:
        if state.state_slot is not None:
            self._free_state_slots.append(state.state_slot)
            state.state_slot = None

    def _update_cached(self, so: SchedulerOutput) -> list[CachedRequestState]:
        cached, batch = so.scheduled_cached_reqs, self.input_batch
        to_add = []
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_blocks = cached.new_block_ids[i] or []
            if cached.resumed_from_preemption[i]:
                state.token_ids = list(cached.resumed_req_token_ids[i] or [])
                state.block_ids = list(new_blocks)
                self._take_state_slot(state)
            else:
                state.block_ids.extend(new_blocks)
                if len(state.token_ids) - state.num_prompt_tokens != cached.num_output_tokens[i]:
                    raise RuntimeError(
                        f"request {req_id}: the runner's output is out of step with the engine's"
                    )
            row = batch.req_id_to_row.get(req_id)
            if row is None:
                to_add.append(state)
            else:
                batch.num_computed_tokens_np[row] = state.num_computed_tokens
                self.block_table.append_row(row, new_blocks)
        return to_add

    def _bind_row(self, state: CachedRequestState) -> None:
        p = state.sampling_params
        assert p is not None
        view = RequestView(
            req_id=state.req_id,
            token_ids=state.token_ids,
            num_prompt_tokens=state.num_prompt_tokens,
            num_computed_tokens=state.num_computed_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            min_p=p.min_p,
            seed=p.seed or 0,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            repetition_penalty=p.repetition_penalty,
            min_tokens=p.min_tokens,
            ignore_eos=p.ignore_eos,
            logprobs=p.logprobs,
            prompt_logprobs=p.prompt_logprobs,
            stop_token_ids=p.stop_token_ids,
            logits_processors=p.logits_processors,
        )
        row = self.input_batch.add_request(view)
        self.block_table.set_row(row, state.block_ids)

    def _execute_decoder(self, so: SchedulerOutput) -> ModelRunnerOutput:
        assert isinstance(self.model, DecoderModel)
        inputs = build_step_inputs(self.input_batch, self.block_table, so, self.device)
        md = inputs.attn_metadata
        if self.has_inner_state:
            slots = np.array([self.requests[r].state_slot for r in inputs.req_ids], np.int32)
            md = dataclasses.replace(
                md,
                state_indices=torch.from_numpy(slots).to(self.device),
                all_states_continue=bool((inputs.num_computed_np > 0).all()),
            )
        graphs = self.decode_graphs
        size = (
            graphs.padded_size(md.num_reqs)
            if graphs is not None and md.max_query_len == 1
            else None
        )
        if size is not None:
            assert graphs is not None
            hidden = graphs.replay(inputs.input_ids, inputs.positions, md, size)
            self.num_graph_steps += 1
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, md)
            self.num_eager_steps += 1
        out = ModelRunnerOutput(
            req_ids=list(inputs.req_ids), sampled_token_ids=[[] for _ in inputs.req_ids]
        )
        self._prompt_logprobs(hidden, inputs, out)
        if inputs.sample_rows.size:
            self._sample(hidden, inputs, out)
        return out

    def _prompt_logprobs(
        self, hidden: torch.Tensor, inputs: StepInputs, out: ModelRunnerOutput
    ) -> None:
        assert isinstance(self.model, DecoderModel)
        batch = self.input_batch
        for i, req_id in enumerate(inputs.req_ids):
            k = int(batch.num_prompt_logprobs_np[i])
            start = int(inputs.num_computed_np[i])
            first, last = (
                start,
                min(
                    start + int(inputs.num_scheduled_np[i]), int(batch.num_prompt_tokens_np[i]) - 1
                ),
            )
            if k < 0 or first >= last:
                continue
            rows = int(inputs.query_start_loc_np[i]) + np.arange(last - first)
            targets = torch.from_numpy(batch.token_ids_np[i, first + 1 : last + 1].astype(np.int64))
            rows_t = torch.from_numpy(rows).to(hidden.device)

            def get_logits(
                a: int, b: int, r: torch.Tensor = rows_t, m: DecoderModel = self.model
            ) -> torch.Tensor:
                return m.compute_logits(hidden[r[a:b]])

            lps = compute_logprobs(get_logits, targets, k, self.config.vocab_size)
            out.prompt_logprobs[req_id] = PromptLogprobs(first + 1, lps)

    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, out: ModelRunnerOutput) -> None:
        assert isinstance(self.model, DecoderModel)
        batch = self.input_batch
        raw = self.model.compute_logits(
            hidden[torch.from_numpy(inputs.logits_indices).to(hidden.device)]
        )
        md = build_sampling_metadata(batch, inputs, self.config.eos_token_ids, self.device)
        logits = raw.clone()
        errors = apply_logits_processors(logits, md)
        apply_penalties(logits, md)
        apply_masks(logits, md)
        targets = sample(logits, md).tolist()  # the one host sync of the step
        for i in np.unique(inputs.sample_rows).tolist():
            req_id = inputs.req_ids[i]
            rows = np.flatnonzero(inputs.sample_rows == i)
            failed = [errors[r] for r in rows.tolist() if r in errors]
            if failed:
                out.errors[req_id] = failed[0]
                continue
            drafts = inputs.drafts.get(req_id, [])
            tokens = accept_drafts(drafts, [targets[r] for r in rows.tolist()])
            out.sampled_token_ids[i] = tokens
            self._record(i, req_id, tokens, raw, rows, out)

    def _record(
        self,
        i: int,
        req_id: str,
        tokens: list[int],
        raw: torch.Tensor,
        rows: np.ndarray,
        out: ModelRunnerOutput,
    ) -> None:
        batch = self.input_batch
        k = int(batch.num_logprobs_np[i])
        if k >= 0:
            used = torch.from_numpy(rows[: len(tokens)]).to(raw.device)
            out.logprobs[req_id] = compute_logprobs(
                lambda a, b: raw[used[a:b]],
                torch.tensor(tokens, dtype=torch.int64),
                k,
                self.config.vocab_size,
            )
        batch.append_token_ids(i, tokens)
        self.requests[req_id].token_ids.extend(tokens)
        spec = self.config.speculative_config
        if spec is not None:
            history = batch.token_ids_np[i, : batch.num_tokens_np[i]]
            out.spec_token_ids[req_id] = propose_ngram(
                history, spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens
            )

    def _execute_pooling(self, so: SchedulerOutput) -> ModelRunnerOutput:
        req_ids, embeddings = self.pool_scheduled(so)
        for req_id in req_ids:
            self.requests.pop(req_id)  # one step: the request is done
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=[[] for _ in req_ids],
            pooled_outputs=dict(zip(req_ids, embeddings.cpu().numpy(), strict=True)),
        )


#: What runner_v1 serves: every architecture of the model layer; n-gram speculation on the CPU
#: (spec_decode.py; it refuses ngram_gpu and draft_model, runner_v2's device drafts); every
#: option of engine.capabilities.FEATURES (it refuses none: logits processors in sampler.py,
#: cpu_offload_gb in cpu_offload.py); no Triton; synchronous; decode CUDA graphs on CUDA
#: (decode_graphs.py), as MRV1; tensor parallelism for the architectures the model layer shards.
MANIFEST = RunnerManifest.build(
    "v1",
    architectures=model_layer_architectures(),
    refused=(),
    speculative_methods=SPECULATIVE_METHODS,
    pooling_tasks=POOLING_TASKS,
    platforms=DEVICE_TYPES,
    requires_triton=False,
    async_scheduling=getattr(V1ModelRunner, "async_scheduling", False),
    cuda_graphs=True,
    tensor_parallel_architectures=TENSOR_PARALLEL_ARCHITECTURES,
)


__all__ = ["MANIFEST", "CachedRequestState", "V1ModelRunner"]
