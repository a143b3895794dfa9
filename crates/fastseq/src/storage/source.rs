//! Loading sources into models: bytes, files (external data resolved beside them) or models
//! already held. A Rust caller loads a model with external data through [`load`] the same way
//! the Python bindings do; they only turn Python objects into [`Source`]s.
use std::path::{Path, PathBuf};

use bytes::Bytes;
use rayon::prelude::*;

use crate::codec::model;
use crate::codec::proto::ModelProto;
use crate::error::{Error, Result};
use crate::storage::external::{self, Mode};
use crate::storage::ranges::{self, RANGE_MIN};
use crate::storage::read::{changed, read_model_file, read_path, Identity};

/// A model source.
#[derive(Debug, Clone)]
pub enum Source {
    /// A serialized model (its weights inline: there is no folder to find data files in).
    Bytes(Bytes),
    /// A model file, and the folder its external data may resolve into (default: the
    /// file's own folder; a Hub cache's repo folder, whose files are links into blobs/).
    Path(PathBuf, Option<PathBuf>),
    /// A model already decoded.
    Model(Box<ModelProto>),
}

impl Source {
    /// The model file at `path`, its external data inside its own folder.
    pub fn path(path: impl Into<PathBuf>) -> Source {
        Source::Path(path.into(), None)
    }

    /// The model file at `path`, its external data anywhere inside `root` (a folder above
    /// it: a Hub cache's repo folder, whose files are links into blobs/).
    pub fn path_in(path: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Source {
        Source::Path(path.into(), Some(root.into()))
    }

    /// A serialized model, its weights inline.
    pub fn bytes(data: impl Into<Bytes>) -> Source {
        Source::Bytes(data.into())
    }

    /// The name errors use for this source when the caller gives none.
    pub fn default_label(&self) -> String {
        match self {
            Source::Path(p, _) => p.display().to_string(),
            Source::Bytes(_) | Source::Model(_) => "model".to_string(),
        }
    }
}

/// Decodes one source. A file is read into memory the core owns, but for its large inline
/// weights, which stay in it as ranges unless `mode` is [`Mode::InPlace`]; its external data
/// is resolved as `mode` says. `label` names the source in every error.
pub fn load(label: &str, src: Source, mode: Mode) -> Result<ModelProto> {
    match src {
        Source::Model(m) => Ok(*m),
        Source::Bytes(b) => {
            let mut m = model::decode(label, b)?;
            if external::has_external(&mut m) {
                return Err(Error::load(format!(
                    "{label}: the model keeps its weights in external data files; pass it as a path \
                     so that they can be found beside it"
                )));
            }
            Ok(m)
        }
        Source::Path(p, root) => {
            let before = Identity::at(&p).ok();
            // Large inline weights stay in the file unless every byte is to be read.
            let (data, left, identity) = match mode {
                Mode::InPlace => (read_path(&p)?, Vec::new(), None),
                _ => read_model_file(&p, RANGE_MIN).map(|(d, l, i)| (d, l, Some(i)))?,
            };
            // The weights left in the file have no data until they are attached below.
            let mut m = match left.is_empty() {
                true => model::decode(label, data)?,
                false => model::decode_without_weights(label, data)?,
            };
            let base = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            external::resolve(&mut m, base, root.as_deref().unwrap_or(base), label, mode)?;
            // A model replaced while its data files were read (an export to the same path)
            // may have been paired with the new model's data: refused, never mixed.
            if Identity::at(&p).ok() != before {
                return Err(changed(&label, "while its external data was read"));
            }
            if let (false, Some(identity)) = (left.is_empty(), identity) {
                let real =
                    p.canonicalize().map_err(|e| Error::load(format!("{label}: cannot resolve its path: {e}")))?;
                ranges::attach(&mut m, &real, &identity, &left, label)?;
                model::check_weights_present(label, &m)?;
            }
            Ok(m)
        }
    }
}

/// Loads every source side by side; `labels[i]` names `sources[i]`.
pub fn load_all(sources: Vec<Source>, labels: &[String], mode: Mode) -> Result<Vec<ModelProto>> {
    if sources.len() != labels.len() {
        return Err(Error::load(format!(
            "{} sources but {} labels: one label per source",
            sources.len(),
            labels.len()
        )));
    }
    crate::pool::install(|| sources.into_par_iter().zip(labels.par_iter()).map(|(s, l)| load(l, s, mode)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{tensor_proto::DataLocation, GraphProto, StringStringEntryProto, TensorProto};

    fn with_external(location: &str, length: usize) -> ModelProto {
        let entry =
            |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v), ..Default::default() };
        ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                name: Some("g".into()),
                initializer: vec![TensorProto {
                    name: Some("w".into()),
                    dims: vec![(length / 4) as i64],
                    data_type: Some(1),
                    data_location: Some(DataLocation::External as i32),
                    external_data: vec![
                        entry("location", location.into()),
                        entry("offset", "0".into()),
                        entry("length", length.to_string()),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_rust_caller_loads_a_model_with_external_data() {
        use prost::Message;
        let dir = tempfile::tempdir().unwrap();
        let weights: Vec<u8> = (0..64u8).collect();
        std::fs::write(dir.path().join("w.bin"), &weights).unwrap();
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, with_external("w.bin", 64).encode_to_vec()).unwrap();
        let m = load("m.onnx", Source::Path(path.clone(), None), Mode::InPlace).unwrap();
        let t = &m.graph.unwrap().initializer[0];
        assert_eq!(t.raw_data.as_deref(), Some(&weights[..]));
        // As bytes, the data files cannot be found: a load error naming the source.
        let bytes = Bytes::from(std::fs::read(&path).unwrap());
        let err = load("m.onnx", Source::Bytes(bytes), Mode::InPlace).unwrap_err();
        assert!(err.message.starts_with("m.onnx: the model keeps its weights in external data"), "{}", err.message);
        // A location escaping the folder is refused.
        std::fs::write(&path, with_external("../w.bin", 64).encode_to_vec()).unwrap();
        assert_eq!(load("m", Source::Path(path, None), Mode::InPlace).unwrap_err().kind, crate::Kind::Load);
    }
}
