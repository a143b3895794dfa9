//! Decoding and encoding whole models: bytes or files (read into memory fastseq owns) in,
//! bytes or an atomically written file out. Weights (`TensorProto.raw_data`) stay `Bytes`
//! slices of the input buffer, so they are copied once, into the output, and never parsed.
use std::fs::{self, File};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::error::{Error, Result};
use crate::proto::{GraphProto, ModelProto, TensorProto};

/// The highest IR version the vendored schema describes. A newer model may carry fields
/// this schema does not know; prost would drop them silently, so such models are refused.
pub const MAX_IR_VERSION: i64 = 14;

/// What identifies a file's contents without reading them: a rewrite in place changes the
/// size or the times (`ctime` even when `mtime` is put back), a replacement the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Identity {
    pub fn of(meta: &fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }

    /// The identity of the file at `path` now (links followed).
    pub fn at(path: &Path) -> std::io::Result<Identity> {
        fs::metadata(path).map(|m| Identity::of(&m))
    }

    /// As text, to travel with a tensor that still points at its file (see `external`).
    pub fn encode(&self) -> String {
        format!("{}:{}:{}:{}:{}", self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns)
    }

    pub fn decode(text: &str) -> Option<Identity> {
        let mut it = text.split(':');
        let id = Identity {
            dev: it.next()?.parse().ok()?,
            ino: it.next()?.parse().ok()?,
            size: it.next()?.parse().ok()?,
            mtime_ns: it.next()?.parse().ok()?,
            ctime_ns: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(id)
    }
}

/// The error for a source that is not what it was when it was read.
pub fn changed(shown: &dyn std::fmt::Display, when: &str) -> Error {
    Error::load(format!(
        "{shown}: the file changed {when} (rewritten or replaced by another program); \
         load it again once it is written"
    ))
}

/// Reads a whole file into memory that fastseq owns. Sources are read rather than mapped:
/// a mapped file that another program truncates (as `onnx.save` does when it rewrites a
/// model in place) turns the next access into SIGBUS, and a same-size rewrite would change
/// a pipeline's weights under it. Memory the process owns cannot change; the peak RSS is
/// the same as a mapping's (touched file pages count too). Measured in SECURITY.md.
pub fn read_path(path: &Path) -> Result<Bytes> {
    let shown = path.display();
    let meta = fs::metadata(path).map_err(|e| Error::load(format!("{shown}: cannot read: {e}")))?;
    if meta.is_dir() {
        return Err(Error::load(format!("{shown}: is a directory, not an ONNX file")));
    }
    if meta.len() == 0 {
        return Err(Error::load(format!("{shown}: empty file (0 bytes), not an ONNX model")));
    }
    let file = File::open(path).map_err(|e| Error::load(format!("{shown}: cannot open: {e}")))?;
    read_range(&file, &shown, 0, None).map(|(data, _)| data)
}

/// Reads of at least this many bytes get an anonymous mapping of their own (see [`read_range`]).
const OWN_MAPPING_MIN: usize = 1 << 20;

/// Memory read from a file, held by this process alone.
enum Owned {
    Heap(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        match self {
            Owned::Heap(v) => v,
            Owned::Mapped(m) => m,
        }
    }
}

/// Reads `len` bytes at `offset` of `file` (to its end when `len` is None) into memory this
/// process owns, and checks that the file did not change while it was read; returns the
/// bytes and the file's identity. Running out of memory is an error, not an abort.
///
/// Large reads go into an anonymous mapping (memory, not a view of the file: nothing another
/// program does to the file reaches it) rather than the allocator's heap, so that dropping
/// them gives the memory back to the system at once: mimalloc keeps freed blocks for reuse,
/// which would keep a spilled pipeline's sources (see `spill`) counted in its RSS.
pub fn read_range(
    file: &File,
    shown: &dyn std::fmt::Display,
    offset: u64,
    len: Option<u64>,
) -> Result<(Bytes, Identity)> {
    let io = |e: std::io::Error| Error::load(format!("{shown}: cannot read: {e}"));
    let before = Identity::of(&file.metadata().map_err(io)?);
    let len = match len {
        Some(l) => l,
        None => before.size.saturating_sub(offset),
    };
    if offset.checked_add(len).is_none_or(|end| end > before.size) {
        return Err(Error::load(format!(
            "{shown}: {len} bytes at offset {offset} lie past its end ({} bytes)",
            before.size
        )));
    }
    let n = usize::try_from(len).map_err(|_| Error::load(format!("{shown}: {len} bytes do not fit in memory")))?;
    let no_memory = || Error::load(format!("{shown}: cannot allocate {n} bytes to read it (out of memory)"));
    let mut reader = file;
    reader.seek(SeekFrom::Start(offset)).map_err(io)?;
    let owned = if n >= OWN_MAPPING_MIN {
        let mut map = memmap2::MmapMut::map_anon(n).map_err(|_| no_memory())?;
        reader.read_exact(&mut map).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => changed(shown, "while it was read (it got shorter)"),
            _ => io(e),
        })?;
        Owned::Mapped(map.make_read_only().map_err(io)?)
    } else {
        let mut buf = Vec::new();
        buf.try_reserve_exact(n).map_err(|_| no_memory())?;
        // Read into the reserved capacity: no zeroing of memory about to be overwritten.
        reader.take(len).read_to_end(&mut buf).map_err(io)?;
        if buf.len() != n {
            return Err(changed(shown, "while it was read (it got shorter)"));
        }
        Owned::Heap(buf)
    };
    if Identity::of(&file.metadata().map_err(io)?) != before {
        return Err(changed(shown, "while it was read"));
    }
    Ok((Bytes::from_owner(owned), before))
}

