//! A digest of a composed model as written for a session (the session cache's key), read
//! back from the files a chunk at a time, never held.
use std::io::Write;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use crate::codec::proto::ModelProto;
use crate::error::Result;
use crate::storage::data_file::Placed;
use crate::storage::writer::{write_private, Written};

/// XXH3-128 over a stream of bytes (several GB/s; the key is not a security boundary: cache
/// entries carry their own checksums).
#[derive(Default)]
pub struct Digest(Xxh3);

impl Write for Digest {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Digest {
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0.digest128())
    }
}

/// Writes `model` for a session: its tensors of at least `threshold` bytes, and its weights
/// still in their source files, in `<path>.data` beside `path` and, for large copies, more
/// data files `<path>.data.1`, ... copied side by side, one per thread of the pool (see
/// [`crate::storage::writer::write_private`]; meant for a private folder, so not synced).
/// `placed` receives where each weight went in the data file (see `spill::spill_onto`).
/// With `digest`, also returns the digest of the data file and then the model file, read
/// back a chunk at a time: the weights copied by the kernel never passed through memory.
pub fn save_placed(
    model: &ModelProto,
    path: &Path,
    threshold: usize,
    digest: bool,
    placed: &mut Vec<Placed>,
) -> Result<(Written, Option<String>)> {
    let data_name = format!("{}.data", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    let parts = crate::pool::install(rayon::current_num_threads);
    let written = write_private(model, path, threshold, &data_name, parts, placed)?;
    if !digest {
        return Ok((written, None));
    }
    let mut d = Digest::default();
    let read = |p: &Path, d: &mut Digest| -> std::io::Result<()> { feed(&std::fs::File::open(p)?, d) };
    let files = written.data_names.iter().map(|n| path.with_file_name(n)).chain([path.to_path_buf()]);
    for f in files {
        read(&f, &mut d).map_err(|e| crate::error::Error::export(format!("cannot digest {}: {e}", f.display())))?;
    }
    Ok((written, Some(d.hex())))
}

/// Feeds a file's bytes to `d`, a chunk at a time; holes as zeros, without reading them.
fn feed(file: &std::fs::File, d: &mut Digest) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK: usize = 1 << 20;
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    let size = file.metadata()?.len();
    let mut buf = vec![0u8; CHUNK];
    let zeros = |d: &mut Digest, mut n: u64| {
        while n > 0 {
            let k = n.min(CHUNK as u64);
            d.0.update(&ZEROS[..k as usize]);
            n -= k;
        }
    };
    let mut at = 0u64;
    while at < size {
        let Some((data, end)) = crate::storage::copy::next_data(file, at, size)? else { break };
        zeros(d, data - at);
        let mut pos = data;
        while pos < end {
            let k = ((end - pos) as usize).min(CHUNK);
            file.read_exact_at(&mut buf[..k], pos)?;
            d.0.update(&buf[..k]);
            pos += k as u64;
        }
        at = end;
    }
    zeros(d, size - at);
    Ok(())
}

/// The digest of a file's bytes, read in chunks (the session cache checks its entries with
/// it: a large data file is never held in memory whole).
pub fn file_digest(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut digest = Digest::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(digest.hex()),
            Ok(n) => digest.0.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_stable_and_sensitive() {
        let mut a = Digest::default();
        a.write_all(b"hello").unwrap();
        let mut b = Digest::default();
        b.write_all(b"hel").unwrap();
        b.write_all(b"lo").unwrap();
        assert_eq!(a.hex(), b.hex());
        let mut c = Digest::default();
        c.write_all(b"hellp").unwrap();
        assert_ne!(a.hex(), c.hex());
        assert_eq!(a.hex().len(), 32);
    }
}
