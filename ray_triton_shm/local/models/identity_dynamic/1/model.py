"""identity_dynamic: OUTPUT0 = INPUT0 (identity, with Triton's dynamic batcher on)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
