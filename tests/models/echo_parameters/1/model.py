"""echo_parameters: PARAMETERS = the request's parameters as JSON; DOUBLE = 2 * INPUT0."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            text = np.array([request.parameters().encode()], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("PARAMETERS", text), pb_utils.Tensor("DOUBLE", 2 * x)]
                )
            )
        return responses
