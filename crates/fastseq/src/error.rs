//! One error type for the core. Each kind maps to a Python exception class in `lib.rs`.
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The bytes or the file are not a usable ONNX model.
    Load,
    /// The models cannot be joined as asked (io_maps, types, shapes).
    Composition,
    /// Opset imports of one domain differ between models.
    Opset,
    /// Writing the result failed.
    Export,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn load(message: impl Into<String>) -> Self {
        Error { kind: Kind::Load, message: message.into() }
    }
    pub fn composition(message: impl Into<String>) -> Self {
        Error { kind: Kind::Composition, message: message.into() }
    }
    pub fn opset(message: impl Into<String>) -> Self {
        Error { kind: Kind::Opset, message: message.into() }
    }
    pub fn export(message: impl Into<String>) -> Self {
        Error { kind: Kind::Export, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