/// Decodes one model. `label` names the source in every error message.
pub fn decode(label: &str, data: Bytes) -> Result<ModelProto> {
    if data.is_empty() {
        return Err(Error::load(format!("{label}: empty input (0 bytes), not an ONNX model")));
    }
    let size = data.len();
    let model = ModelProto::decode(data).map_err(|e| {
        Error::load(format!(
            "{label}: not a valid ONNX model ({size} bytes; truncated, corrupt or another file type): {e}"
        ))
    })?;
    check_decoded(label, &model)?;
    check_nodes(&model).map_err(|e| match e {
        Invalid::Node(e) => {
            Error::load(format!("{label}: not a valid ONNX model ({size} bytes; corrupt or another file type): {e}"))
        }
        Invalid::Size(e) => Error::load(format!("{label}: {e}")),
    })?;
    Ok(model)
}

enum Invalid {
    Node(String),
    Size(String),
}

/// A tensor's `raw_data` must be as long as its type and dims need: ONNX Runtime refuses
/// it otherwise, and exported with external data it would no longer load.
fn check_raw_size(t: &TensorProto) -> std::result::Result<(), Invalid> {
    let Some(raw) = &t.raw_data else { return Ok(()) };
    let need = crate::external::expected_bytes(t).map_err(|e| Invalid::Size(format!("tensor '{}': {e}", t.name())))?;
    match need {
        Some(need) if need != raw.len() as u64 => Err(Invalid::Size(format!(
            "tensor '{}' ({} {:?}) holds {} bytes of raw_data but its type and dims need {need}",
            t.name(),
            crate::compose::elem_type_name(t.data_type.unwrap_or(0)),
            t.dims,
            raw.len()
        ))),
        _ => Ok(()),
    }
}

/// Nodes are kept as bytes (see [`crate::node`]), so what prost would have checked in them
/// (UTF-8 strings, well-formed attributes, subgraphs at any depth) is checked here, with the
/// sizes of the tensors in graphs and attributes.
fn check_nodes(model: &ModelProto) -> std::result::Result<(), Invalid> {
    fn graph(g: &GraphProto, depth: usize) -> std::result::Result<(), Invalid> {
        if depth > crate::node::MAX_NESTING {
            return Err(Invalid::Node(format!("subgraphs nested more than {} deep", crate::node::MAX_NESTING)));
        }
        g.initializer.iter().try_for_each(check_raw_size)?;
        for s in &g.sparse_initializer {
            s.values.iter().chain(s.indices.iter()).try_for_each(check_raw_size)?;
        }
        for (k, raw) in g.node.iter().enumerate() {
            let decoded =
                crate::node::check(raw).map_err(|e| Invalid::Node(format!("node {k} of graph '{}': {e}", g.name())))?;
            if let Some(n) = decoded {
                attributes(&n)?;
                crate::node::subgraphs(&n).try_for_each(|sub| graph(sub, depth + 1))?;
            }
        }
        Ok(())
    }
    fn attributes(n: &crate::proto::NodeProto) -> std::result::Result<(), Invalid> {
        n.attribute.iter().flat_map(|a| a.t.iter().chain(a.tensors.iter())).try_for_each(check_raw_size)
    }
    fn nodes(ns: &[crate::proto::NodeProto], depth: usize) -> std::result::Result<(), Invalid> {
        ns.iter().try_for_each(attributes)?;
        ns.iter().flat_map(crate::node::subgraphs).try_for_each(|sub| graph(sub, depth + 1))
    }
    model.graph.iter().try_for_each(|g| graph(g, 0))?;
    for t in &model.training_info {
        t.initialization.iter().chain(t.algorithm.iter()).try_for_each(|g| graph(g, 0))?;
    }
    model.functions.iter().try_for_each(|f| nodes(&f.node, 0))
}

