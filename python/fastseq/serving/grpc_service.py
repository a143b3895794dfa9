"""The KServe v2 protocol over gRPC: the ``inference.GRPCInferenceService`` that Triton's
gRPC clients (``tritonclient.grpc``) call, over the same :class:`~.service.Service` as HTTP
(the same models, batching, limits, timeouts and metrics).

The messages are described here in code, in a descriptor pool of fastseq's own, with the
package, names and field numbers of Triton's ``grpc_service.proto``: the same bytes on the
wire, with no generated code to match a protobuf version and nothing shared with a client's
own copy of the file in the same process. Served: ``ServerLive``, ``ServerReady``,
``ModelReady``, ``ServerMetadata``, ``ModelMetadata`` and ``ModelInfer`` (inputs as
``raw_input_contents`` or typed ``contents``; outputs always as ``raw_output_contents``, as
Triton answers). The other methods answer UNIMPLEMENTED. A request over
``max_request_bytes`` is refused by gRPC itself from its length prefix."""

from __future__ import annotations

import time
from typing import Any

from fastseq._core import __version__
from fastseq.errors import RequestError
from fastseq.serving.protocol import (
    InferRequest, declared_shape, from_binary, from_values, input_dtype, output_named, raw_data, request_timeout,
)
from fastseq.serving.service import Service

SERVICE = "inference.GRPCInferenceService"

