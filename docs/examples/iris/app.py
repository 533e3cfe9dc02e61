"""The iris classifier behind Ray Serve, through shared memory (docs/guide/own-model.md).

    RAY_TRITON_SHM_URL=localhost:8001 serve run --app-dir docs/examples/iris app:app
    curl -s localhost:8000/ -d '{"features": [[5.1, 3.5, 1.4, 0.2]]}'   # {"class": [0]}
"""

from __future__ import annotations

import numpy as np
from ray import serve
from starlette.requests import Request

from ray_triton_shm.ray import ShmModel

SPECIES = ("setosa", "versicolor", "virginica")


@serve.deployment
class Iris:
    def __init__(self) -> None:
        self.model = ShmModel("iris")  # its specs from Triton's config of the model

    async def __call__(self, request: Request) -> dict[str, list]:
        features = np.asarray((await request.json())["features"], np.float32)
        answer = await self.model.infer_async({"FEATURES": features})
        classes = answer["CLASS"].ravel().tolist()
        return {"class": classes, "species": [SPECIES[c] for c in classes]}


app = Iris.bind()
