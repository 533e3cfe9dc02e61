"""slow_identity: OUTPUT0 = INPUT0, after sleeping SLEEP_S per request."""

import time

import triton_python_backend_utils as pb_utils

SLEEP_S = 0.3


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(SLEEP_S)  # the load itself: the model's own delay
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