fn check_decoded(label: &str, model: &ModelProto) -> Result<()> {
    let ir = model.ir_version.unwrap_or(0);
    if model.graph.is_none() || ir <= 0 {
        return Err(Error::load(format!(
            "{label}: not an ONNX model (no graph or no IR version; is it a tensor or another protobuf?)"
        )));
    }
    if ir > MAX_IR_VERSION {
        return Err(Error::load(format!(
            "{label}: IR version {ir} is newer than this fastseq understands (up to {MAX_IR_VERSION}); \
             fields it does not know would be lost, so it is refused. Upgrade fastseq."
        )));
    }
    Ok(())
}

/// C++ protobuf (onnx, ONNX Runtime) cannot parse a message of 2 GiB or more; a margin
/// leaves room for what a reader adds.
pub const PROTOBUF_LIMIT: u64 = (2u64 << 30) - (16 << 20);

/// What [`save`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub model_bytes: u64,
    pub data_bytes: u64,
    pub data_file: Option<String>,
}

/// Writes `model` to `path` atomically. `external`: Some(true) puts tensors of at least
/// `threshold` bytes in a data file beside it, Some(false) keeps them inline, None decides
/// by size (external at the protobuf limit). `linked` models (external data left pointing
/// at the sources) always take the external path, which links those files.
pub fn save(model: &ModelProto, path: &Path, external: Option<bool>, linked: bool, threshold: usize) -> Result<Saved> {
    // Named here: the writers' first file is a temporary one, whose name would mislead.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
        return Err(Error::export(format!(
            "cannot write {}: the folder {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    let size = model.encoded_len() as u64;
    if linked || external.unwrap_or(size >= PROTOBUF_LIMIT) {
        let (model_bytes, data_bytes, name) = crate::external::write_with_external(model, path, threshold)?;
        return Ok(Saved { model_bytes, data_bytes, data_file: Some(name) });
    }
    if size >= PROTOBUF_LIMIT {
        return Err(Error::export(format!(
            "{}: the model is {size} bytes, over the 2 GB protobuf limit: it needs external data",
            path.display()
        )));
    }
    let model_bytes = write_atomic(model, path)?;
    // Data files of earlier external-data exports to this path are no longer referenced.
    crate::external::remove_orphans(path);
    Ok(Saved { model_bytes, data_bytes: 0, data_file: None })
}

/// Encodes into a caller-provided buffer of exactly `model.encoded_len()` bytes.
pub fn encode_into(model: &ModelProto, mut buf: &mut [u8]) -> Result<()> {
    model.encode(&mut buf).map_err(|e| Error::export(format!("cannot encode the merged model: {e}")))
}

/// Writes `model` to `path` atomically: a temporary file in the same folder, synced, then
/// renamed over the target. On any failure the temporary file is removed and an existing
/// file at `path` is left as it was. Returns the number of bytes written.
pub fn write_atomic(model: &ModelProto, path: &Path) -> Result<u64> {
    write_atomic_with(model, path, true)
}

/// [`write_atomic`]; `durable: false` skips the sync, for files that only this process
/// reads and that need not outlive a crash (a session's private copy).
pub fn write_atomic_with(model: &ModelProto, path: &Path, durable: bool) -> Result<u64> {
    remove_stale_temps(path);
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<u64> {
        let file = File::create(&tmp)?;
        let mut out = BufWriter::with_capacity(256 << 10, file);
        let written = write_streaming(model, &mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        Ok(written)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::export(format!("cannot write {}: {e}", path.display()))
    })
}

/// Temporary files that an export killed before it could clean up (its process is gone)
/// are removed by the next export to the same path.
fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        // `.{file}.{pid}.{nanos}.tmp`, where {file} is the model's name or that of a file
        // beside it (`{name}.{token}.data`): the pid is read from the end.
        let Some(rest) = file.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".tmp")) else { continue };
        let Some((head, nanos)) = rest.rsplit_once('.') else { continue };
        let pid_text = head.rsplit('.').next().unwrap_or("");
        let (Ok(pid), Ok(_)) = (pid_text.parse::<u32>(), nanos.parse::<u128>()) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() && Path::new("/proc/self").exists()
        {
            let _ = fs::remove_file(e.path());
        }
    }
}

pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = format!(".{name}.{}.{}.tmp", std::process::id(), nanos());
    path.with_file_name(unique)
}

pub(crate) fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Streams the protobuf encoding of `model` into `out`, byte-identical in content to
/// `encode_to_vec` up to field order (the graph and the initializers' `raw_data` go last,
/// which every protobuf parser accepts). Only one tensor's header is buffered at a time;
/// weights go straight from their source buffer to the writer.
pub fn write_streaming(model: &ModelProto, out: &mut impl Write) -> std::io::Result<u64> {
    let header = clone_without_graph(model).encode_to_vec();
    out.write_all(&header)?;
    let Some(graph) = model.graph.as_ref() else { return Ok(header.len() as u64) };

    // The graph's own small fields; its nodes and initializers are written one by one.
    let mut rest = Vec::with_capacity(1 << 12);
    encode_graph_fields(graph, &mut rest);
    let nodes_len: usize = graph.node.iter().map(|n| field_len(1, n.len())).sum();
    // A tensor streamed with its raw_data last has the same fields, so the same length.
    let init_len: usize = graph.initializer.iter().map(|t| field_len(5, t.encoded_len())).sum();
    let graph_len = nodes_len + rest.len() + init_len;
    let mut key = Vec::with_capacity(16);
    encode_key(7, WireType::LengthDelimited, &mut key);
    encode_varint(graph_len as u64, &mut key);
    out.write_all(&key)?;
    // Nodes are kept as bytes: each is copied as it is, behind its key and length.
    for node in &graph.node {
        key.clear();
        encode_key(1, WireType::LengthDelimited, &mut key);
        encode_varint(node.len() as u64, &mut key);
        out.write_all(&key)?;
        out.write_all(node)?;
    }
    out.write_all(&rest)?;
    // The initializers are counted as they are written, not in graph_len's share.
    let mut written = (header.len() + field_len(7, graph_len) - init_len) as u64;
    for tensor in &graph.initializer {
        written += write_tensor(5, tensor, out)?;
    }
    Ok(written)
}

/// The model's own fields (not the graph): small next to the graph, cloned to encode them.
fn clone_without_graph(m: &ModelProto) -> ModelProto {
    ModelProto {
        ir_version: m.ir_version,
        opset_import: m.opset_import.clone(),
        producer_name: m.producer_name.clone(),
        producer_version: m.producer_version.clone(),
        domain: m.domain.clone(),
        model_version: m.model_version,
        doc_string: m.doc_string.clone(),
        graph: None,
        metadata_props: m.metadata_props.clone(),
        training_info: m.training_info.clone(),
        functions: m.functions.clone(),
        configuration: m.configuration.clone(),
    }
}

/// Every field of `g` but its nodes and initializers, as prost would encode them.
fn encode_graph_fields(g: &GraphProto, buf: &mut Vec<u8>) {
    use prost::encoding::{message, string};
    if let Some(name) = &g.name {
        string::encode(2, name, buf);
    }
    if let Some(doc) = &g.doc_string {
        string::encode(10, doc, buf);
    }
    message::encode_repeated(11, &g.input, buf);
    message::encode_repeated(12, &g.output, buf);
    message::encode_repeated(13, &g.value_info, buf);
    message::encode_repeated(14, &g.quantization_annotation, buf);
    message::encode_repeated(15, &g.sparse_initializer, buf);
    message::encode_repeated(16, &g.metadata_props, buf);
}

fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn write_tensor(tag: u32, t: &TensorProto, out: &mut impl Write) -> std::io::Result<u64> {
    let mut rest = t.clone();
    let raw = rest.raw_data.take();
    let body_len = rest.encoded_len() + raw.as_ref().map_or(0, |r| field_len(9, r.len()));
    let mut buf = Vec::with_capacity(32 + rest.encoded_len());
    encode_key(tag, WireType::LengthDelimited, &mut buf);
    encode_varint(body_len as u64, &mut buf);
    rest.encode(&mut buf).expect("Vec grows");
    if let Some(raw) = &raw {
        encode_key(9, WireType::LengthDelimited, &mut buf);
        encode_varint(raw.len() as u64, &mut buf);
    }
    out.write_all(&buf)?;
    let mut n = buf.len() as u64;
    if let Some(raw) = raw {
        out.write_all(&raw)?;
        n += raw.len() as u64;
    }
    Ok(n)
}

