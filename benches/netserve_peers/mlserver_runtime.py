"""Seldon MLServer 1.7.1 as its users write it: a custom ``MLModel`` runtime running the ONNX
file with onnxruntime; MLServer's adaptive batching (``max_batch_size``, ``max_batch_time`` in
model-settings.json, written by benches/bench_netserve.py) joins concurrent requests.

Started as ``mlserver start DIR`` with the mlserver of benches/out/venvs/mlserver; DIR holds
settings.json, model-settings.json and a copy of this file."""

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()  # fastseq serve's session options: the difference is the serving
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(self.settings.parameters.uri, options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.names = [o.name for o in self.session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        outputs = self.session.run(None, {self.input: x})
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(n, a) for n, a in zip(self.names, outputs)],
        )
