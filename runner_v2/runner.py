"""runner_v2's model runner (MRV2 style, docs/architecture.md §5.4): the hub of the package.

Each step, with no host synchronisation until the engine collects the result:

1. drop finished and preempted requests (rows are only freed), bind new and resumed ones to
   rows and stage every field of those rows, stage block-table diffs of the others;
2. one host-to-device copy carries the staged writes and the step's index arrays
   (``idx_mapping``, ``num_scheduled_tokens``, logprob and prompt-logprob indices); one kernel
   applies the writes;
3. Triton kernels build the inputs from the table (``runner_v2/input_batch.py``);
4. the forward pass: a CUDA-graph replay for decode batches, and for mixed prefill + decode
   steps padded to a captured token count (``engine/cuda_graphs.py``); eager otherwise;
5. sampling, logprobs and prompt logprobs on the device (``runner_v2/sampler.py``);
6. ``post_update`` appends the sampled ids to the table and advances its counters;
7. the results go to the host on a side stream (``runner_v2/async_output.py``) while the engine
   plans and launches the next step (asynchronous scheduling, ``async_scheduling = True``).

With speculative decoding (``ngram_gpu``, ``draft_model``: ``runner_v2/spec_decode.py``,
``runner_v2/draft_model.py``) the proposer writes each decoding request's drafts into the
table before 3, the target scores ``1 + k`` positions per request in 4, and 5-6 become
rejection sampling and the speculative post-update; a draft model mirrors prefill chunks after.

The host keeps mirrors of what it can count itself (``num_computed_tokens``, ``num_tokens``,
block counts) to size each step; it never reads the device on the step path.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from turnout.engine.capabilities import RunnerManifest, model_layer_architectures
from turnout.engine.config import DEVICE_TYPES, SUPPORTED_SPECULATIVE_METHODS, EngineConfig
from turnout.engine.cuda_graphs import DecodeGraphs
from turnout.engine.errors import UnsupportedOptionError
from turnout.engine.model import DecoderModel
from turnout.engine.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from turnout.engine.runner_setup import (
    POOLING_TASKS,
    TENSOR_PARALLEL_ARCHITECTURES,
    RunnerBase,
    logger,
)
from turnout.engine.sampling_params import SamplingParams
from turnout.engine.scheduler_output import SchedulerOutput
from turnout.kernels._select import vocab_block_size
from turnout.kernels.post_update import post_update
from turnout.runner_v2 import refusals, spec_decode
from turnout.runner_v2.async_output import AsyncOutput, StepResults
from turnout.runner_v2.draft_model import DraftModelProposer, DraftStep, load_draft_model
from turnout.runner_v2.graphs import RunnerGraphs
from turnout.runner_v2.input_batch import BatchPlan, InputBatch, InputBuffers, prepare_inputs
from turnout.runner_v2.memory_profile import kv_budget_after_profile, profile_peak_bytes
from turnout.runner_v2.prompt_logprobs import PromptLogprobsPlan, plan_prompt_logprobs
from turnout.runner_v2.sampler import (
    compute_logprobs,
    compute_prompt_logprobs,
    sample,
    sample_with_probs,
)
from turnout.runner_v2.states import Col, RequestInfo, RequestStates
from turnout.runner_v2.uploads import StepUploads, upload_step
from turnout.runner_v2.warmup import run_warm_up, warm_up_sizes, warm_up_steps

#: A step's drafts: (drafts [n, k] int32, drafts proposed [n] int32, draft probabilities or None).
Proposal = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]

#: Width of the min_tokens stop-id table (EOS ids and stop_token_ids of a request).
MAX_STOP_TOKEN_IDS = 32


class V2ModelRunner(RunnerBase):
    """Implements :class:`engine.runner_protocol.ModelRunner` over a device request table
    (set-up and pooling from :class:`engine.runner_setup.RunnerBase`).

    Raises:
        EngineConfigError: at construction, for every option the ``turnout`` pack says
            runner_v2 does not support (with the pack's label), or when Triton is missing.
    """

    #: The engine plans step N+1 before it collects step N (engine/core.py).
    async_scheduling = True
    # Without a profile (models with recurrent state): 80% of the free GPU memory, room for the
    # graph pool and the sampler's scratch.
    gpu_kv_fraction = 0.8
    cpu_kv_bytes = 4 << 30

    def __init__(self, config: EngineConfig) -> None:
        refusals.check_engine_config(config)
        super().__init__(config)
        self.states = RequestStates(
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            max_num_blocks_per_req=config.max_num_blocks_per_req,
            max_stop_token_ids=MAX_STOP_TOKEN_IDS,
            eos_token_ids=config.eos_token_ids,
            device=self.device,
        )
        self._preempted: dict[str, RequestInfo] = {}  # their sampling parameters, until resumed
        self.spec = (
            config.speculative_config
        )  # ngram_gpu or draft_model (refusals.py refuses ngram)
        #: The engine schedules k draft positions per decode; the drafts never leave the device.
        self.drafts_on_device = self.spec is not None
        self.draft: DraftModelProposer | None = None
        self.use_graphs = self.device.type == "cuda" and not config.enforce_eager
        self.graphs = RunnerGraphs(config, self.use_graphs, self.spec is not None)
        self.buffers = InputBuffers.allocate(
            max_num_seqs=config.max_num_seqs,
            max_num_tokens=max(config.max_num_batched_tokens, config.max_num_seqs),
            max_num_blocks_per_req=config.max_num_blocks_per_req,
            device=self.device,
        )
        # With speculation every input comes from the token table (drafts included): a
        # stride-0 "prefill length" of max_model_len for prepare_input_ids.
        self._from_table = torch.full(
            (1,), config.max_model_len, dtype=torch.int32, device=self.device
        ).expand(config.max_num_seqs)
        self.copy_stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # torch.cuda.Stream.__new__ is unannotated
            if self.device.type == "cuda"
            else None
        )
        self.num_graph_steps = 0
        self.num_mixed_graph_steps = 0  # of num_graph_steps: prefill chunks beside decodes
        self.profiled_peak_bytes: int | None = None  # the largest step's activations (CUDA)
        self.num_eager_steps = 0
        self.num_warm_up_steps, self.warm_up_seconds = 0, 0.0  # warm_up(): start-up only

    # ---- set-up ------------------------------------------------------------------------
    def load_model(self) -> None:
        super().load_model()
        if self.spec is not None and self.spec.method == "draft_model":
            assert isinstance(self.model, DecoderModel)
            model = load_draft_model(self.config, self.model, self.dtype, self.device)
            self.draft = DraftModelProposer(self.config, model, self.device)

    def kv_cache_block_bytes(self) -> int:
        # A block holds the target's and the draft's KV of the same positions.
        draft = self.draft.block_bytes(self.dtype) if self.draft is not None else 0
        return super().kv_cache_block_bytes() + draft

    def available_kv_cache_bytes(self) -> int:
        # Profile the largest step first (runner_v2/memory_profile.py), as MRV2 does.
        model = self.model
        if (
            self.device.type != "cuda"
            or self.is_pooling
            or self.has_inner_state
            or self.draft is not None
        ):
            return super().available_kv_cache_bytes()
        self.graphs.restrict_to(model, self.has_inner_state)
        self.profiled_peak_bytes = profile_peak_bytes(
            model, self.buffers, self.config, self.dtype, self.device
        )
        free, _ = torch.cuda.mem_get_info(self.device)
        return kv_budget_after_profile(
            free, self.profiled_peak_bytes, bool(self.graphs.mixed.sizes)
        )

    def initialize_kv_cache(self, num_blocks: int) -> None:
        super().initialize_kv_cache(num_blocks)
        if self.draft is not None:
            self.draft.allocate(num_blocks, self.dtype)
        self.graphs.restrict_to(self.model, self.has_inner_state)
        if self.kv_caches and self.use_graphs:
            self.graphs.capture(self.model, self.buffers, self.kv_caches, self.draft)
            if self.spec is None and self.graphs.decode.sizes and not self.is_pooling:
                self.warm_up()

    def warm_up(self, sizes: list[int] | None = None, mixed: bool | None = None) -> int:
        """Run the start-up steps of ``runner_v2/warmup.py`` (default sizes: every decode graph
        size and each split class of the sampler; a mixed step by default when mixed-step graphs
        are captured) so that no step compiles a kernel later; returns the steps run (also
        ``num_warm_up_steps``, with ``warm_up_seconds``, and logged on the ``turnout.engine``
        logger). The step counters start from zero after it.

        Raises:
            RuntimeError: a step has run since the runner was built (or since the last
                warm-up): the dummy requests write KV block 0, which may hold a live request's
                tokens or a cached prefix by then (the runner cannot know which).
            ValueError: a size outside ``1 .. max_num_seqs`` (checked before any step runs).
        """
        c, start = self.config, time.perf_counter()
        if self.num_graph_steps or self.num_eager_steps:
            raise RuntimeError(
                "warm_up() runs at start-up only: its dummy requests write KV block 0, and after "
                f"{self.num_graph_steps + self.num_eager_steps} steps that block may hold a request's "
                "tokens or a cached prefix"
            )
        sizes = (
            sizes
            if sizes is not None
            else warm_up_sizes(
                self.graphs.decode.sizes,
                c.max_num_seqs,
                c.vocab_size,
                vocab_block_size(c.vocab_size, self.device),
            )
        )
        bad = [n for n in sizes if not 1 <= n <= c.max_num_seqs]
        if bad:
            raise ValueError(f"warm-up sizes {bad} are outside 1 .. max_num_seqs={c.max_num_seqs}")
        count = run_warm_up(
            self.execute_model,
            warm_up_steps(
                sizes,
                block_size=c.block_size,
                max_num_batched_tokens=c.max_num_batched_tokens,
                max_model_len=c.max_model_len,
                mixed=bool(self.graphs.mixed.sizes) if mixed is None else mixed,
            ),
        )
        self.num_warm_up_steps, self.warm_up_seconds = count, time.perf_counter() - start
        logger.info("runner_v2 warm-up: %d steps in %.2f s", count, self.warm_up_seconds)
        self.num_graph_steps = self.num_mixed_graph_steps = self.num_eager_steps = 0
        return count

    def check_sampling_params(self, params: SamplingParams) -> None:
        super().check_sampling_params(params)
        if params.logits_processors:
            raise UnsupportedOptionError(refusals.logits_processors_message())
        self.states.check_sampling_params(params)

    # ---- the step ----------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | AsyncOutput:
        with torch.inference_mode():
            if self.is_pooling:
                return self._execute_pooling(scheduler_output)
            self._update_states(scheduler_output)
            if scheduler_output.is_empty:
                return EMPTY_MODEL_RUNNER_OUTPUT
            return self._execute_decoder(scheduler_output)

    def _update_states(self, so: SchedulerOutput) -> None:
        # Ordering (docs/architecture.md §5.5): free finished and preempted rows before binding
        # anything.
        states = self.states
        for req_id in so.finished_req_ids:
            states.remove_request(req_id)
            self._preempted.pop(req_id, None)
        for req_id in so.preempted_req_ids:
            info = states.remove_request(req_id)
            if info is not None:
                self._preempted[req_id] = info
        for new in so.scheduled_new_reqs:
            assert new.sampling_params is not None
            states.add_request(
                new.req_id,
                token_ids=new.prompt_token_ids,
                num_prompt_tokens=len(new.prompt_token_ids),
                num_computed_tokens=new.num_computed_tokens,
                block_ids=new.block_ids,
                params=new.sampling_params,
            )
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if cached.resumed_from_preemption[i]:
                # Preemption is remove + add again with the full token list.
                info = self._preempted.pop(req_id)
                states.add_request(
                    req_id,
                    token_ids=cached.resumed_req_token_ids[i] or [],
                    num_prompt_tokens=info.num_prompt_tokens,
                    num_computed_tokens=cached.num_computed_tokens[i],
                    block_ids=cached.new_block_ids[i] or [],
                    params=info.sampling_params,
                )
                continue
            row = states.req_id_to_row[req_id]
            engine_says, mirror = cached.num_computed_tokens[i], int(states.num_computed_np[row])
            # With drafts, both count every draft in flight as accepted; the engine has learnt
            # the rejections of the steps it applied since: it may be behind the mirror.
            if engine_says > mirror or (self.spec is None and engine_says != mirror):
                raise RuntimeError(
                    f"request {req_id}: the engine says {engine_says} computed tokens, the runner {mirror}"
                )
            if self.spec is not None:
                states.num_computed_np[row] = engine_says
                states.num_tokens_np[row] = (
                    states.num_prompt_tokens_np[row] + cached.num_output_tokens[i]
                )
            if cached.new_block_ids[i]:
                states.append_block_ids(req_id, cached.new_block_ids[i] or [])

    def _execute_decoder(self, so: SchedulerOutput) -> AsyncOutput:
        states = self.states
        req_ids = list(so.num_scheduled_tokens)
        rows = np.asarray([states.req_id_to_row[r] for r in req_ids], np.int32)
        num_sched = np.asarray([so.num_scheduled_tokens[r] for r in req_ids], np.int32)
        plan = BatchPlan.build(
            req_ids, rows, num_sched, states.num_computed_np, states.num_tokens_np
        )
        sp = (
            None
            if self.spec is None
            else spec_decode.plan_spec_step(
                req_ids,
                so.scheduled_spec_decode_tokens,
                num_sched,
                plan.num_computed_np,
                states.num_prompt_tokens_np[rows],
                plan.query_start_loc_np,
                self.config.num_speculative_tokens,
            )
        )
        prompt_plan = plan_prompt_logprobs(
            req_ids,
            rows,
            plan.num_computed_np,
            num_sched,
            plan.query_start_loc_np,
            states.num_prompt_tokens_np,
            states.num_prompt_logprobs_np,
            self.config.max_model_len,
        )
        ks = np.where(
            plan.samples_np, states.num_logprobs_np[rows], -1
        )  # a partial prefill has none
        lp_idx = np.flatnonzero(ks >= 0)
        graph = self.graphs.choose(
            plan,
            prompt_plan is not None,
            sp.uniform if sp is not None and sp.max_spec > 0 else None,
        )
        if graph is not None:
            plan = self.graphs.pad(plan, graph)
        prompt = (
            None
            if prompt_plan is None
            else (prompt_plan.hidden_rows, prompt_plan.target_flat, prompt_plan.num_logprobs)
        )
        dev = upload_step(
            self.device,
            rows=rows,
            num_scheduled=num_sched,
            logprob_positions=lp_idx,
            logprob_k=ks[lp_idx],
            writes=states.take_staged_writes(),
            prompt=prompt,
            spec=None if sp is None else spec_decode.upload_arrays(sp, rows, ks),
        )
        if dev.writes is not None:
            states.apply_staged_writes(dev.writes.offsets, dev.writes.cu_lens, dev.writes.values)
        proposal = None if sp is None else self._propose(sp, dev, rows)  # drafts into the table
        batch = self._prepare(plan, dev.idx_mapping, dev.num_scheduled)
        rows_scored = None  # the target's rows: each request's last token, or 1 + s with drafts
        if sp is not None and sp.max_spec > 0:
            assert (
                dev.spec is not None and proposal is not None
            )  # drafts are scheduled for decodes only
            rows_scored = dev.spec.logits_indices
        hidden, logits = self._forward(batch, graph, rows_scored)
        if sp is not None and proposal is not None:
            results = self._verify(batch, logits, sp, dev, proposal, ks)
        else:
            results = self._sample(batch, logits, lp_idx, ks, dev)
            assert results.sampled is not None
            post_update(
                batch.idx_mapping,
                batch.num_scheduled,
                batch.seq_lens,
                results.sampled,
                states.col(Col.NUM_COMPUTED_TOKENS),
                states.col(Col.NUM_TOKENS),
                states.col(Col.LAST_SAMPLED),
                states.token_ids,
                plan.num_reqs,
            )
        if prompt_plan is not None:
            assert hidden is not None  # prompt logprobs never run in a graph
            self._prompt_logprobs(results, prompt_plan, hidden, dev)
        if (
            self.draft is not None and sp is not None and sp.has_prefill
        ):  # the draft sees the prompts too
            self.draft.mirror(batch.input_ids, batch.positions, batch.attn_metadata)
        states.num_computed_np[rows] += num_sched  # optimistic with drafts: see _update_states
        drafts = sp.num_spec[plan.samples_np] if sp is not None else 0
        states.num_tokens_np[rows[plan.samples_np]] += 1 + drafts
        return AsyncOutput(results, self.copy_stream)

    def _prepare(
        self, plan: BatchPlan, idx_mapping: torch.Tensor, num_scheduled: torch.Tensor
    ) -> InputBatch:
        states = self.states
        prefill_len = states.col(Col.PREFILL_LEN) if self.spec is None else self._from_table
        return prepare_inputs(
            plan,
            self.buffers,
            idx_mapping=idx_mapping,
            num_scheduled=num_scheduled,
            num_computed=states.col(Col.NUM_COMPUTED_TOKENS),
            prefill_len=prefill_len,
            last_sampled=states.col(Col.LAST_SAMPLED),
            token_ids=states.token_ids,
            block_table=states.block_table,
            block_size=self.config.block_size,
            max_model_len=self.config.max_model_len,
        )

    def _forward(
        self, batch: InputBatch, graph: tuple[DecodeGraphs, int] | None, rows: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        # The logits of `rows` (the step's tokens; default: each request's last).
        model = self.model
        assert isinstance(model, DecoderModel)
        n = batch.plan.num_reqs
        if graph is not None:
            graphs, size = graph
            self.num_graph_steps += 1
            hidden = graphs.replay(size)
            self.num_mixed_graph_steps += graphs is self.graphs.mixed
            if (
                graphs is self.graphs.decode
            ):  # one token per request, so hidden row i is request i's
                return None, model.compute_logits(hidden[:n])
            # 1 + k tokens per request (rows in step order), or a mixed step's last tokens
            return None, model.compute_logits(
                hidden.index_select(0, batch.logits_indices if rows is None else rows)
            )
        self.num_eager_steps += 1
        md = batch.attn_metadata
        if self.has_inner_state:  # a request's state slot is its table row (rows never move)
            md = dataclasses.replace(
                md,
                state_indices=batch.idx_mapping[:n],
                all_states_continue=bool((batch.plan.num_computed_np > 0).all()),
            )
        hidden = model(batch.input_ids, batch.positions, self.kv_caches, md)
        return hidden, model.compute_logits(
            hidden.index_select(0, batch.logits_indices if rows is None else rows)
        )

    # ---- speculative decoding (runner_v2/spec_decode.py) ---------------------------------
    def _propose(
        self, sp: spec_decode.SpecStepPlan, dev: StepUploads, rows: np.ndarray
    ) -> Proposal | None:
        states, spec = self.states, dev.spec
        assert spec is not None and self.spec is not None
        if self.draft is None:  # ngram_gpu
            if sp.max_spec == 0:
                return None
            drafts, num_drafts = spec_decode.propose_ngram(
                self.spec,
                dev.idx_mapping,
                spec.num_spec,
                states.col(Col.NUM_TOKENS),
                states.token_ids,
            )
            return drafts, num_drafts, None
        decode = np.flatnonzero(sp.decode)
        if decode.size == 0:
            return None
        drows = rows[decode]
        proposal = self.draft.propose(
            DraftStep(
                rows_np=drows,
                rows=spec.decode_rows,
                num_spec=spec.num_spec.index_select(0, spec.decode_pos),
                max_spec=sp.max_spec,
                num_computed=states.col(Col.NUM_COMPUTED_TOKENS),
                num_computed_np=states.num_computed_np,
                token_ids=states.token_ids,
                block_table=states.block_table,
                tables=states.sampling_tables(),
                use_penalties=bool(states.has_penalties_np[drows].any()),
                want_probs=bool(states.is_sampled_np[drows].any()),
            )
        )
        if proposal is None:
            return None
        n = len(sp.num_spec)
        drafts = spec_decode.by_position(proposal[0], spec.decode_pos, n, -1)
        probs = (
            None
            if proposal[1] is None
            else spec_decode.by_position(proposal[1], spec.decode_pos, n, 0.0)
        )
        return drafts, spec.num_spec, probs

    def _verify(
        self,
        batch: InputBatch,
        logits: torch.Tensor,
        sp: spec_decode.SpecStepPlan,
        dev: StepUploads,
        proposal: Proposal,
        ks: np.ndarray,
    ) -> StepResults:
        states, spec, plan = self.states, dev.spec, batch.plan
        assert spec is not None
        req_rows = plan.idx_mapping_np
        row_rows = batch.idx_mapping.index_select(0, spec.row_req)  # table row of each target row
        row_pos = (batch.positions.index_select(0, spec.logits_indices) + 1).to(torch.int32)
        sampled, probs = sample_with_probs(
            logits,
            row_rows,
            row_pos,
            states.sampling_tables(),
            states.token_ids,
            bool(states.has_penalties_np[req_rows].any()),
            bool(states.is_sampled_np[req_rows].any()),
        )
        v = spec_decode.Verification(
            batch.idx_mapping,
            batch.num_scheduled,
            spec.num_spec,
            batch.seq_lens,
            spec.cu_rows,
            *proposal,
        )
        counters = (
            states.col(Col.NUM_COMPUTED_TOKENS),
            states.col(Col.NUM_TOKENS),
            states.col(Col.LAST_SAMPLED),
            states.col(Col.NUM_DRAFTS),
            states.col(Col.NUM_ACCEPTED),
        )
        tokens, num_sampled = spec_decode.verify(
            v,
            sampled,
            row_pos,
            probs,
            states.col_f32(Col.TEMPERATURE),
            states.seed,
            counters,
            states.token_ids,
        )
        results = StepResults(
            req_ids=plan.req_ids,
            samples=plan.samples_np,
            sampled=tokens,
            num_sampled=num_sampled,
            num_drafts=states.col(Col.NUM_DRAFTS).index_select(0, batch.idx_mapping),
            num_spec=sp.num_spec,
        )
        wanted = np.flatnonzero(ks >= 0)
        if wanted.size:
            lp_tokens = tokens.view(-1).index_select(0, spec.lp_cells).clamp(min=0)
            chunks = compute_logprobs(
                lambda a, b: logits.index_select(0, spec.lp_rows[a:b]),
                lp_tokens,
                spec.lp_k,
                int(ks[wanted].max()),
                self.config.vocab_size,
            )
            results.logprobs = [(c.token_ids, c.logprobs, c.ranks) for c in chunks]
            results.logprob_reqs = (wanted, ks[wanted])
            results.logprob_spans = 1 + sp.num_spec[wanted]
        return results

    def _sample(
        self,
        batch: InputBatch,
        logits: torch.Tensor,
        lp_idx: np.ndarray,
        ks: np.ndarray,
        dev: StepUploads,
    ) -> StepResults:
        plan, states = batch.plan, self.states
        n = plan.num_reqs
        sampled = sample(
            logits,
            batch.idx_mapping,
            batch.seq_lens[:n],
            states.sampling_tables(),
            states.token_ids,
            bool(states.has_penalties_np[plan.idx_mapping_np].any()),
        )
        results = StepResults(req_ids=plan.req_ids, samples=plan.samples_np, sampled=sampled)
        if lp_idx.size:
            sel = dev.logprob_positions
            chunks = compute_logprobs(
                lambda a, b: logits.index_select(0, sel[a:b]),
                sampled.index_select(0, sel),
                dev.logprob_k,
                int(ks[lp_idx].max()),
                self.config.vocab_size,
            )
            results.logprobs = [(c.token_ids, c.logprobs, c.ranks) for c in chunks]
            results.logprob_reqs = (lp_idx, ks[lp_idx])
        return results

    def _prompt_logprobs(
        self, results: StepResults, plan: PromptLogprobsPlan, hidden: torch.Tensor, dev: StepUploads
    ) -> None:
        model = self.model
        assert isinstance(model, DecoderModel) and dev.prompt is not None
        up = dev.prompt
        chunks = compute_prompt_logprobs(
            hidden,
            model.compute_logits,
            self.states.token_ids,
            up.hidden_rows,
            up.target_flat,
            up.num_logprobs,
            plan.max_k,
            self.config.vocab_size,
        )
        results.prompt_logprobs = [(c.token_ids, c.logprobs, c.ranks) for c in chunks]
        rows = [self.states.req_id_to_row[r] for r in plan.req_ids]
        results.prompt_reqs = (
            plan.req_ids,
            plan.starts,
            plan.counts,
            self.states.num_prompt_logprobs_np[rows],
        )

    # ---- pooling -------------------------------------------------------------------------
    def _execute_pooling(self, so: SchedulerOutput) -> ModelRunnerOutput | AsyncOutput:
        # One forward per step over the new requests (pooling runs in one step).
        if so.is_empty:
            return EMPTY_MODEL_RUNNER_OUTPUT
        req_ids, embeddings = self.pool_scheduled(so)
        results = StepResults(
            req_ids=req_ids,
            samples=np.zeros(len(req_ids), bool),
            pooled=req_ids,
            embeddings=embeddings,
        )
        return AsyncOutput(results, self.copy_stream)


#: What runner_v2 serves: every architecture of the model layer; the speculative methods the
#: engine can express minus those refusals.py refuses (ngram_gpu and draft_model); every option of
#: engine.capabilities.FEATURES but those refusals.py refuses; Triton required
#: (refusals.check_engine_config); asynchronous scheduling and decode CUDA graphs; tensor
#: parallelism for the architectures the model layer shards.
MANIFEST = RunnerManifest.build(
    "v2",
    architectures=model_layer_architectures(),
    refused=tuple(refusals.REFUSED_FEATURES),
    speculative_methods=[
        m for m in SUPPORTED_SPECULATIVE_METHODS if m not in refusals.REFUSED_SPECULATIVE_METHODS
    ],
    pooling_tasks=POOLING_TASKS,
    platforms=DEVICE_TYPES,
    requires_triton=True,
    async_scheduling=V2ModelRunner.async_scheduling,
    cuda_graphs=True,
    tensor_parallel_architectures=TENSOR_PARALLEL_ARCHITECTURES,
)


__all__ = ["MANIFEST", "MAX_STOP_TOKEN_IDS", "V2ModelRunner"]
