"""Tensor parallelism over ``torch.distributed`` (docs/architecture.md §5.6,
docs/tensor-parallel.md): one process per rank, the engine's process being rank 0.

- ``engine.parallel.group``: the process groups (a TCP store on 127.0.0.1, the data group of
  the model's collectives: gloo on CPU, NCCL on CUDA; a gloo control group for the commands),
  and this process's :class:`~engine.model.parallel_layers.TensorParallel` place.
- ``engine.parallel.worker``: the loop of ranks ``1 .. N-1``: the same runner on its shard,
  driven by the commands rank 0 broadcasts.
- ``engine.parallel.executor``: :class:`TensorParallelRunner`, rank 0's side: a
  :class:`~engine.runner_protocol.ModelRunner` that broadcasts each call (the scheduler's output
  once per step) and raises :class:`~engine.errors.TensorParallelError` when a rank fails.

Part of the runner wiring: these modules load torch (imported only for ``tensor_parallel_size
> 1``).
"""
