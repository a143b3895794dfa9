//! A digest of a composed model, computed while it is written (never by reading gigabytes of
//! weights a second time): the session cache's key.
use std::io::Write;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use crate::codec::proto::ModelProto;
use crate::error::Result;
use crate::storage::writer::Saved;

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

/// Writes `model` with its tensors of at least `threshold` bytes in `<path>.data` beside
/// `path` (see [`crate::storage::writer::write_with_external`]; meant for a private folder, so not
/// synced to disk) and returns what was written with the digest of those bytes. `placed`
/// receives where each weight went in the data file (see `spill::spill_onto`).
pub fn save_placed(
    model: &ModelProto,
    path: &Path,
    threshold: usize,
    placed: &mut Vec<(usize, usize, u64)>,
) -> Result<(Saved, String)> {
    let mut digest = Digest::default();
    let data_name = format!("{}.data", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    let (model_bytes, data_bytes, name) = crate::storage::writer::write_with_external_tee(
        model,
        path,
        threshold,
        Some(&data_name),
        false,
        &mut digest,
        placed,
    )?;
    Ok((Saved { model_bytes, data_bytes, data_file: Some(name) }, digest.hex()))
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
