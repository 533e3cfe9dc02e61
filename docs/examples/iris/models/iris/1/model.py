"""iris: a scikit-learn classifier of iris flowers (sepal and petal length and width, in cm).

It trains on the iris data scikit-learn ships when Triton loads it, so that no pickle crosses
from the client's numpy to the server's (Triton's Python backend runs numpy<2).
"""

import numpy as np
import triton_python_backend_utils as pb_utils
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression


class TritonPythonModel:
    def initialize(self, args):
        features, species = load_iris(return_X_y=True)
        self.model = LogisticRegression(max_iter=1000).fit(features, species)

    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            probabilities = self.model.predict_proba(features).astype(np.float32)
            classes = probabilities.argmax(axis=1).astype(np.int64).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("PROBABILITIES", probabilities),
                        pb_utils.Tensor("CLASS", classes),
                    ]
                )
            )
        return responses