#: the typed ``contents`` field of each datatype (FP16 comes as raw bytes only)
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _messages() -> dict[str, Any]:
    """The message classes, by name, from Triton's field numbers."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    kinds = {"string": F.TYPE_STRING, "bool": F.TYPE_BOOL, "int64": F.TYPE_INT64, "int32": F.TYPE_INT32,
             "uint32": F.TYPE_UINT32, "uint64": F.TYPE_UINT64, "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE,
             "bytes": F.TYPE_BYTES}
    file = descriptor_pb2.FileDescriptorProto(name="fastseq/grpc_service.proto", package="inference", syntax="proto3")

    def message(into: Any, name: str, fields: str, oneof: str | None = None) -> Any:
        """``fields``: "repeated? type name number" separated by ';'; a type in capitals is a message."""
        m = into.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for spec in filter(None, (f.strip() for f in fields.split(";"))):
            *label, kind, field_name, number = spec.split()
            f = m.field.add(name=field_name, number=int(number),
                            label=F.LABEL_REPEATED if label else F.LABEL_OPTIONAL)
            if kind in kinds:
                f.type = kinds[kind]
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".inference.{kind}"
            if oneof:
                f.oneof_index = 0
        return m

    def parameters(m: Any, number: int, owner: str) -> None:
        entry = m.nested_type.add(name="ParametersEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                        type_name=".inference.InferParameter")
        m.field.add(name="parameters", number=number, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=f".inference.{owner}.ParametersEntry")

    t = file.message_type
    for name, fields in (
        ("ServerLiveRequest", ""), ("ServerLiveResponse", "bool live 1"),
        ("ServerReadyRequest", ""), ("ServerReadyResponse", "bool ready 1"),
        ("ModelReadyRequest", "string name 1; string version 2"), ("ModelReadyResponse", "bool ready 1"),
        ("ServerMetadataRequest", ""),
        ("ServerMetadataResponse", "string name 1; string version 2; repeated string extensions 3"),
        ("ModelMetadataRequest", "string name 1; string version 2"),
        ("InferTensorContents", "repeated bool bool_contents 1; repeated int32 int_contents 2; "
         "repeated int64 int64_contents 3; repeated uint32 uint_contents 4; repeated uint64 uint64_contents 5; "
         "repeated float fp32_contents 6; repeated double fp64_contents 7; repeated bytes bytes_contents 8"),
    ):
        message(t, name, fields)
    message(t, "InferParameter", "bool bool_param 1; int64 int64_param 2; string string_param 3; "
            "double double_param 4; uint64 uint64_param 5", oneof="parameter_choice")
    meta = message(t, "ModelMetadataResponse", "string name 1; repeated string versions 2; string platform 3; "
                   "repeated ModelMetadataResponse.TensorMetadata inputs 4; "
                   "repeated ModelMetadataResponse.TensorMetadata outputs 5")
    message(meta.nested_type, "TensorMetadata", "string name 1; string datatype 2; repeated int64 shape 3")
    request = message(t, "ModelInferRequest", "string model_name 1; string model_version 2; string id 3; "
                      "repeated ModelInferRequest.InferInputTensor inputs 5; "
                      "repeated ModelInferRequest.InferRequestedOutputTensor outputs 6; "
                      "repeated bytes raw_input_contents 7")
    parameters(request, 4, "ModelInferRequest")
    tensor = message(request.nested_type, "InferInputTensor", "string name 1; string datatype 2; "
                     "repeated int64 shape 3; InferTensorContents contents 5")
    parameters(tensor, 4, "ModelInferRequest.InferInputTensor")
    parameters(message(request.nested_type, "InferRequestedOutputTensor", "string name 1"), 2,
               "ModelInferRequest.InferRequestedOutputTensor")
    response = message(t, "ModelInferResponse", "string model_name 1; string model_version 2; string id 3; "
                       "repeated ModelInferResponse.InferOutputTensor outputs 5; repeated bytes raw_output_contents 6")
    parameters(response, 4, "ModelInferResponse")
    out = message(response.nested_type, "InferOutputTensor", "string name 1; string datatype 2; "
                  "repeated int64 shape 3; InferTensorContents contents 5")
    parameters(out, 4, "ModelInferResponse.InferOutputTensor")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{m.name}"))
            for m in file.message_type}


def _parameter(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def decode(model: Any, m: Any) -> InferRequest:
    """A ModelInferRequest as the request :meth:`Service.infer` runs, checked as HTTP's are."""
    if m.raw_input_contents and len(m.raw_input_contents) != len(m.inputs):
        raise RequestError(f"the request has {len(m.raw_input_contents)} raw_input_contents for {len(m.inputs)} "
                           "inputs: give every input's data raw, or none")
    feeds: dict[str, Any] = {}
    for k, tensor in enumerate(m.inputs):
        name, datatype = tensor.name, tensor.datatype
        dtype = input_dtype(model.name, model.inputs, feeds, name, datatype)
        shape, count = declared_shape(name, list(tensor.shape))
        if m.raw_input_contents:
            raw = m.raw_input_contents[k]
            feeds[name] = from_binary(name, raw, 0, len(raw), datatype, dtype, shape, count)
            continue
        field = CONTENTS.get(datatype)
        if field is None:
            raise RequestError(f"input '{name}' is {datatype}: send it as raw_input_contents")
        values = list(getattr(tensor.contents, field))
        if datatype == "BYTES":
            try:
                values = [v.decode() for v in values]
            except UnicodeDecodeError as e:
                raise RequestError(f"input '{name}': a BYTES element is not UTF-8 text ({e.reason})") from None
        feeds[name] = from_values(name, values, datatype, dtype, shape, count)
    timeout = request_timeout({k: _parameter(v) for k, v in m.parameters.items()})
    asked = None
    if m.outputs:  # outputs always go back as raw_output_contents
        seen: set[str] = set()
        for o in m.outputs:
            output_named(model.name, model.outputs, seen, o.name)
        asked = [(o.name, True) for o in m.outputs]
    if not feeds:
        raise RequestError(f"the request has no inputs; model '{model.name}' takes {', '.join(model.inputs)}")
    return InferRequest(m.id or None, feeds, asked, True, timeout)


def _code(status: int) -> Any:
    """The gRPC status of each HTTP status the service answers with."""
    import grpc

    return {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
            413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}.get(
        status, grpc.StatusCode.INTERNAL)


