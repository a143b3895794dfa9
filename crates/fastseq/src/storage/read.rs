//! Reading files into memory fastseq owns, and the identity of a file's contents (what
//! tells a file that was rewritten or replaced since it was read).
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use bytes::Bytes;

use crate::error::{Error, Result};

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

/// What a file named by input is when it is not a regular file (a FIFO, a device, a socket,
/// a directory): the error [`open_input`] refuses it with.
#[derive(Debug)]
pub struct NotRegular(pub &'static str);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "is {}, not a regular file", self.0)
    }
}

impl std::error::Error for NotRegular {}

impl NotRegular {
    fn check(meta: &fs::Metadata) -> std::io::Result<()> {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        let kind = match () {
            () if t.is_file() => return Ok(()),
            () if t.is_dir() => "a directory",
            () if t.is_fifo() => "a FIFO (named pipe)",
            () if t.is_char_device() => "a character device",
            () if t.is_block_device() => "a block device",
            () if t.is_socket() => "a socket",
            () => "something other than a file",
        };
        Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, NotRegular(kind)))
    }

    /// The refusal inside `e`, if `e` is one.
    pub fn of(e: &std::io::Error) -> Option<&NotRegular> {
        e.get_ref().and_then(|inner| inner.downcast_ref::<NotRegular>())
    }
}

/// Opens a file named by input (a model, an external data file, a source's weights, a
/// pipeline file, a cached download) for reading: the one way fastseq opens them, the
/// Python side too (`_core.open_input`). What is not a regular file is refused without
/// blocking: a FIFO's plain `open` waits for a writer for ever, a device (`/dev/zero`) reads
/// without end. `stat` first, for the error to say what the file is (a socket cannot be
/// opened at all), then `open` with `O_NONBLOCK` and `fstat` of what was opened, for a file
/// swapped for a FIFO between the two. `O_NONBLOCK` changes nothing for a regular file.
pub fn open_input(path: &Path) -> std::io::Result<(File, fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    NotRegular::check(&fs::metadata(path)?)?;
    let file = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    NotRegular::check(&meta)?;
    Ok((file, meta))
}

/// [`open_input`], its errors a `LoadError` naming the file as `shown`.
pub fn open_regular(path: &Path, shown: &dyn std::fmt::Display) -> Result<(File, fs::Metadata)> {
    open_input(path).map_err(|e| match NotRegular::of(&e) {
        Some(refused) => Error::load(format!("{shown}: {refused}")),
        None => Error::load(format!("{shown}: cannot open: {e}")),
    })
}

/// Reads a whole file into memory that fastseq owns. Sources are read rather than mapped:
/// a mapped file that another program truncates (as `onnx.save` does when it rewrites a
/// model in place) turns the next access into SIGBUS, and a same-size rewrite would change
/// a pipeline's weights under it. Memory the process owns cannot change; the peak RSS is
/// the same as a mapping's (touched file pages count too). Measured in docs/security.md.
pub fn read_path(path: &Path) -> Result<Bytes> {
    let shown = path.display();
    let (file, meta) = open_regular(path, &shown)?;
    if meta.len() == 0 {
        return Err(Error::load(format!("{shown}: empty file (0 bytes), not an ONNX model")));
    }
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

/// A main-graph initializer whose `raw_data` [`read_model_file`] left in the file: the
/// `initializer`-th one, its `len` bytes at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftInFile {
    pub initializer: usize,
    pub offset: u64,
    pub len: u64,
}

