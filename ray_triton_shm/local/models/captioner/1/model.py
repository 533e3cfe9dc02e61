"""captioner: a streaming (decoupled) model. Reads IMAGE and streams COUNT responses, one every
DELAY_US microseconds: response k is TOKEN = k and FEATURE = IMAGE.flat[4k:4k+4] (wrapping).
COUNT 0 sends no response (the end alone); COUNT < 0 sends -COUNT responses, then an error.
A cancelled request (its client went away) stops at the next response."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _stream(request, image, count, delay_s):
    sender = request.get_response_sender()
    flat = image.reshape(-1)
    for k in range(abs(count)):
        if request.is_cancelled():
            error = pb_utils.TritonError("cancelled by the client", pb_utils.TritonError.CANCELLED)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        if k and delay_s:
            time.sleep(delay_s)  # the model's own pace, chosen by the request
        start = (4 * k) % (flat.size - 3)
        token = pb_utils.Tensor("TOKEN", np.array([k], np.int32))
        feature = pb_utils.Tensor("FEATURE", flat[start : start + 4].copy())
        sender.send(pb_utils.InferenceResponse(output_tensors=[token, feature]))
    if count < 0:
        error = pb_utils.TritonError(f"captioner failed after {-count} responses (COUNT < 0)")
        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
    else:
        sender.send(flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            delay_us = int(pb_utils.get_input_tensor_by_name(request, "DELAY_US").as_numpy()[0])
            if delay_us > 0:  # paced streams run side by side, each on a thread of its own
                args = (request, image, count, delay_us / 1e6)
                threading.Thread(target=_stream, args=args, daemon=True).start()
            else:
                _stream(request, image, count, 0.0)
        return None
