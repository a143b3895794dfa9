"""KServe 0.21 as its users write it: a ``kserve.Model`` whose ``predict`` runs the ONNX file
with onnxruntime, one request at a time (KServe has no batcher of its own), served by
``kserve.ModelServer`` over REST (v2, binary tensors too) and gRPC.

Run by benches/bench_netserve.py with the python of benches/out/venvs/kserve:
    python kserve_server.py MODEL.onnx --http_port P --grpc_port G
Outputs are set as raw bytes (``set_data_from_numpy(..., binary_data=True)``): KServe's gRPC
answers fail on numpy outputs (the answer as kserve.utils.utils.get_predict_response builds it).
Its per-request logs are off: the latency log, uvicorn's access log, kserve.trace's timings and
the gRPC interceptor's line per call."""

import argparse
import logging

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.numpy_codec import from_np_dtype
from kserve.utils.utils import generate_uuid


class OnnxModel(Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()  # fastseq serve's session options: the difference is the serving
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        names = [o.name for o in self.session.get_outputs()]
        outputs = []
        for name, array in zip(names, self.session.run(None, {self.input: x})):
            out = InferOutput(name=name, shape=list(array.shape), datatype=from_np_dtype(array.dtype))
            out.set_data_from_numpy(np.ascontiguousarray(array), binary_data=True)
            outputs.append(out)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--name", default="m")
    p.add_argument("--http_port", type=int, required=True)
    p.add_argument("--grpc_port", type=int, required=True)
    a, _ = p.parse_known_args()
    server = ModelServer(http_port=a.http_port, grpc_port=a.grpc_port, enable_latency_logging=False, workers=1)
    for name in ("uvicorn.access", "kserve.trace", "kserve"):  # the lines it writes per request: off
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([OnnxModel(a.name, a.model)])
