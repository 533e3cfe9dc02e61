"""variable_output: OUTPUT0[i] = arange(n) with n = max(INPUT0) over the request's batch."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            counts = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = counts.shape[0]
            n = max(int(counts.max()), 0) if counts.size else 0
            y = np.tile(np.arange(n, dtype=np.float32), (b, 1))
            out = pb_utils.Tensor("OUTPUT0", y)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
