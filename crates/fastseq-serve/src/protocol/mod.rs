//! (stubs until the protocol branch lands: the lead's transport compiles against these)
use bytes::Bytes;

use crate::error::RequestError;
use crate::metrics::Statistics;
use crate::tensor::{InferRequest, ModelSpec, Tensor};

pub struct Encoded {
    pub parts: Vec<Bytes>,
    pub header_length: Option<usize>,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }
}

pub fn decode_http(_model: &ModelSpec, _body: &Bytes, _header_length: Option<usize>) -> Result<InferRequest, RequestError> {
    unimplemented!()
}
pub fn encode_http(_model: &ModelSpec, _id: Option<&str>, _asked: &[(usize, bool)], _outputs: &[Tensor]) -> Result<Encoded, RequestError> {
    unimplemented!()
}
pub fn error_json(_message: &str) -> Bytes {
    unimplemented!()
}
pub fn server_metadata(_version: &str) -> Bytes {
    unimplemented!()
}
pub fn model_metadata(_model: &ModelSpec) -> Bytes {
    unimplemented!()
}
pub fn model_config(_model: &ModelSpec) -> Bytes {
    unimplemented!()
}
pub fn model_statistics(_stats: &[Statistics]) -> Bytes {
    unimplemented!()
}