/// Reads the model file at `path` into memory fastseq owns, but for the `raw_data` of
/// main-graph initializers of at least `min` bytes: those stay in the file (see
/// [`crate::codec::range`]), and the lengths around them are adjusted so that the bytes
/// read decode as the model without them. Returns the bytes, what was left in the file and
/// the file's identity, which must be the same before and after (the weights are copied from
/// the file later, checked against it). A file laid out otherwise than this walk expects (a
/// second graph field, groups, lengths past their message) is read whole, for decoding to
/// judge.
pub fn read_model_file(path: &Path, min: u64) -> Result<(Bytes, Vec<LeftInFile>, Identity)> {
    let shown = path.display();
    let (file, meta) = open_regular(path, &shown)?;
    if meta.len() == 0 {
        return Err(Error::load(format!("{shown}: empty file (0 bytes), not an ONNX model")));
    }
    let io = |e: std::io::Error| Error::load(format!("{shown}: cannot read: {e}"));
    let before = Identity::of(&file.metadata().map_err(io)?);
    let mut walk = Walk { reader: std::io::BufReader::with_capacity(256 << 10, &file), pos: 0, min, left: Vec::new() };
    let mut out = Vec::new();
    match walk.model(before.size, &mut out) {
        Ok(()) => {
            if Identity::of(&file.metadata().map_err(io)?) != before {
                return Err(changed(&shown, "while it was read"));
            }
            Ok((Bytes::from(out), walk.left, before))
        }
        Err(Stop::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof && walk.pos < before.size => {
            Err(changed(&shown, "while it was read (it got shorter)"))
        }
        Err(Stop::Io(e)) => Err(io(e)),
        Err(Stop::Unexpected) => {
            let (data, identity) = read_range(&file, &shown, 0, None)?;
            if identity != before {
                return Err(changed(&shown, "while it was read"));
            }
            Ok((data, Vec::new(), identity))
        }
    }
}

/// Why [`Walk`] stopped early.
enum Stop {
    Io(std::io::Error),
    /// Not the layout the walk follows (or not a model): read the file whole instead.
    Unexpected,
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Stop {
        Stop::Io(e)
    }
}

/// A walk over a model file's protobuf fields, copying them to `out` but for large
/// initializer `raw_data`, which is skipped (and recorded in `left`).
struct Walk<'f> {
    reader: std::io::BufReader<&'f File>,
    pos: u64,
    min: u64,
    left: Vec<LeftInFile>,
}

const GRAPH: u64 = 7; // ModelProto.graph
const INITIALIZER: u64 = 5; // GraphProto.initializer
const RAW_DATA: u64 = 9; // TensorProto.raw_data
const LEN: u64 = 2; // the length-delimited wire type
/// Bytes kept for a length written after its content: a varint of up to 2^35 - 1.
const LENGTH_ROOM: usize = 5;