class GrpcService:
    """The ``inference.GRPCInferenceService`` methods over ``service``."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.m = _messages()

    def handler(self) -> Any:
        """The service as gRPC's generic handler: each method with its messages' parsers."""
        import grpc

        m = self.m
        methods = {
            "ServerLive": (self.server_live, "ServerLiveRequest", "ServerLiveResponse"),
            "ServerReady": (self.server_ready, "ServerReadyRequest", "ServerReadyResponse"),
            "ModelReady": (self.model_ready, "ModelReadyRequest", "ModelReadyResponse"),
            "ServerMetadata": (self.server_metadata, "ServerMetadataRequest", "ServerMetadataResponse"),
            "ModelMetadata": (self.model_metadata, "ModelMetadataRequest", "ModelMetadataResponse"),
            "ModelInfer": (self.model_infer, "ModelInferRequest", "ModelInferResponse"),
        }
        return grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=m[req].FromString,
                                                      response_serializer=m[resp].SerializeToString)
            for name, (fn, req, resp) in methods.items()})

    async def server_live(self, request: Any, context: Any) -> Any:
        return self.m["ServerLiveResponse"](live=True)

    async def server_ready(self, request: Any, context: Any) -> Any:
        return self.m["ServerReadyResponse"](ready=self.service.ready)

    async def model_ready(self, request: Any, context: Any) -> Any:
        model = await self._model(request.name, request.version, context)
        return self.m["ModelReadyResponse"](ready=model.ready and not self.service.draining)

    async def server_metadata(self, request: Any, context: Any) -> Any:
        return self.m["ServerMetadataResponse"](name="fastseq", version=__version__, extensions=["binary_tensor_data"])

    async def model_metadata(self, request: Any, context: Any) -> Any:
        model = await self._model(request.name, request.version, context)
        r = self.m["ModelMetadataResponse"](name=model.name, versions=[model.version], platform="onnxruntime_onnx")
        for into, tensors in ((r.inputs, model.inputs), (r.outputs, model.outputs)):
            for t in tensors.values():
                into.add(name=t.name, datatype=t.datatype, shape=list(t.shape) if t.shape is not None else [-1])
        return r

    async def model_infer(self, request: Any, context: Any) -> Any:
        began = time.perf_counter()
        service = self.service
        model = await self._model(request.model_name, request.model_version, context)
        try:
            stats = service.admit(model)
        except RequestError as e:
            await context.abort(_code(e.status), str(e))
        try:
            decoded = decode(model, request)
            chosen = await service.infer(model, decoded, began)
            r = self.m["ModelInferResponse"](model_name=model.name, model_version=model.version, id=request.id)
            for tensor, array, _ in chosen:
                r.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(array.shape))
                r.raw_output_contents.append(bytes(raw_data(tensor.datatype, array)))
            stats.done(time.perf_counter() - began)
            return r
        except Exception as e:  # noqa: BLE001 - a request's failure is its answer
            error = service.failure(model, e, began, f"gRPC ModelInfer {model.name}")
        finally:
            service.release(stats)
        await context.abort(_code(error.status), str(error))

    async def _model(self, name: str, version: str, context: Any) -> Any:
        try:
            return self.service.model(name, version or None)
        except RequestError as e:
            await context.abort(_code(e.status), str(e))


async def start(service: Service, host: str, port: int) -> tuple[Any, int]:
    """A gRPC server of ``service`` on ``host``:``port`` (0: a free one), started; and its port."""
    import grpc

    # At most max_queue calls at once, as over HTTP: gRPC reads a whole message before the
    # service sees it, so this bounds the memory that requests hold to max_queue messages.
    server = grpc.aio.server(maximum_concurrent_rpcs=service.max_queue,
                             options=[("grpc.max_receive_message_length", service.max_request_bytes),
                                      ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((GrpcService(service).handler(),))
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot listen on {host}:{port} for gRPC")
    await server.start()
    return server, bound
