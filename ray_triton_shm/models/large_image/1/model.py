"""large_image: OUTPUT0 = 1.0 - INPUT0."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.subtract(np.float32(1.0), x, dtype=np.float32)
            out = pb_utils.Tensor("OUTPUT0", y)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
