"""fail_on_negative: OUTPUT0 = INPUT0, or the error "negative input: ..." if any value < 0."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError(
                    f"negative input: {int((x < 0).sum())} value(s) < 0, min {float(x.min())}"
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            out = pb_utils.Tensor("OUTPUT0", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
