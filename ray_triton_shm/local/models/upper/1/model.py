"""upper: UPPER = TEXT with ASCII letters upper-cased; LENGTH = its length in bytes."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([[t.upper()] for t in text[:, 0]], dtype=np.object_)
            length = np.array([[len(t)] for t in text[:, 0]], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("UPPER", upper),
                        pb_utils.Tensor("LENGTH", length),
                    ]
                )
            )
        return responses
