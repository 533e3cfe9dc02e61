"""batch_affine: Y = 2 * X + 1, after sleeping the largest DELAY_US of the request's rows; a
negative DELAY_US fails the whole request (a Triton error for every row in it)."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            delay_us = pb_utils.get_input_tensor_by_name(request, "DELAY_US").as_numpy()
            if delay_us.min() < 0:
                error = pb_utils.TritonError(f"DELAY_US must be >= 0, got {delay_us.min()}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            time.sleep(int(delay_us.max()) / 1e6)  # the load itself: the test's delay
            y = (2 * x + 1).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
