"""mixed_io: SUM, DOUBLED, GREETING and POSITIVE from PIXELS, IDS and NAME (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            ids = pb_utils.get_input_tensor_by_name(request, "IDS").as_numpy()
            names = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()
            greeting = np.array([[b"hello " + n] for n in names[:, 0]], dtype=np.object_)
            outputs = [
                pb_utils.Tensor("SUM", pixels.sum(axis=(1, 2)).reshape(-1, 1).astype(np.float32)),
                pb_utils.Tensor("DOUBLED", (ids * 2).astype(np.int64)),
                pb_utils.Tensor("GREETING", greeting),
                pb_utils.Tensor("POSITIVE", (pixels > 0).astype(np.uint8)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
