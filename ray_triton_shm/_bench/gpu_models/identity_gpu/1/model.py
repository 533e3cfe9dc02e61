"""identity_gpu: OUTPUT0 = a copy of INPUT0 on the GPU (torch through DLPack: Python-backend
models that return NumPy arrays answered zeros on a GPU)."""

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            x = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cuda()
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(x.clone()))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
