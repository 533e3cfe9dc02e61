"""The ways of getting a request to Triton that the bench compares, each a
:class:`~._base.BenchPath` (the registry of them by name is :data:`.._runner.PATHS`):

* :mod:`._plain`: plain gRPC and HTTP by value, and the memcpy floor;
* :mod:`._shm`: system shared memory by hand, and the core client three ways;
* :mod:`._gpu`: tensors on a GPU (``bench --memory cuda``);
* :mod:`._perf_analyzer`: Triton's perf_analyzer, the ceiling;
* :mod:`._ray`: Ray's caller processes, Serve and Ray Data (``bench --ray``), on the private
  Ray of :mod:`._ray_session`, whose processes run :mod:`._ray_callers`;
* :mod:`._batching`: the many-callers case's own (node batching, Triton's dynamic batcher,
  by value);
* :mod:`._http`: the example app behind Serve's HTTP proxy.

What they share: :mod:`._base` (the path, its target, its skip), :mod:`._clients` (the
backends, and the one way a measured client is made), :mod:`._regions` (shared memory by
hand). Their load comes from :mod:`.._load`.
"""
