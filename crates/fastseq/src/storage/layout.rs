//! The layout of a model written with external data, decided here once: which tensors go to
//! the data file, what the data file is called, and where a tensor's `location` may point.
//!
//! Every writer asks [`LAYOUT`]: exports (unless the caller gives onnx.save's
//! `size_threshold`), the session's private copy and the session cache's key, which must lay
//! a model out alike or every cache store would fail its read-back check; so does the loader
//! for locations, and Python (`fastseq._core.LAYOUT`) for ONNX Runtime's optimised models,
//! opset conversion and exports through onnx.save.
use std::path::{Component, Path};

use crate::error::{Error, Result};

/// See the module's notes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Tensors of at least this many bytes go to the data file; smaller ones (shape
    /// constants, scales: what converters and optimisers read) stay in the model. 1024 is
    /// onnx.save's `size_threshold`, so that fastseq's files are laid out as onnx's are.
    pub threshold: usize,
    /// The data file of a model file is its name followed by this: `model.onnx.data`.
    pub data_suffix: &'static str,
}

/// The layout every writer and reader of fastseq uses.
pub const LAYOUT: Layout = Layout { threshold: 1024, data_suffix: ".data" };

impl Layout {
    /// Whether a tensor of `bytes` bytes goes to the data file.
    pub fn goes_to_data_file(&self, bytes: usize) -> bool {
        bytes >= self.threshold
    }

    /// The data file's name for the model file named `model_file` (a name, not a path).
    pub fn data_file(&self, model_file: &str) -> String {
        format!("{model_file}{}", self.data_suffix)
    }

    /// Whether `location` may name a data file: a relative path inside the model's folder
    /// that names something, with no `..`, no root, no drive and no NUL. A loader checks it
    /// before it opens a file or downloads one; links out of the folder are the loader's to
    /// refuse (`external::safe_location`), since only the file system knows them.
    pub fn allows_location(&self, location: &str) -> bool {
        let rel = Path::new(location);
        !(location.is_empty()
            || rel.is_absolute()
            || location.starts_with('/')
            || location.starts_with('\\')
            || location.contains('\0')
            || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
            || !rel.components().any(|c| matches!(c, Component::Normal(_))))
    }

    /// [`Layout::allows_location`] as a load error naming the location.
    pub fn check_location(&self, location: &str) -> Result<()> {
        if self.allows_location(location) {
            return Ok(());
        }
        Err(Error::load(format!(
            "external data location '{location}' is refused: it must be a relative path inside the model's folder"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_stay_inside_the_models_folder() {
        for ok in ["w.bin", "weights/w.bin", "./w.bin", "a/./b", "model.onnx.data"] {
            assert!(LAYOUT.allows_location(ok), "{ok}");
        }
        for bad in ["", ".", "./", "..", "../w", "a/../../w", "/etc/passwd", "\\\\server\\w", "\\w", "a\0b"] {
            assert!(!LAYOUT.allows_location(bad), "{bad:?}");
            assert!(LAYOUT.check_location(bad).unwrap_err().message.contains("is refused"));
        }
    }

    #[test]
    fn the_data_file_follows_the_model_and_large_tensors_go_there() {
        assert_eq!(LAYOUT.data_file("m.onnx"), "m.onnx.data");
        assert!(LAYOUT.goes_to_data_file(1024) && !LAYOUT.goes_to_data_file(1023));
    }
}