impl Walk<'_> {
    fn byte(&mut self) -> std::result::Result<u8, Stop> {
        use std::io::BufRead;
        let b = match self.reader.buffer().first() {
            Some(&b) => {
                self.reader.consume(1);
                b
            }
            None => {
                let mut b = [0u8];
                self.reader.read_exact(&mut b)?;
                b[0]
            }
        };
        self.pos += 1;
        Ok(b)
    }

    /// A varint that must end before `end`.
    fn varint(&mut self, end: u64) -> std::result::Result<u64, Stop> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            if self.pos >= end {
                return Err(Stop::Unexpected);
            }
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Stop::Unexpected)
    }

    /// A length that must fit before `end`.
    fn len(&mut self, end: u64) -> std::result::Result<u64, Stop> {
        let n = self.varint(end)?;
        if n > end - self.pos {
            return Err(Stop::Unexpected);
        }
        Ok(n)
    }

    fn copy(&mut self, n: u64, out: &mut Vec<u8>) -> std::result::Result<(), Stop> {
        let n = usize::try_from(n).map_err(|_| Stop::Unexpected)?;
        out.try_reserve(n).map_err(|_| Stop::Unexpected)?;
        let start = out.len();
        out.resize(start + n, 0);
        self.reader.read_exact(&mut out[start..])?;
        self.pos += n as u64;
        Ok(())
    }

    /// Copies one field whose key was just read.
    fn field(&mut self, key: u64, end: u64, out: &mut Vec<u8>) -> std::result::Result<(), Stop> {
        prost::encoding::encode_varint(key, out);
        match key & 7 {
            0 => {
                let v = self.varint(end)?;
                prost::encoding::encode_varint(v, out);
                Ok(())
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if end - self.pos < n {
                    return Err(Stop::Unexpected);
                }
                self.copy(n, out)
            }
            LEN => {
                let n = self.len(end)?;
                prost::encoding::encode_varint(n, out);
                self.copy(n, out)
            }
            _ => Err(Stop::Unexpected), // groups (deprecated) and invalid wire types
        }
    }

    /// Starts a length-delimited field whose length is not known yet: its key, then room
    /// for the length, which [`Walk::close`] fills in.
    fn open(key: u64, out: &mut Vec<u8>) -> usize {
        prost::encoding::encode_varint(key, out);
        out.extend_from_slice(&[0; LENGTH_ROOM]);
        out.len()
    }

    /// Writes the length of the field [`Walk::open`] started at `start`, as a varint padded
    /// to its room (a longer encoding than needed, which decoders accept): the content
    /// written after it need not move.
    fn close(start: usize, out: &mut [u8]) -> std::result::Result<(), Stop> {
        let mut n = (out.len() - start) as u64;
        if n >> (7 * LENGTH_ROOM) != 0 {
            return Err(Stop::Unexpected);
        }
        for (i, b) in out[start - LENGTH_ROOM..start].iter_mut().enumerate() {
            *b = (n & 0x7f) as u8 | if i + 1 < LENGTH_ROOM { 0x80 } else { 0 };
            n >>= 7;
        }
        Ok(())
    }

    fn model(&mut self, end: u64, out: &mut Vec<u8>) -> std::result::Result<(), Stop> {
        let mut graphs = 0;
        while self.pos < end {
            let key = self.varint(end)?;
            if key >> 3 == GRAPH && key & 7 == LEN {
                // A second graph field would be merged into the first by a decoder: the
                // initializer indices recorded here would not survive that.
                graphs += 1;
                if graphs > 1 {
                    return Err(Stop::Unexpected);
                }
                let n = self.len(end)?;
                out.try_reserve(n as usize).map_err(|_| Stop::Unexpected)?;
                let start = Self::open(key, out);
                self.graph(self.pos + n, out)?;
                Self::close(start, out)?;
            } else {
                self.field(key, end, out)?;
            }
        }
        Ok(())
    }

    fn graph(&mut self, end: u64, out: &mut Vec<u8>) -> std::result::Result<(), Stop> {
        let mut initializer = 0;
        while self.pos < end {
            let key = self.varint(end)?;
            if key >> 3 == INITIALIZER && key & 7 == LEN {
                let n = self.len(end)?;
                let start = Self::open(key, out);
                self.tensor(self.pos + n, initializer, out)?;
                Self::close(start, out)?;
                initializer += 1;
            } else {
                self.field(key, end, out)?;
            }
        }
        if self.pos != end {
            return Err(Stop::Unexpected);
        }
        Ok(())
    }

    fn tensor(&mut self, end: u64, initializer: usize, out: &mut Vec<u8>) -> std::result::Result<(), Stop> {
        let mut raw_fields = 0;
        while self.pos < end {
            let key = self.varint(end)?;
            if key >> 3 == RAW_DATA && key & 7 == LEN {
                // A repeated raw_data field: the last one wins when decoded; not followed.
                raw_fields += 1;
                if raw_fields > 1 {
                    return Err(Stop::Unexpected);
                }
                let n = self.len(end)?;
                if n >= self.min {
                    self.left.push(LeftInFile { initializer, offset: self.pos, len: n });
                    self.reader.seek_relative(n as i64)?;
                    self.pos += n;
                    continue;
                }
                prost::encoding::encode_varint(key, out);
                prost::encoding::encode_varint(n, out);
                self.copy(n, out)?;
            } else {
                self.field(key, end, out)?;
            }
        }
        if self.pos != end {
            return Err(Stop::Unexpected);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_as_text() {
        let id = Identity { dev: 1, ino: 2, size: 3, mtime_ns: -4, ctime_ns: 5_000_000_000_123 };
        assert_eq!(Identity::decode(&id.encode()), Some(id));
        assert_eq!(Identity::decode("1:2:3"), None);
        assert_eq!(Identity::decode("1:2:3:4:5:6"), None);
    }

    #[test]
    fn what_is_not_a_regular_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for (path, kind) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
            (sock.as_path(), "a socket"),
        ] {
            let err = open_regular(path, &path.display()).unwrap_err();
            assert!(err.message.contains(kind) && err.message.contains("not a regular file"), "{}", err.message);
            assert!(read_path(path).is_err() && read_model_file(path, 1).is_err());
        }
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        assert!(open_regular(&dir.path().join("f"), &"f").is_ok());
    }

    fn model_with(weights: &[usize]) -> crate::codec::proto::ModelProto {
        use crate::codec::proto::{GraphProto, ModelProto, TensorProto};
        let init = weights
            .iter()
            .enumerate()
            .map(|(k, &n)| TensorProto {
                name: Some(format!("w{k}")),
                data_type: Some(2),
                dims: vec![n as i64],
                raw_data: Some(Bytes::from((0..n).map(|i| (i * 7 + k) as u8).collect::<Vec<_>>())),
                ..Default::default()
            })
            .collect();
        let node = crate::codec::proto::NodeProto { op_type: Some("Identity".into()), ..Default::default() };
        ModelProto {
            ir_version: Some(8),
            producer_name: Some("test".into()),
            graph: Some(GraphProto {
                name: Some("g".into()),
                node: vec![Bytes::from(prost::Message::encode_to_vec(&node))],
                initializer: init,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn large_weights_are_left_in_the_file_and_the_rest_decodes() {
        use prost::Message;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("m.onnx");
        let model = model_with(&[100, 200_000, 10, 70_000]);
        let bytes = model.encode_to_vec();
        fs::write(&path, &bytes).unwrap();
        let (data, left, identity) = read_model_file(&path, 65_536).unwrap();
        assert_eq!(identity.size, bytes.len() as u64);
        assert_eq!(left.iter().map(|l| (l.initializer, l.len)).collect::<Vec<_>>(), [(1, 200_000), (3, 70_000)]);
        assert!(data.len() < 1000, "only the small part was read: {} bytes", data.len());
        for l in &left {
            let want = model.graph.as_ref().unwrap().initializer[l.initializer].raw_data.as_ref().unwrap();
            assert_eq!(&bytes[l.offset as usize..(l.offset + l.len) as usize], &want[..]);
        }
        let mut back = crate::codec::proto::ModelProto::decode(data).unwrap();
        let g = back.graph.as_mut().unwrap();
        assert_eq!(g.initializer[0].raw_data, model.graph.as_ref().unwrap().initializer[0].raw_data);
        assert!(g.initializer[1].raw_data.is_none() && g.initializer[3].raw_data.is_none());
        for l in &left {
            g.initializer[l.initializer].raw_data =
                Some(Bytes::copy_from_slice(&bytes[l.offset as usize..(l.offset + l.len) as usize]));
        }
        assert_eq!(back.encode_to_vec(), bytes, "the same model once the weights are put back");
    }

    #[test]
    fn files_the_walk_does_not_follow_are_read_whole() {
        use prost::Message;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("m.onnx");
        let once = model_with(&[100_000]).encode_to_vec();
        // Two graph fields (merged by decoders), a truncated file, and not a model at all.
        let twice = [once.clone(), model_with(&[100_000]).encode_to_vec()].concat();
        for bytes in [twice, once[..once.len() - 10].to_vec(), b"hello".to_vec()] {
            fs::write(&path, &bytes).unwrap();
            let (data, left, _) = read_model_file(&path, 65_536).unwrap();
            assert!(data[..] == bytes[..] && left.is_empty());
        }
    }

    #[test]
    fn damaged_files_read_as_a_whole_read_would_decode_them() {
        use crate::codec::proto::ModelProto;
        use prost::Message;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("m.onnx");
        let good = model_with(&[300, 70_000, 20]).encode_to_vec();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for k in 0..400 {
            let mut bytes = good.clone();
            if k % 2 == 0 {
                bytes.truncate((next() as usize) % bytes.len());
            } else {
                for _ in 0..1 + k % 3 {
                    // Flips land in the structure (the first bytes) as often as in the weights.
                    let at = if next() % 2 == 0 { next() as usize % 600 } else { next() as usize } % bytes.len();
                    bytes[at] ^= 1 << (next() % 8);
                }
            }
            fs::write(&path, &bytes).unwrap();
            let whole = ModelProto::decode(&bytes[..]);
            let Ok((data, left, _)) = read_model_file(&path, 65_536) else { continue };
            let mut ours = ModelProto::decode(data);
            if let Ok(m) = ours.as_mut() {
                for l in &left {
                    let raw = Bytes::copy_from_slice(&bytes[l.offset as usize..(l.offset + l.len) as usize]);
                    m.graph.as_mut().unwrap().initializer[l.initializer].raw_data = Some(raw);
                }
            }
            match (whole, ours) {
                (Ok(w), Ok(o)) => assert_eq!(w, o, "case {k}"),
                (Err(_), Err(_)) => {}
                (w, o) => panic!("case {k}: whole {:?}, walked {:?}", w.is_ok(), o.is_ok()),
            }
        }
    }
}
