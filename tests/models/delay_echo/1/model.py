"""delay_echo: ECHO = DATA, after sleeping DELAY_MS milliseconds (chosen by the request)."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            delay_ms = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0])
            time.sleep(max(delay_ms, 0) / 1000)  # the load itself: the model's own delay
            data = pb_utils.get_input_tensor_by_name(request, "DATA").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ECHO", data)]))
        return responses
