"""gpu_affine: OUTPUT0 = 2 * INPUT0 + 1 on the GPU (torch through DLPack: Python-backend models
that return NumPy arrays answered zeros on the GPU machine), ON_GPU = whether INPUT0 came in
GPU memory. Sleeps the request parameter ``delay_ms`` first."""

import json
import time

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            delay_ms = json.loads(request.parameters() or "{}").get("delay_ms", 0)
            if delay_ms:
                time.sleep(delay_ms / 1000)  # the load itself: the model's own delay
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            x = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            on_gpu = x.is_cuda
            x = x.cuda()
            y = (x * 2 + 1).contiguous()
            flag = torch.full((x.shape[0], 1), int(on_gpu), dtype=torch.int32, device=x.device)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(y)),
                        pb_utils.Tensor.from_dlpack("ON_GPU", torch.utils.dlpack.to_dlpack(flag)),
                    ]
                )
            )
        return responses
