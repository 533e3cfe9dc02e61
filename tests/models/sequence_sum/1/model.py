"""sequence_sum: SUM = the running sum of VALUE over the steps of the request's sequence."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:

            def get(name, request=request):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            value = get("VALUE")
            rows = value.shape[0]
            if not int(get("READY").flatten()[0]):
                out = np.zeros((rows, 1), np.int64)
            else:
                sequence = int(get("CORRID").flatten()[0])
                if int(get("START").flatten()[0]):
                    self.sums[sequence] = 0
                total = self.sums.get(sequence, 0) + int(value.astype(np.int64).sum())
                self.sums[sequence] = total
                if int(get("END").flatten()[0]):
                    self.sums.pop(sequence, None)
                out = np.full((rows, 1), total, np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", out)]))
        return responses