/// A short description of a model, for `fastseq inspect` and `repr`.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub ir_version: i64,
    pub producer: String,
    pub opsets: Vec<(String, i64)>,
    pub inputs: Vec<(String, String, Vec<String>)>,
    pub outputs: Vec<(String, String, Vec<String>)>,
    pub nodes: usize,
    pub initializers: usize,
    pub weight_bytes: u64,
    pub functions: usize,
    pub encoded_len: u64,
}

fn io_info(vi: &crate::proto::ValueInfoProto) -> (String, String, Vec<String>) {
    use crate::proto::tensor_shape_proto::dimension::Value as Dim;
    use crate::proto::type_proto::Value;
    let name = vi.name.clone().unwrap_or_default();
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(t)) => {
            let dims = t
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(Dim::DimValue(v)) => v.to_string(),
                            Some(Dim::DimParam(p)) => p.clone(),
                            None => "?".into(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            (name, crate::compose::elem_type_name(t.elem_type.unwrap_or(0)), dims)
        }
        Some(_) => (name, "non-tensor".into(), Vec::new()),
        None => (name, "?".into(), Vec::new()),
    }
}

pub fn summary(model: &ModelProto) -> Summary {
    fn count(g: &GraphProto, s: &mut Summary) {
        s.nodes += g.node.len();
        for t in &g.initializer {
            s.initializers += 1;
            s.weight_bytes += t.raw_data.as_ref().map_or(0, |r| r.len() as u64);
            s.weight_bytes += t
                .external_data
                .iter()
                .find(|e| e.key.as_deref() == Some("length"))
                .and_then(|e| e.value.as_deref()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        for raw in g.node.iter().filter(|raw| crate::node::has_tensors_or_graphs(raw)) {
            let Ok(n) = crate::node::decode(raw) else { continue };
            for a in &n.attribute {
                a.g.iter().chain(a.graphs.iter()).for_each(|sub| count(sub, s));
                s.weight_bytes += a.t.as_ref().and_then(|t| t.raw_data.as_ref()).map_or(0, |r| r.len() as u64);
            }
        }
    }
    let mut s = Summary {
        ir_version: model.ir_version.unwrap_or(0),
        producer: format!("{} {}", model.producer_name(), model.producer_version()).trim().to_string(),
        opsets: model
            .opset_import
            .iter()
            .map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(0)))
            .collect(),
        functions: model.functions.len(),
        encoded_len: model.encoded_len() as u64,
        ..Default::default()
    };
    if let Some(g) = &model.graph {
        s.inputs = g.input.iter().map(io_info).collect();
        s.outputs = g.output.iter().map(io_info).collect();
        count(g, &mut s);
    }
    s
}

/// A copy of `model` whose main-graph initializers of at least `threshold` bytes have no
/// data: what a tool that only reads the structure (the opset converter) needs.
pub fn strip_weights(model: &ModelProto, threshold: usize) -> ModelProto {
    let mut m = model.clone();
    if let Some(g) = m.graph.as_mut() {
        for t in &mut g.initializer {
            if t.raw_data.as_ref().is_some_and(|r| r.len() >= threshold) {
                t.raw_data = None;
            }
        }
    }
    m
}

/// Puts back the weights that [`strip_weights`] took out, by initializer name, from
/// `original` (slices of the same buffers: nothing is copied).
pub fn restore_weights(mut stripped: ModelProto, original: &ModelProto, label: &str) -> Result<ModelProto> {
    let Some(src) = original.graph.as_ref() else { return Ok(stripped) };
    let weights: std::collections::HashMap<&str, &Bytes> =
        src.initializer.iter().filter_map(|t| Some((t.name.as_deref()?, t.raw_data.as_ref()?))).collect();
    if let Some(g) = stripped.graph.as_mut() {
        for t in &mut g.initializer {
            if t.raw_data.is_none() && t.float_data.is_empty() && t.int32_data.is_empty() && t.int64_data.is_empty() {
                match weights.get(t.name()) {
                    Some(raw) => t.raw_data = Some((*raw).clone()),
                    None if t.dims.contains(&0) => {}
                    None => {
                        return Err(Error::load(format!(
                            "{label}: after conversion, initializer '{}' has no weights to restore",
                            t.name()
                        )))
                    }
                }
            }
        }
    }
    Ok(stripped)
}
