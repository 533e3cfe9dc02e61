"""my_model.

OUTPUT0 = x.reshape(b, -1)[:, :512] + INPUT1.sum(axis=1, keepdims=True).astype(np.float32)
OUTPUT1 = INPUT1[:, :5] * 2
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            f = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            b = x.shape[0]
            y0 = x.reshape(b, -1)[:, :512] + f.sum(axis=1, keepdims=True).astype(np.float32)
            y1 = f[:, :5] * 2
            out0 = pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(y0, dtype=np.float32))
            out1 = pb_utils.Tensor("OUTPUT1", np.ascontiguousarray(y1, dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
