"""whoami: ECHO = DATA, and WHO = $WHOAMI of the Triton that runs it (0 if unset)."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

WHO = int(os.environ.get("WHOAMI", "0"))


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "DATA").as_numpy()
            who = np.full((data.shape[0], 1), WHO, dtype=np.int32)
            outputs = [pb_utils.Tensor("ECHO", data), pb_utils.Tensor("WHO", who)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
