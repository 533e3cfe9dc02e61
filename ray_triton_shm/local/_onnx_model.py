"""An ONNX model served by Triton's Python backend with onnxruntime (``onnx_via_python``).

Copied as ``<model>/<version>/model.py`` into the repository that
:func:`ray_triton_shm.local._onnx.onnx_via_python_repository` generates; runs in the server
environment (``ray-triton-shm setup-server --with onnxruntime``), never in the client's. The
config's ``parameters`` name the original model's directory and file; the version is Triton's.
Requests of a batching model (``max_batch_size`` > 0) that Triton hands over together are run
as one batch. Tensors whose shape per sample differs between Triton and the graph (a config's
``reshape``, or a classifier's label of one value per sample, ``[1]`` in Triton) are reshaped
here, as the ``onnx_reshapes`` parameter says: the Python backend does not apply a ``reshape``.
"""

import json
import os

import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        directory = parameters["onnx_model_directory"]["string_value"]
        filename = parameters["onnx_model_filename"]["string_value"]
        path = os.path.join(directory, args["model_version"], filename)
        self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config.get("input", [])]
        self.outputs = [o["name"] for o in config.get("output", [])]
        self.batching = int(config.get("max_batch_size", 0)) > 0
        reshapes = json.loads(parameters.get("onnx_reshapes", {}).get("string_value") or "{}")
        self.input_shapes = reshapes.get("inputs", {})
        self.output_shapes = reshapes.get("outputs", {})

    def _shaped(self, array, shape):
        """``array`` with ``shape`` per sample (its batch dimension kept)."""
        if shape is None:
            return array
        lead = array.shape[:1] if self.batching else ()
        return array.reshape((*lead, *shape))

    def execute(self, requests):
        feeds = [self._feed(request) for request in requests]
        if self.batching and len(feeds) > 1 and self._stackable(feeds):
            try:
                return self._run_together(feeds)
            except Exception as exc:  # answer each request with the error, as one by one would
                return [self._error(exc) for _ in requests]
        return [self._run(feed) for feed in feeds]

    def _feed(self, request):
        feed = {}
        for name in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:  # an optional input not sent
                feed[name] = self._shaped(tensor.as_numpy(), self.input_shapes.get(name))
        return feed

    def _stackable(self, feeds):
        first = feeds[0]
        return all(
            feed.keys() == first.keys()
            and all(feed[n].shape[1:] == first[n].shape[1:] for n in first)
            for feed in feeds
        )

    def _run(self, feed):
        try:
            results = self.session.run(self.outputs, feed)
        except Exception as exc:
            return self._error(exc)
        return self._response(results)

    def _run_together(self, feeds):
        sizes = [len(next(iter(feed.values()))) if feed else 0 for feed in feeds]
        stacked = {n: np.concatenate([feed[n] for feed in feeds]) for n in feeds[0]}
        results = self.session.run(self.outputs, stacked)
        bounds = np.cumsum([0, *sizes])
        return [
            self._response([r[bounds[i] : bounds[i + 1]] for r in results])
            for i in range(len(feeds))
        ]

    def _response(self, results):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor(n, np.ascontiguousarray(self._shaped(r, self.output_shapes.get(n))))
                for n, r in zip(self.outputs, results)
            ]
        )

    def _error(self, exc):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {exc}"))
